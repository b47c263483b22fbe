"""Keys that taugrid honours only in part, or not at all: each is refused with the reason, or warned about.

The promise of ``config/fields.py`` (nothing silently ignored) rests here for TauGrid keys whose mechanism
taugrid does not have (nsys/ncu profiling, staged publication, elastic mode, topology shapes, workload profile
snapshots, DRA claims, Key Vault); the keys taugrid does honour are checked here against TauGrid's own rules
(checkpoint artifact, metrics history, image assets, mounts, Tune fields, topology, MIG) and carried to the
manifests by ``config/resolve.py`` and ``render/``.

Invariant: ``refusals`` never raises; it reports every problem through ``add``. ``key_warnings`` is pure.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from taugrid.config.elastic import elastic_rules
from taugrid.config.source import make_issue
from taugrid.config.taujob import TauConfig

# Kueue topology-aware scheduling: the podset annotations and the level a named topology stands for.
TOPOLOGY_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
TOPOLOGY_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
HOSTNAME = "kubernetes.io/hostname"
TOPOLOGY_NAMES = {"hostname": HOSTNAME, "node": HOSTNAME, "single-node": HOSTNAME}
TOPOLOGY_POLICIES = ("required", "preferred", "unconstrained")
GPU_CLASS_LABEL = "taugrid.io/gpu-class"
MIG_PROFILE = re.compile(r"^[1-9]g\.[0-9]+gb(\+me)?$")
RAY_TRAIN_SECTIONS = ("torch_config", "scaling_config", "failure_config")
RESERVED_MOUNTS = ("/data", "/script", "/manifest", "/tmp", "/dev/shm", "/var/run/tau", "/tau")
TUNE_FIELDS = ("metric", "mode", "num_samples", "max_concurrent_trials")
_EXPERIMENT_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def topology_level(name: str) -> str | None:
    """The node label a ``policy.topology`` names: a label key as written, or a known name (``single-node*``,
    ``hostname``, ``node`` → ``kubernetes.io/hostname``); None when it names neither."""
    if "/" in name or "." in name:
        return name if _LABEL_KEY.match(name) and len(name) <= 316 else None
    if name in TOPOLOGY_NAMES or name.startswith("single-node"):
        return HOSTNAME
    return None


def _topology(cfg: TauConfig, add: Any) -> None:
    """``policy.topology`` / ``topology_policy`` / ``topology_slice`` as Kueue's TAS annotations allow them: one of
    required, preferred (both with a level) or unconstrained (without one); a slice level that is a label key."""
    p = cfg.policy
    unconstrained = p.topology_policy == "unconstrained"
    if p.topology_policy and p.topology_policy not in TOPOLOGY_POLICIES:
        add(("policy", "topology_policy"), f"unknown topology policy {p.topology_policy!r}",
            "use required, preferred or unconstrained")
    elif p.topology_policy and not unconstrained and not p.topology:
        add(("policy", "topology_policy"), "needs policy.topology (the level to keep the pods within)",
            "set policy.topology, e.g. kubernetes.io/hostname")
    if unconstrained and p.topology:
        add(("policy", "topology"), "topology_policy: unconstrained places pods by free capacity at no level "
            "(Kueue's podset-unconstrained-topology takes none)",
            "remove policy.topology, or use topology_policy: required or preferred")
    if p.topology and topology_level(p.topology) is None:
        add(("policy", "topology"), f"{p.topology!r} names no topology level",
            "write a node label key (e.g. kubernetes.io/hostname, cloud.provider.com/topology-block) or "
            "single-node / hostname")
    if p.topology_slice is not None and topology_level(p.topology_slice.level) is None:
        add(("policy", "topology_slice", "level"), f"{p.topology_slice.level!r} names no topology level",
            "write a node label key (e.g. cloud.provider.com/topology-rack) or hostname")


def topology_fit(cfg: TauConfig, levels: list[list[str]] | None, count: int, add: Any, *, queue: str = "") -> None:
    """The run's topology request against the pod count of the pod set it shapes (``count``: Job pods, or Ray
    workers) and the topologies its cluster queue ``queue`` can place by (``levels``: each topology's levels,
    highest first, of the queue's flavors that name one; None when the platform declares no topologies: the
    cluster's own Topology objects decide, so only the count is checked)."""
    p = cfg.policy
    level = topology_level(p.topology) if p.topology and p.topology_policy != "unconstrained" else None
    piece = p.topology_slice
    slice_level = topology_level(piece.level) if piece is not None else None
    if piece is not None and piece.size > count:
        add(("policy", "topology_slice", "size"), f"a slice of {piece.size} pods is more than the run's {count} "
            "(Kueue's rule: the slice size is at most the pod set's count)", f"use a size of at most {count}")
    elif piece is not None and count % piece.size:
        add(("policy", "topology_slice", "size"), f"the run's {count} pods do not divide into slices of "
            f"{piece.size} (each slice is placed whole)", "use a size that divides the pod count")
    if levels is None:
        return
    if not levels:
        asked = [path for path, on in ((("policy", "topology"), level is not None),
                                       (("policy", "topology_policy"), p.topology_policy == "unconstrained"),
                                       (("policy", "topology_slice"), piece is not None)) if on]
        for where in asked[:1]:
            add(where, f"cluster queue {queue!r} has no flavor that names a topology (Kueue admits a topology "
                "request only on such a flavor, so the run would never start)",
                "set topology_name on one of its resource_flavors, or remove the topology request")
        return
    known = sorted({lv for ls in levels for lv in ls})
    checks: tuple[tuple[tuple[str, ...], str | None], ...] = (
        (("policy", "topology"), level), (("policy", "topology_slice", "level"), slice_level))
    for path, wanted in checks:
        if wanted is not None and wanted not in known:
            add(path, f"{wanted!r} is a level of no topology that cluster queue {queue!r} places by",
                f"use one of: {', '.join(known)}")
    if (level is not None and slice_level is not None and level in known and slice_level in known
            and not any(level in ls and slice_level in ls[ls.index(level):] for ls in levels)):
        add(("policy", "topology_slice", "level"), f"slice level {slice_level!r} is not at or below "
            f"{level!r} in any topology (Kueue refuses a slice above the pod set's level)",
            "name a lower level for the slices, or a higher policy.topology")


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _clean_abs(path: str) -> bool:
    return path.startswith("/") and path != "/" and posixpath.normpath(path) == path


def refusals(cfg: TauConfig, add: Any) -> None:
    """Every written key taugrid cannot honour as asked, with the reason and the fix."""
    p, c, ex = cfg.policy, cfg.compute, cfg.execution
    ray = cfg.engine == "ray"
    for name in cfg.runtime.env_secret:
        if name in cfg.runtime.env:
            add(("runtime", "env_secret", name), f"conflicts with runtime.env.{name}",
                "set each variable in only one place")
    for name, count in cfg.runtime.devices.items():
        if "/" not in name or not _LABEL_KEY.match(name) or count < 1:
            add(("runtime", "devices", name), "an extended resource name (vendor/device) and a count ≥ 1",
                "e.g. rdma/rdma_shared_device_a: 1")
    if cfg.profiler is not None:
        add(("profiler",), "taugrid does not wrap runs in nsys/ncu", "remove profiler and start the profiler in "
            "your entrypoint (e.g. entrypoint: nsys profile -o /data/out/profile python train.py)")
    elastic_rules(cfg, add)  # torchrun's nodes or Ray's workers resize on both backends (a Ray cluster locally)
    if p.shape:
        add(("policy", "shape"), "TauGrid's topology shape catalog is not modelled by taugrid",
            "size the run with compute.* and execution.nodes, and place it with policy.topology")
    if p.workload_profile_snapshot:
        add(("policy", "workload_profile_snapshot"), "taugrid resolves profiles from the live platform; a "
            "snapshot of a TauCluster profile is not read", "remove it (tau reproduce pins the platform revision)")
    _topology(cfg, add)
    if p.clear_node_selector and (ray or cfg.managed):
        add(("policy", "clear_node_selector"), "clears the profile's node selector of a direct Job only "
            "(TauGrid's rule)", "remove it, or write a direct config with engine: job")
    if p.team and not (_LABEL_VALUE.match(p.team) and len(p.team) <= 63):
        add(("policy", "team"), f"{p.team!r} is not a Kubernetes label value", "use ≤ 63 letters, digits, -_.")
    if p.gpu_class and not (_LABEL_VALUE.match(p.gpu_class) and len(p.gpu_class) <= 63):
        add(("policy", "gpu_class"), f"{p.gpu_class!r} is not a Kubernetes label value", "e.g. a100-80gb or any")
    if cfg.run.source is not None and cfg.run.working_dir:
        add(("run", "working_dir"), "run.source and run.working_dir cannot be used together (TauGrid's rule): the "
            "code is in the source image", "remove run.working_dir")
    _gpu_mode(cfg, add)
    _tune(cfg, add)
    if ray and ex.launcher != "ray-tune":
        for section in ex.configs:
            if section not in RAY_TRAIN_SECTIONS:
                add(("execution", "configs", section), "not a Ray Train config section",
                    f"use {', '.join(RAY_TRAIN_SECTIONS)}")
    if ray:
        for key in ("cpu_request", "memory_request", "cpu_limit", "memory_limit"):
            if getattr(c, key) is not None:
                add(("compute", key), "Job-only; this run uses engine: ray",
                    f"use compute.worker_{key} (each worker) or compute.head_{key} (the head)")
    sec = cfg.runtime.security
    if sec.mode == "restricted" and sec.run_as_user == 0:
        add(("runtime", "security", "run_as_user"), "restricted pods never run as root (user 0)",
            "pick a non-root user id, or leave it out (65532)")
    _checkpoint(cfg, add)
    _metrics(cfg, add)
    _mounts(cfg, add)
    _image_assets(cfg, add)


def _gpu_mode(cfg: TauConfig, add: Any) -> None:
    c = cfg.compute
    if c.gpu_resource_mode == "dra":
        add(("compute", "gpu_resource_mode"), "taugrid renders no DRA ResourceClaims",
            "use device-plugin (nvidia.com/gpu) or mig")
    if c.gpu_resource_mode == "mig" and not c.mig_profile:
        add(("compute", "gpu_resource_mode"), "mig needs compute.mig_profile (the slice, e.g. 1g.18gb)",
            "set compute.mig_profile")
    if c.mig_profile and not MIG_PROFILE.match(c.mig_profile):
        add(("compute", "mig_profile"), f"{c.mig_profile!r} is not a MIG profile", "write it like 1g.18gb or 3g.40gb")


def _tune(cfg: TauConfig, add: Any) -> None:
    ex = cfg.execution
    tune = ex.launcher == "ray-tune"
    for key in TUNE_FIELDS:
        if getattr(ex, key) is not None and not tune:
            add(("execution", key), "a Ray Tune field; this run does not use execution.launcher: ray-tune",
                "remove it, or set engine: ray and execution.launcher: ray-tune")
    if tune and not ex.metric:
        add(("execution", "metric"), "launcher ray-tune needs the metric to optimise", "set execution.metric: loss")
    if tune and not ex.configs:
        add(("execution", "configs"), "launcher ray-tune needs the search space",
            "set execution.configs, e.g. {lr: [0.001, 0.01]}")


def _checkpoint(cfg: TauConfig, add: Any) -> None:
    ck = cfg.storage.checkpoint
    if ck is None:
        return
    parts = ck.split("/")
    if ck != ck.strip() or ck.startswith("/") or "\\" in ck or any(x in ("", ".", "..") for x in parts):
        add(("storage", "checkpoint"), f"{ck!r} must be a relative path inside the run's checkpoint directory",
            "write e.g. last.safetensors or final/model.bin (no '.', '..' or leading '/')")


def _metrics(cfg: TauConfig, add: Any) -> None:
    m = cfg.metrics
    for i, raw in enumerate(m.history):
        value = raw.strip()
        clean = posixpath.normpath(value) if value else ""
        if not value:
            add(("metrics", "history", i), "must not be empty", "name a JSONL file or glob, e.g. metrics/*.jsonl")
        elif clean.startswith("/") and not (clean == "/data" or clean.startswith("/data/")):
            add(("metrics", "history", i), f"{raw!r}: absolute paths must be under /data",
                "write it relative to storage.output, or under /data")
        elif clean == ".." or clean.startswith("../"):
            add(("metrics", "history", i), f"{raw!r}: relative paths must not escape storage.output",
                "remove the '..'")
    if m.offload.enabled:
        if not m.history:
            add(("metrics", "history"), "metrics.offload.enabled needs at least one JSONL path",
                "list the files, e.g. metrics/*.jsonl")
        if not cfg.experiment.project:
            add(("experiment", "project"), "required when metrics.offload.enabled is true", "set experiment.project")
        if not (cfg.experiment.name or cfg.experiment.title or cfg.experiment.group):
            add(("experiment", "name"), "required when metrics.offload.enabled is true", "set experiment.name")
        for key in ("project", "name", "group"):
            value = getattr(cfg.experiment, key)
            if value and not _EXPERIMENT_ID.match(value):
                add(("experiment", key), f"{key} {value!r} is invalid for metrics offload",
                    "use lower-case letters, digits and . _ - (e.g. pretraining.v1)")


def _mounts(cfg: TauConfig, add: Any) -> None:
    s = cfg.storage
    names: set[str] = set()
    paths: list[str] = []
    for i, claim in enumerate(s.volumes):
        if not _DNS_LABEL.match(claim) or len(claim) > 63:
            add(("storage", "volumes", i), f"{claim!r} is not a PVC name", "use a DNS label, e.g. model-cache")
        names.add(claim)
        paths.append(f"/mnt/{claim}")
    for i, mount in enumerate(s.mounts):
        where = ("storage", "mounts", i)
        if not _DNS_LABEL.match(mount.name) or len(mount.name) > 50:
            add((*where, "name"), f"{mount.name!r} is not a DNS label", "use e.g. model-cache")
        elif mount.name in names:
            add((*where, "name"), f"volume {mount.name!r} is declared twice", "give each mount its own name")
        names.add(mount.name)
        if not _DNS_LABEL.match(mount.pvc):
            add((*where, "pvc"), f"{mount.pvc!r} is not a PVC name", "use the claim's name")
        if not _clean_abs(mount.mount_path):
            add((*where, "mount_path"), f"{mount.mount_path!r} must be a clean absolute path below /",
                "e.g. /models")
            continue
        if mount.sub_path is not None and (mount.sub_path.startswith("/") or ".." in mount.sub_path.split("/")):
            add((*where, "sub_path"), f"{mount.sub_path!r} must be relative inside the claim", "e.g. cache/v1")
        for reserved in RESERVED_MOUNTS:
            if _overlap(mount.mount_path, reserved):
                add((*where, "mount_path"), f"{mount.mount_path!r} overlaps taugrid's {reserved}",
                    "mount it elsewhere, e.g. /models (storage.data_pvc is the way to get /data)")
                break
        else:
            if any(_overlap(mount.mount_path, other) for other in paths):
                add((*where, "mount_path"), f"{mount.mount_path!r} overlaps another mount", "use distinct paths")
        paths.append(mount.mount_path)


def _image_assets(cfg: TauConfig, add: Any) -> None:
    seen: set[str] = set()
    mounts: list[str] = [m.mount_path for m in cfg.storage.mounts]
    for i, asset in enumerate(cfg.storage.image_assets):
        where = ("storage", "image_assets", i)
        if not _DNS_LABEL.match(asset.name) or len(asset.name) > 50:
            add((*where, "name"), "must be a lower-case DNS label of at most 50 characters", "e.g. reference")
        elif asset.name in seen:
            add((*where, "name"), f"{asset.name!r} is declared more than once", "give each asset its own name")
        seen.add(asset.name)
        for key in ("source_path", "mount_path"):
            if not _clean_abs(getattr(asset, key)):
                add((*where, key), "must be a clean absolute path below /", "e.g. /opt/reference")
        if _overlap(asset.source_path, "/tau-asset"):
            add((*where, "source_path"), f"{asset.source_path!r} is hidden by taugrid's staging volume /tau-asset",
                "copy from another directory of the image")
        if _clean_abs(asset.mount_path):
            hit = next((r for r in (*RESERVED_MOUNTS, "/mnt") if _overlap(asset.mount_path, r)), None)
            if hit:
                add((*where, "mount_path"), f"{asset.mount_path!r} overlaps taugrid's {hit}", "e.g. /opt/reference")
            elif any(_overlap(asset.mount_path, m) for m in mounts):
                add((*where, "mount_path"), f"{asset.mount_path!r} overlaps another mount", "use distinct paths")
            mounts.append(asset.mount_path)


def key_warnings(cfg: TauConfig) -> list[dict[str, object]]:
    """Keys accepted (TauGrid accepts them) that change nothing in taugrid."""
    out: list[dict[str, object]] = []

    def warn(path: tuple[str, ...], message: str, fix: str) -> None:
        out.append({**make_issue(path, message, fix, file=cfg.source_path, lines=cfg._lines), "kind": "unused"})

    if cfg.storage.publish is not None:
        warn(("storage", "publish"), "staged publication is not implemented: outputs are written in place under "
             "storage.output (a failed attempt's files stay there)", "remove storage.publish")
    off = cfg.metrics.offload
    if off.enabled or off.image or off.out:
        warn(("metrics", "offload"), "taugrid has no metrics offload sidecar (Stellar/Kusto): the files named by "
             "metrics.history stay under the run's output directory (the pod gets them as TAU_METRICS_HISTORY)",
             "remove metrics.offload")
    return out
