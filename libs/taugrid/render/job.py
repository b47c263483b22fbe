"""Render a ResolvedRun with ``engine: job`` into a suspended ``batch/v1`` Job (plus a headless Service
for multi-node torchrun).

Invariants: the Job is created suspended with the Kueue queue label, so nothing runs before admission;
``backoffLimit`` is 0 because our recovery service, not the Job controller, decides on retries (each retry
is a new attempt with a new object name); Kueue counts ``min(parallelism, completions)`` pods, which equals
``run.nodes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taugrid.config.launch import elastic_torchrun
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render.common import (
    DEFAULT_IMAGE,
    Manifest,
    asset_containers,
    container_env,
    container_security,
    data_volume,
    gpu_share_annotations,
    is_fractional,
    kueue_labels,
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
from taugrid.render.source import DEFAULT_SETTINGS, RenderSettings, add_source

RDZV_PORT = 29500
ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"  # Kueue's per-job opt-in (ElasticJobsViaWorkloadSlices, beta in v0.18)
# taugrid's range for the local cluster's engine: "min:max:step:cooldown_s" (Kubernetes ignores it).
ELASTIC_RANGE = "taugrid.io/elastic"


def elastic_range(run: ResolvedRun) -> str:
    return f"{run.elastic_min}:{run.elastic_max}:{run.elastic_step}:{run.elastic_cooldown_s:g}"
HEADLESS_SUFFIX = "-headless"
# Service names are DNS labels (≤ 63) and carry the suffix; index hostnames add "-<index>" to the Job name.
MULTI_NODE_NAME_MAX = 63 - len(HEADLESS_SUFFIX)
SHM_MAX = 16 << 30
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def render_job(
    run: ResolvedRun,
    *,
    attempt: int,
    resume_from: str = "",
    exclude_nodes: Sequence[str] = (),
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> list[Manifest]:
    """Manifests for one attempt: ``[Job]`` or, for ``nodes > 1``, ``[Service, Job]`` (Service first so
    the rendezvous host resolves as soon as pod 0 starts). ``exclude_nodes`` become a required node
    anti-affinity on the pod template; every pod fetches the run's source snapshot (``render/source.py``)."""
    multi_node = run.nodes > 1 or run.elastic_max > 0
    if multi_node and run.launcher != "torchrun":
        raise PermanentError(
            f"execution.nodes={run.nodes} needs `execution.launcher: torchrun` (got {run.launcher!r})"
        )
    name = object_name(run.run_id, attempt, max_len=MULTI_NODE_NAME_MAX if multi_node else 63)
    labels = tau_labels(run, attempt=attempt)
    annotations = tau_annotations(run)
    share = gpu_share_annotations(run.resources)
    job_annotations = {**annotations, **{k: v for k, v in share.items() if k.startswith("taugrid.io/")}}

    spec: dict[str, Any] = {
        "suspend": True,
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": run.ttl_seconds_after_finished,
    }
    if run.active_deadline_s is not None:
        spec["activeDeadlineSeconds"] = run.active_deadline_s
    if run.elastic_max:
        # Kueue's elastic Job: parallelism is the size (a change is a scale-up slice or an in-place scale-down);
        # completions allow up to the maximum, and the Job succeeds when pod 0 (torchrun's rendezvous host, which
        # a shrink never removes) does, so indexes never run again on their own after training ends.
        job_annotations[ELASTIC_JOB] = "true"
        job_annotations[ELASTIC_RANGE] = elastic_range(run)
        spec.update(completionMode="Indexed", completions=run.elastic_max, parallelism=run.nodes,
                    successPolicy={"rules": [{"succeededIndexes": "0"}]})
    elif multi_node:
        spec.update(completionMode="Indexed", completions=run.nodes, parallelism=run.nodes)
    else:
        spec.update(completions=1, parallelism=1)
    spec["template"] = {
        "metadata": {"labels": dict(labels), "annotations": {**template_annotations(run), **share}},
        "spec": _pod_spec(
            run,
            name=name,
            attempt=attempt,
            resume_from=resume_from,
            exclude_nodes=exclude_nodes,
            settings=settings,
        ),
    }
    job: Manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": {**labels, **kueue_labels(run)},
            "annotations": job_annotations,
        },
        "spec": spec,
    }
    if not multi_node:
        return [job]
    return [_headless_service(run, name=name, labels=labels, annotations=annotations), job]


def job_command(run: ResolvedRun, *, name: str) -> list[str]:
    """The container command. Single-node shapes arrive precomputed in ``run.command``."""
    if run.elastic_max:
        if not run.entrypoint:
            raise PermanentError("elastic torchrun needs an `entrypoint` (a .py script)")
        return ["python3", "-m", "torch.distributed.run",
                *elastic_torchrun(run.elastic_min, run.elastic_max, run.processes_per_node,
                                  f"{name}-0.{name}{HEADLESS_SUFFIX}:{RDZV_PORT}"),
                f"--rdzv_id={name}", run.entrypoint, *run.args]
    if run.nodes > 1:
        if not run.entrypoint:
            raise PermanentError("multi-node torchrun needs an `entrypoint` (a .py script)")
        return [
            "python3",
            "-m",
            "torch.distributed.run",
            f"--nnodes={run.nodes}",
            f"--nproc_per_node={run.processes_per_node}",
            # Expanded by the kubelet from the env var the Job controller (and we) define.
            "--node_rank=$(JOB_COMPLETION_INDEX)",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={name}-0.{name}{HEADLESS_SUFFIX}:{RDZV_PORT}",
            f"--rdzv_id={name}",
            run.entrypoint,
            *run.args,
        ]
    if run.command:
        return list(run.command)
    if run.entrypoint:
        return ["python3", run.entrypoint, *run.args]
    raise PermanentError(f"run {run.run_id} has neither a command nor an entrypoint")


def _pod_spec(
    run: ResolvedRun,
    *,
    name: str,
    attempt: int,
    resume_from: str,
    exclude_nodes: Sequence[str],
    settings: RenderSettings,
) -> dict[str, Any]:
    multi_node = run.nodes > 1
    gpu_pod = run.resources.gpu > 0 or is_fractional(run.resources)
    env = container_env(run, attempt=attempt, resume_from=resume_from)
    if multi_node:
        env.append(
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
                },
            }
        )
    volumes, mounts = data_volume(run)
    # torch workers exchange tensors through /dev/shm; the container runtime default is 64 MiB.
    several = run.launcher == "torchrun" and run.processes_per_node > 1
    torch_shm = min(SHM_MAX, run.resources.memory // 2) if several else 0
    if (shm := shm_volume(run, torch_shm)) is not None:
        volumes.append(shm[0])
        mounts.append(shm[1])

    container: dict[str, Any] = {
        "name": "main",
        "image": run.image or DEFAULT_IMAGE,
        "command": job_command(run, name=name),
        "env": env,
        "resources": resources_block(run.resources, run.limits, gpus=run.resources.gpu,
                                     gpu_resource=run.gpu_resource, devices=run.devices),
    }
    # A source-image job runs its entrypoint from run.source.path inside the image, unless it names a directory.
    if workdir := run.working_dir or run.source_path:
        container["workingDir"] = workdir
    if multi_node:
        container["ports"] = [{"name": "c10d", "containerPort": RDZV_PORT, "protocol": "TCP"}]
    if mounts:
        container["volumeMounts"] = mounts
    if (csec := container_security(run)) is not None:
        container["securityContext"] = csec

    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": run.termination_grace_s,
        "automountServiceAccountToken": False,
        "containers": [container],
    }
    if multi_node:
        # Indexed pods get hostname <job>-<index>; with subdomain = the headless Service they resolve as
        # <job>-<index>.<service>, which is how every node finds the c10d store on node 0.
        pod["subdomain"] = f"{name}{HEADLESS_SUFFIX}"
    if run.node_selector:
        pod["nodeSelector"] = dict(run.node_selector)
    if tols := tolerations(run, gpu=gpu_pod):
        pod["tolerations"] = tols
    if (affinity := node_exclusion(exclude_nodes)) is not None:
        pod["affinity"] = affinity
    if volumes:
        pod["volumes"] = volumes
    add_source(pod, [container], run, settings)
    if assets := asset_containers(run):
        pod["initContainers"] = [*pod.get("initContainers", []), *assets]
    if run.pod_priority_class:
        pod["priorityClassName"] = run.pod_priority_class
    if (psec := pod_security(run)) is not None:
        pod["securityContext"] = psec
    return pod


def _headless_service(
    run: ResolvedRun, *, name: str, labels: dict[str, str], annotations: dict[str, str]
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}{HEADLESS_SUFFIX}",
            "namespace": run.namespace,
            "labels": dict(labels),
            "annotations": dict(annotations),
        },
        "spec": {
            "clusterIP": "None",
            # Rendezvous must resolve before pods report Ready.
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": name},
            "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}],
        },
    }
