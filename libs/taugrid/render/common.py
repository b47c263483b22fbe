"""Pieces every renderer shares: object names, tau metadata, quantities, env, resources, pod security.

Invariants: every function here is pure and deterministic (same ResolvedRun + attempt ⇒ same output, key
order included); nothing reads the clock, the environment or the network; secrets appear only as
``secretKeyRef`` references, never as values.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

from taugrid.core import manifestkeys
from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.core.devices import vendor_of_resource
from taugrid.core.errors import PermanentError

Manifest = dict[str, Any]

# Documented local default: a slim CPython that can run a plain script; users pin their own for real work.
DEFAULT_IMAGE = "python:3.11-slim"
MANAGED_BY = "taugrid"
LABEL_PREFIX = "taugrid.io/"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU_RESOURCE = "nvidia.com/gpu"
# Kueue's pod-set topology annotations, defined below the renderer so the local cluster reads them without it
TOPOLOGY_REQUIRED = manifestkeys.TOPOLOGY_REQUIRED
TOPOLOGY_PREFERRED = manifestkeys.TOPOLOGY_PREFERRED
TOPOLOGY_UNCONSTRAINED = manifestkeys.TOPOLOGY_UNCONSTRAINED
TOPOLOGY_SLICE = manifestkeys.TOPOLOGY_SLICE
TOPOLOGY_SLICE_SIZE = manifestkeys.TOPOLOGY_SLICE_SIZE
TOPOLOGY_GROUP = manifestkeys.TOPOLOGY_GROUP
HOSTNAME_LABEL = "kubernetes.io/hostname"
DATA_MOUNT = "/data"
# Set by the renderer service on what it applies (never by ``render``), read back by kube-bridge.
TRACEPARENT_ANNOTATION = f"{LABEL_PREFIX}traceparent"
# Restricted PSS: a fixed non-root identity (distroless "nonroot") when the image does not choose one.
NONROOT_ID = 65532

_GI = 1 << 30
_MI = 1 << 20
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def object_name(run_id: str, attempt: int, *, max_len: int = 63) -> str:
    """``<run_id>-a<attempt>`` as a DNS-1035 label of at most ``max_len`` characters.

    Stable for one run and attempt. A run id starting with a digit gets an ``r`` prefix (Services and
    RayJobs need a leading letter); a name that is too long keeps the attempt suffix and replaces the
    tail of the run id with 16 hex of its hash (64 bits, as wide as the run id's own digest), so two long run
    ids never collide by truncation.
    """
    suffix = f"-a{attempt}"
    base = run_id if run_id[:1].isalpha() else f"r{run_id}"
    if len(base) + len(suffix) <= max_len:
        name = base + suffix
    else:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:16]
        keep = max_len - len(suffix) - len(digest) - 1
        name = f"{base[:keep].rstrip('-')}-{digest}{suffix}"
    if not _DNS1035.match(name):
        raise PermanentError(
            f"run id {run_id!r} does not give a valid object name ({name!r}); run ids must be lower-case "
            "letters, digits and dashes"
        )
    return name


def tau_labels(run: ResolvedRun, *, attempt: int) -> dict[str, str]:
    return {
        **{k: run.labels[k] for k in sorted(run.labels)},
        f"{LABEL_PREFIX}managed-by": MANAGED_BY,
        f"{LABEL_PREFIX}run-id": run.run_id,
        f"{LABEL_PREFIX}workspace": run.workspace,
        f"{LABEL_PREFIX}attempt": str(attempt),
    }


def template_annotations(run: ResolvedRun, *, slices: bool = True) -> dict[str, str]:
    """Pod-template annotations: the tau ones plus Kueue's topology-aware scheduling request (per pod set): one of
    required / preferred (a level) / unconstrained, and, on the pod set the slices divide (``slices``: the Job's
    pods, a RayJob's workers, not its one-pod head), the slice level and size."""
    out = tau_annotations(run)
    if run.topology_unconstrained:
        out[TOPOLOGY_UNCONSTRAINED] = "true"
    elif run.topology_level:
        key = TOPOLOGY_REQUIRED if run.topology_required else TOPOLOGY_PREFERRED
        out[key] = run.topology_level
    if slices and run.topology_slice_size:
        out[TOPOLOGY_SLICE] = run.topology_slice_level
        out[TOPOLOGY_SLICE_SIZE] = str(run.topology_slice_size)
    return out


def kueue_labels(run: ResolvedRun) -> dict[str, str]:
    """Labels on the top-level object only: Kueue reads them there, not on pod templates."""
    if not run.local_queue:
        raise PermanentError(
            f"run {run.run_id} has no local queue; policy must resolve `policy.queue` to a LocalQueue"
        )
    labels = {QUEUE_LABEL: run.local_queue}
    if run.priority_class:
        labels[PRIORITY_LABEL] = run.priority_class
    return labels


def tau_annotations(run: ResolvedRun) -> dict[str, str]:
    annotations = {
        f"{LABEL_PREFIX}config-hash": run.config_hash,
        f"{LABEL_PREFIX}source-digest": run.source_digest,
        f"{LABEL_PREFIX}submission-id": run.submission_id,
        f"{LABEL_PREFIX}workspace": run.workspace,
        f"{LABEL_PREFIX}run-name": run.name,
    }
    if run.experiment:
        annotations[f"{LABEL_PREFIX}experiment"] = json.dumps(run.experiment, sort_keys=True)
    if run.placement != "binpack":  # the default is implied; spread is asked for
        annotations[f"{LABEL_PREFIX}placement"] = run.placement
    if run.resilience.hang_timeout_s:
        annotations[f"{LABEL_PREFIX}hang-timeout"] = f"{run.resilience.hang_timeout_s:g}"
    return annotations


def cpu_quantity(cpu: float) -> str:
    millis = round(cpu * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(size: int) -> str:
    if size % _GI == 0:
        return f"{size // _GI}Gi"
    if size % _MI == 0:
        return f"{size // _MI}Mi"
    return str(size)


def is_fractional(res: Resources) -> bool:
    return res.gpu == 0 and (res.gpu_fraction > 0 or res.gpu_memory_mb > 0)


def resources_block(
    requests: Resources, limits: Resources | None, *, gpus: int, gpu_resource: str = "",
    devices: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Container ``resources``. Whole GPUs (or MIG slices, ``gpu_resource``) go in requests and limits (extended
    resources need both equal); fractional GPUs request no ``nvidia.com/gpu`` at all (``gpu_share_annotations``)."""
    req: dict[str, str] = {"cpu": cpu_quantity(requests.cpu), "memory": memory_quantity(requests.memory)}
    lim: dict[str, str] = {}
    if limits is not None:
        if limits.cpu > 0:
            lim["cpu"] = cpu_quantity(limits.cpu)
        if limits.memory > 0:
            lim["memory"] = memory_quantity(limits.memory)
    if gpus > 0:
        req[gpu_resource or GPU_RESOURCE] = str(gpus)
        lim[gpu_resource or GPU_RESOURCE] = str(gpus)
    for name in sorted(devices or {}):
        req[name] = lim[name] = str((devices or {})[name])
    block: dict[str, Any] = {"requests": req}
    if lim:
        block["limits"] = lim
    return block


def gpu_share_annotations(res: Resources) -> dict[str, str]:
    """KAI-style pod annotations for a shared GPU, plus our own copies that the local scheduler reads.

    KAI accepts either ``gpu-fraction`` or ``gpu-memory``, not both; the fraction wins when both are set.
    """
    if not is_fractional(res):
        return {}
    out: dict[str, str] = {}
    if res.gpu_fraction > 0:
        if not 0 < res.gpu_fraction < 1:
            raise PermanentError(f"gpu fraction must be between 0 and 1, got {res.gpu_fraction}")
        out["gpu-fraction"] = f"{res.gpu_fraction:g}"
        out[f"{LABEL_PREFIX}gpu-fraction"] = f"{res.gpu_fraction:g}"
    if res.gpu_memory_mb > 0:
        if "gpu-fraction" not in out:
            out["gpu-memory"] = str(res.gpu_memory_mb)
        out[f"{LABEL_PREFIX}gpu-memory"] = str(res.gpu_memory_mb)
    return out


def tolerations(run: ResolvedRun, *, gpu: bool) -> list[dict[str, Any]]:
    """The profile's tolerations, and for a GPU pod the taint GPU nodes carry by their vendor's resource name
    (``nvidia.com/gpu``, ``amd.com/gpu``, ``habana.ai/gaudi``; a MIG slice's node is an NVIDIA node)."""
    out = [dict(t) for t in run.tolerations]
    vendor = vendor_of_resource(run.gpu_resource or GPU_RESOURCE)
    gpu_toleration = {"key": vendor.resource if vendor else GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    if gpu and gpu_toleration not in out:
        out.append(gpu_toleration)
    return out


def node_exclusion(exclude_nodes: Iterable[str]) -> dict[str, Any] | None:
    """Pod ``affinity`` that keeps a retry off the nodes an earlier attempt failed on, or None.

    Required, not preferred: a retry after a GPU or node fault must not land on the faulty node again.
    Names are deduplicated and sorted so the same exclusions always render the same bytes.
    """
    nodes = sorted({n for n in exclude_nodes if n})
    if not nodes:
        return None
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": nodes}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def tau_env(run: ResolvedRun, *, attempt: int, resume_from: str = "") -> dict[str, str]:
    """Variables the platform injects; they win over user ``env`` entries of the same name."""
    env = {
        "TAU_RUN_ID": run.run_id,
        "TAU_RETRY_ATTEMPT": str(attempt),
        "TAU_RETRY_MAX": str(run.resilience.max_retries),
    }
    if run.output_dir:
        env["TAU_OUTPUT_DIR"] = run.output_dir
    if run.checkpoint_dir:
        env["TAU_CHECKPOINT_DIR"] = run.checkpoint_dir
    # Only when there is something to resume (a retry, whose resume point recovery passes, or `tau run resume`,
    # whose point policy puts in the run's env): a first attempt that finds TAU_RESUME_FROM would look for a
    # checkpoint that was never written, as TauGrid's runs never do.
    if resume_from:
        env["TAU_RESUME_FROM"] = resume_from
    return {**run.platform_env, **env}


def literal_env(run: ResolvedRun, *, attempt: int, resume_from: str = "") -> dict[str, str]:
    injected = tau_env(run, attempt=attempt, resume_from=resume_from)
    merged = {k: v for k, v in run.env.items() if k not in injected and k not in run.env_secret}
    merged.update(injected)
    return merged


def secret_env(run: ResolvedRun) -> list[dict[str, Any]]:
    """``env_secret`` ``NAME: "secret:key"`` entries as ``secretKeyRef`` references."""
    out: list[dict[str, Any]] = []
    for name, ref in run.env_secret.items():
        secret, sep, key = ref.partition(":")
        if not (sep and secret and key):
            raise PermanentError(
                f'runtime.env_secret.{name}: {ref!r} is not a secret reference; write it as "<secret>:<key>"'
            )
        out.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return out


def container_env(run: ResolvedRun, *, attempt: int, resume_from: str = "") -> list[dict[str, Any]]:
    literal = literal_env(run, attempt=attempt, resume_from=resume_from)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in literal.items()]
    # The node the pod runs on, from the downward API (where Kueue's topology assignment put its rank), the
    # variable the local cluster sets too; not when the run's own env names it.
    node = [] if "TAU_NODE_NAME" in literal or "TAU_NODE_NAME" in run.env_secret else [
        {"name": "TAU_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    return env + node + secret_env(run)


def _identity(run: ResolvedRun) -> dict[str, int]:
    """runAsUser/runAsGroup: the config's ids, else (restricted only) the fixed non-root one."""
    default = NONROOT_ID if run.security_restricted else None
    out = {}
    for key, value in (("runAsUser", run.run_as_user), ("runAsGroup", run.run_as_group)):
        if (chosen := value if value is not None else default) is not None:
            out[key] = chosen
    return out


def pod_security(run: ResolvedRun) -> dict[str, Any] | None:
    if not run.security_restricted:
        return _identity(run) or None
    group = run.run_as_group if run.run_as_group is not None else NONROOT_ID
    return {
        "runAsNonRoot": True,
        **_identity(run),
        "fsGroup": group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(run: ResolvedRun) -> dict[str, Any] | None:
    if not run.security_restricted:
        return None
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        **_identity(run),
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def data_volume(run: ResolvedRun) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) for ``storage.data_pvc`` (an existing PVC at ``/data``, never created by us) and for
    ``storage.mounts``/``volumes`` (existing PVCs where the config says), then the image assets' volumes."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if run.data_pvc:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": run.data_pvc}})
        mounts.append({"name": "data", "mountPath": DATA_MOUNT})
    for m in run.mounts:
        name = f"pvc-{m['name']}"
        claim: dict[str, Any] = {"claimName": m["claim"]}
        mount: dict[str, Any] = {"name": name, "mountPath": m["path"]}
        if m.get("read_only"):
            claim["readOnly"] = True
            mount["readOnly"] = True
        if m.get("sub_path"):
            mount["subPath"] = m["sub_path"]
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        mounts.append(mount)
    for asset in run.image_assets:
        volumes.append({"name": f"asset-{asset['name']}", "emptyDir": {}})
        mounts.append({"name": f"asset-{asset['name']}", "mountPath": asset["mount_path"], "readOnly": True})
    return volumes, mounts


ASSET_STAGING = "/tau-asset"


def shm_volume(run: ResolvedRun, default: int = 0) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """An in-memory ``/dev/shm`` of ``runtime.shm_size`` (else ``default`` bytes; None when both are 0)."""
    size = run.shm_size or default
    if not size:
        return None
    return ({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": memory_quantity(size)}},
            {"name": "dshm", "mountPath": "/dev/shm"})


def asset_containers(run: ResolvedRun) -> list[dict[str, Any]]:
    """Init containers that copy each ``storage.image_assets`` entry out of its (digest-pinned) image into the
    volume the main container mounts read-only (TauGrid's staging: the image needs /bin/sh and cp)."""
    out = []
    for asset in run.image_assets:
        source = asset["source_path"].rstrip("/")
        out.append({
            "name": f"asset-{asset['name']}",
            "image": asset["image"],
            "command": ["/bin/sh", "-c", f'cp -a "{source}/." "{ASSET_STAGING}/"'],
            "volumeMounts": [{"name": f"asset-{asset['name']}", "mountPath": ASSET_STAGING}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            **({"securityContext": sec} if (sec := container_security(run)) is not None else {}),
        })
    return out


def with_annotation(manifests: list[Manifest], key: str, value: str) -> list[Manifest]:
    """Copies of ``manifests`` with ``key: value`` on each object's metadata and on every pod template in it
    (a Job's ``spec.template``, each RayJob group's ``template``), so pods carry it too. The input is not
    changed: callers digest the rendered manifests, then apply the annotated copies."""
    out = copy.deepcopy(manifests)
    for manifest in out:
        _annotate(manifest, key, value)
    return out


def _annotate(node: Any, key: str, value: str, *, top: bool = True) -> None:
    if isinstance(node, list):
        for item in node:
            _annotate(item, key, value, top=False)
        return
    if not isinstance(node, dict):
        return
    if top and isinstance(node.get("metadata"), dict):
        node["metadata"].setdefault("annotations", {})[key] = value
    for field, child in node.items():
        if field == "template" and isinstance(child, dict):
            child.setdefault("metadata", {}).setdefault("annotations", {})[key] = value
        if field != "metadata":
            _annotate(child, key, value, top=False)
