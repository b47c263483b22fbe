"""Render a ResolvedRun with ``engine: ray`` into a suspended KubeRay ``ray.io/v1`` RayJob.

Invariants: the name is a DNS-1035 label of at most 47 characters (KubeRay derives longer names from it);
``suspend: true`` always comes with ``shutdownAfterJobFinishes: true`` (KubeRay rejects one without the
other); the worker group sets ``replicas == minReplicas == maxReplicas == run.workers`` explicitly, because
KubeRay defaults a missing ``replicas`` to 0 while Kueue counts it as 1; the head is CPU-only so that the
GPUs Kueue admits are exactly ``workers × gpus_per_worker``. Secret values never enter ``runtimeEnvYAML``;
secrets reach Ray processes through container env (``secretKeyRef``), which raylets pass on.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.core.errors import PermanentError
from taugrid.render.common import (
    TOPOLOGY_GROUP,
    Manifest,
    container_env,
    container_security,
    data_volume,
    kueue_labels,
    literal_env,
    node_exclusion,
    object_name,
    pod_security,
    resources_block,
    shm_volume,
    tau_annotations,
    tau_labels,
    template_annotations,
    tolerations,
)
from taugrid.render.job import ELASTIC_JOB, ELASTIC_RANGE, elastic_range
from taugrid.render.source import DEFAULT_SETTINGS, RenderSettings, add_source, needs_fetch, source_layout

RAYJOB_NAME_MAX = 47
RAY_VERSION = "2.46.0"
DEFAULT_RAY_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311"
DEFAULT_RAY_GPU_IMAGE = f"rayproject/ray:{RAY_VERSION}-py311-gpu"
WORKER_GROUP = "workers"
HEAD_RESOURCES = Resources(cpu=1.0, memory=4 << 30)
# After the job ends Kueue releases quota at once, but the RayCluster keeps its GPUs until this TTL runs out;
# keep that window short whatever the run's Job TTL says.
RAY_TTL_CAP_S = 60
SOURCE_DIR_ENV = "TAU_SOURCE_DIR"
HEAD_PORTS = [
    {"name": "gcs-server", "containerPort": 6379, "protocol": "TCP"},
    {"name": "dashboard", "containerPort": 8265, "protocol": "TCP"},
    {"name": "client", "containerPort": 10001, "protocol": "TCP"},
]


def render_rayjob(
    run: ResolvedRun,
    *,
    attempt: int,
    resume_from: str = "",
    exclude_nodes: Sequence[str] = (),
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> list[Manifest]:
    """``[RayJob]`` for one attempt; ``exclude_nodes`` keep the head and every worker off those nodes. The
    head and every worker fetch the run's source snapshot (``render/source.py``); the entrypoint runs from the
    project directory on the head, and Ray workers import from it (``PYTHONPATH``)."""
    if run.workers < 1:
        raise PermanentError(f"compute.workers must be at least 1 for a Ray run (got {run.workers})")
    name = object_name(run.run_id, attempt, max_len=RAYJOB_NAME_MAX)
    labels = tau_labels(run, attempt=attempt)
    annotations = tau_annotations(run)
    spec: dict[str, Any] = {
        "suspend": True,
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": min(run.ttl_seconds_after_finished, RAY_TTL_CAP_S),
        # Our recovery service retries with a fresh attempt; KubeRay must not retry on its own.
        "backoffLimit": 0,
        "submissionMode": "K8sJobMode",
        "entrypoint": ray_entrypoint(run),
    }
    if run.active_deadline_s is not None:
        spec["activeDeadlineSeconds"] = run.active_deadline_s
    runtime_env = _runtime_env(run, attempt=attempt, resume_from=resume_from)
    if runtime_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env, sort_keys=True, default_flow_style=False)
    spec["rayClusterSpec"] = _cluster_spec(
        run, attempt=attempt, resume_from=resume_from, exclude_nodes=exclude_nodes, settings=settings
    )
    if run.elastic_max:  # Kueue's elastic RayJob: the opt-in annotation and KubeRay's in-tree autoscaler
        annotations = {**annotations, ELASTIC_JOB: "true", ELASTIC_RANGE: elastic_range(run)}
        spec["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    return [
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": {
                "name": name,
                "namespace": run.namespace,
                "labels": {**labels, **kueue_labels(run)},
                "annotations": annotations,
            },
            "spec": spec,
        }
    ]


def ray_entrypoint(run: ResolvedRun) -> str:
    """The shell command ``ray job submit`` runs on the head; quoted so arguments survive the shell. With a
    fetched project it starts in the project directory (``TAU_SOURCE_DIR``, set in the job's runtime_env; a
    backend that runs the entrypoint without it, like the local one, starts in the unpacked project)."""
    if run.launcher == "command" and run.command:
        command = shlex.join(run.command)
    elif run.entrypoint:
        command = shlex.join(["python", run.entrypoint, *run.args])
    else:
        raise PermanentError("a Ray run needs an `entrypoint` script")
    if needs_fetch(run):
        return f'cd "${{{SOURCE_DIR_ENV}:-.}}" && {command}'
    return command


def _runtime_env(run: ResolvedRun, *, attempt: int, resume_from: str) -> dict[str, Any]:
    """No ``working_dir``: the project is not uploaded by Ray (TauGrid's 45 KiB archive limit) but fetched
    into every pod by the init container; Ray processes find it through ``PYTHONPATH``."""
    env = literal_env(run, attempt=attempt, resume_from=resume_from)
    if needs_fetch(run):
        project = source_layout(run).working_dir
        env[SOURCE_DIR_ENV] = project
        # Ray expands ${VAR} in runtime_env env_vars from the node's environment.
        env["PYTHONPATH"] = ":".join([project, env.get("PYTHONPATH") or "${PYTHONPATH}"])
    out: dict[str, Any] = {"env_vars": env}
    if run.pip:
        out["pip"] = list(run.pip)
    return out


def _image(run: ResolvedRun) -> str:
    if run.image:
        return run.image
    return DEFAULT_RAY_GPU_IMAGE if run.gpus_per_worker > 0 else DEFAULT_RAY_IMAGE


def _cluster_spec(
    run: ResolvedRun,
    *,
    attempt: int,
    resume_from: str,
    exclude_nodes: Sequence[str],
    settings: RenderSettings,
) -> dict[str, Any]:
    head_requests = run.head_resources or HEAD_RESOURCES
    head_limits = run.head_limits or (HEAD_RESOURCES if run.head_resources is None else None)
    head_container = _container(run, "ray-head", head_requests, head_limits, 0, attempt, resume_from)
    head_container["ports"] = [dict(p) for p in HEAD_PORTS]
    worker_container = _container(
        run, "ray-worker", run.resources, run.limits, run.gpus_per_worker, attempt, resume_from
    )
    head_pod = _pod(run, head_container, exclude_nodes)
    worker_pod = _pod(run, worker_container, exclude_nodes)
    add_source(head_pod, [head_container], run, settings)
    add_source(worker_pod, [worker_container], run, settings)
    if run.node_selector:
        worker_pod["nodeSelector"] = dict(run.node_selector)
    if tols := tolerations(run, gpu=run.gpus_per_worker > 0):
        worker_pod["tolerations"] = tols
    cluster: dict[str, Any] = {
        "headGroupSpec": {
            # Values are strings in the CRD. No CPUs/GPUs on the head: tasks land on workers only.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"},
            "template": _template(run, attempt, head_pod, slices=False),
        },
        "workerGroupSpecs": [
            {
                "groupName": WORKER_GROUP,
                "replicas": run.workers,
                # An elastic run: KubeRay's autoscaler moves the group between the bounds, Kueue admits each
                # scale-up as a workload slice; else min = max, so KubeRay never resizes what Kueue admitted.
                "minReplicas": run.elastic_min or run.workers,
                "maxReplicas": run.elastic_max or run.workers,
                "rayStartParams": {},
                "template": _template(run, attempt, worker_pod),
            }
        ],
    }
    if not run.image:
        cluster = {"rayVersion": RAY_VERSION, **cluster}
    return cluster


def _container(
    run: ResolvedRun,
    name: str,
    requests: Resources,
    limits: Resources | None,
    gpus: int,
    attempt: int,
    resume_from: str,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": _image(run),
        "env": container_env(run, attempt=attempt, resume_from=resume_from),
        "resources": resources_block(requests, limits, gpus=gpus, gpu_resource=run.gpu_resource,
                                     devices=run.devices),
    }
    _, mounts = data_volume(run)
    if (shm := shm_volume(run)) is not None:
        mounts.append(shm[1])
    if mounts:
        container["volumeMounts"] = mounts
    if (csec := container_security(run)) is not None:
        container["securityContext"] = csec
    return container


def _pod(run: ResolvedRun, container: dict[str, Any], exclude_nodes: Sequence[str]) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "terminationGracePeriodSeconds": run.termination_grace_s,
        "containers": [container],
    }
    volumes, _ = data_volume(run)
    if (shm := shm_volume(run)) is not None:
        volumes.append(shm[0])
    if volumes:
        pod["volumes"] = volumes
    if (psec := pod_security(run)) is not None:
        pod["securityContext"] = psec
    if (affinity := node_exclusion(exclude_nodes)) is not None:
        pod["affinity"] = affinity
    if run.pod_priority_class:
        pod["priorityClassName"] = run.pod_priority_class
    return pod


# Kueue's pod-set group of a RayJob's head and workers: placed as one, in one domain of the requested level, the
# one-pod head (the group's leader) ranked first, its workers after it on the same assignment.
RAY_TOPOLOGY_GROUP = "ray"


def _template(run: ResolvedRun, attempt: int, pod: dict[str, Any], *, slices: bool = True) -> dict[str, Any]:
    """``slices``: whether this group takes the run's TAS slices (the workers do; the one-pod head cannot). A
    required or preferred level without slices groups the head with the workers (``RAY_TOPOLOGY_GROUP``); Kueue
    allows no group with a slice request, so sliced workers are placed apart from the head."""
    annotations = template_annotations(run, slices=slices)
    if run.topology_level and not run.topology_unconstrained and not run.topology_slice_size:
        annotations[TOPOLOGY_GROUP] = RAY_TOPOLOGY_GROUP
    return {
        "metadata": {"labels": tau_labels(run, attempt=attempt), "annotations": annotations},
        "spec": pod,
    }
