"""A ready-made platform for one machine (a laptop or a single GPU box), sized to what it has.

Invariants: the result passes ``check_platform``; quotas never exceed the machine (memory is ~90% of RAM,
leaving room for the OS and the platform itself); GPU profiles exist only for GPU counts the machine has.
"""

from __future__ import annotations

import os

from taugrid.config.platform import (
    GPU_RESOURCE,
    ClusterQueue,
    Cohort,
    ComputeProfile,
    FlavorQuotas,
    LocalQueue,
    Platform,
    Preemption,
    PriorityClass,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Workspace,
)
from taugrid.config.platformcheck import check_platform
from taugrid.config.source import raise_issues
from taugrid.core.devices import vendor_of_resource
from taugrid.core.quantity import format_memory

_MiB = 1 << 20


def default_platform(
    cpus: int,
    memory_bytes: int,
    gpus: list[str],
    *,
    output_root: str | None = None,
    gpu_resource: str = GPU_RESOURCE,
) -> Platform:
    """One flavor, one cohort, ClusterQueue ``local``, LocalQueue/workspace ``default``, 3 priority classes.

    The workspace defaults to ``cpu-small``: a run gets a GPU only when it asks (``compute.gpus``, a profile).

    ``gpus`` are device names (``["NVIDIA H200", ...]``); only their count sizes the quota, of ``gpu_resource``
    (AMD's or Gaudi's on a machine of theirs: a run asking for no vendor gets the one its queue has quota for);
    the half-GPU profile only where the vendor shares GPUs. ``output_root`` defaults to ``~/.taugrid/runs``.
    """
    flavor = "gpu" if gpus else "default"
    memory = (int(memory_bytes * 0.9) // _MiB) * _MiB  # whole MiB, so it prints as a tidy quantity
    resources = [
        ResourceQuota(name="cpu", nominal_quota=str(cpus)),
        ResourceQuota(name="memory", nominal_quota=format_memory(memory)),
    ]
    covered = ["cpu", "memory"]
    if gpus:
        resources.append(ResourceQuota(name=gpu_resource, nominal_quota=str(len(gpus))))
        covered.append(gpu_resource)
    # clamped so that every profile fits the machine, however small: a profile that never fits never runs
    profiles = [
        ComputeProfile(
            name="cpu-small",
            description="1 CPU, 1Gi",
            cpu=str(min(1, cpus)),
            memory=format_memory(min(1 << 30, memory)),
        ),
        ComputeProfile(
            name="cpu",
            description="2 CPUs, 4Gi",
            cpu=str(min(2, cpus)),
            memory=format_memory(min(4 << 30, memory)),
        ),
    ]
    per_gpu_cpu = max(1, cpus // max(1, len(gpus)))
    per_gpu_mem = memory // max(1, len(gpus))
    for n in range(1, len(gpus) + 1):
        profiles.append(
            ComputeProfile(
                name=f"gpu-{n}",
                description=f"{n} x {gpus[0]}",
                gpu=n,
                cpu=str(min(cpus, per_gpu_cpu * n)),
                memory=format_memory(min(memory, (per_gpu_mem * n // _MiB) * _MiB)),
            )
        )
    vendor = vendor_of_resource(gpu_resource)
    if gpus and vendor is not None and vendor.fractions:
        profiles.append(
            ComputeProfile(
                name="gpu-half",
                description=f"half of one {gpus[0]}",
                gpu_fraction=0.5,
                cpu=str(max(1, per_gpu_cpu // 2)),
                memory=format_memory(max(_MiB, (per_gpu_mem // 2 // _MiB) * _MiB)),
            )
        )
    platform = Platform(
        resource_flavors=[ResourceFlavor(name=flavor)],
        cohorts=[Cohort(name="local")],
        cluster_queues=[
            ClusterQueue(
                name="local",
                cohort="local",
                queueing_strategy="BestEffortFIFO",
                resource_groups=[
                    ResourceGroup(
                        covered_resources=covered, flavors=[FlavorQuotas(name=flavor, resources=resources)]
                    )
                ],
                preemption=Preemption(within_cluster_queue="LowerPriority", reclaim_within_cohort="Any"),
            )
        ],
        local_queues=[LocalQueue(name="default", namespace="default", cluster_queue="local")],
        priority_classes=[
            PriorityClass(name="low", value=50, description="batch work; preempted first"),
            PriorityClass(name="normal", value=100, description="the default"),
            PriorityClass(name="high", value=200, description="urgent work; preempts lower priorities"),
        ],
        compute_profiles=profiles,
        workspaces=[
            Workspace(
                name="default",
                namespace="default",
                local_queue="default",
                default_priority="normal",
                default_profile="cpu-small",
                max_gpus_per_run=len(gpus),
                output_root=output_root or os.path.expanduser("~/.taugrid/runs"),
            )
        ],
    )
    raise_issues(check_platform(platform, file="<default platform>"))
    return platform
