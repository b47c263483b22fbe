"""The direct ``tau.yaml`` run config: strict pydantic models, the loader, its JSON Schema and its hash.

A drop-in for TauGrid's direct config (reference ``taugrid.md`` §1.2–1.3); TauGrid's managed workflow manifests
are projected onto it first (``config/managed.py``). Our additions, all optional:
- ``args``: CLI arguments appended to the script (``["--epochs", "3"]``).
- ``compute.gpu_fraction`` (0 < f < 1) or ``compute.gpu_memory`` (``"20Gi"``): a share of one GPU (KAI-style).
- ``compute.placement`` (``binpack`` | ``spread``) and ``compute.gang`` (all pods start together or none).
- ``policy.preemptible``: ``false`` asks for a non-preemptible priority class (the platform must agree).
- ``run.active_deadline``: wall-clock limit of one attempt (``"2h"`` or seconds), capped by the workspace.
- ``runtime.devices`` (extra extended resources per pod) and ``runtime.shm_size`` (in-memory ``/dev/shm``).

Invariants: every model forbids unknown keys; after validation the aliases are folded into one canonical place
(``name``/``engine``/``entrypoint`` at top level, the image in ``runtime.image``), so readers never look
twice; ``engine`` is always set (inferred when absent); ``config_hash`` is a pure function of the validated
model.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Literal

import pydantic
from pydantic import Field, field_validator, model_validator

from taugrid.config.elastic import ElasticRange
from taugrid.config.fields import CpuQuantity, Duration, MemoryQuantity, Strict, Text
from taugrid.config.source import Lines, line_of, load_yaml, make_issue, pydantic_issues, raise_issues


class RunSource(Strict):
    image: str = Field(description="source image pinned by digest (image@sha256:...); Job only")
    path: str = "/"


class RunBlock(Strict):
    """``run.*``: nested aliases of the top-level keys plus run-level settings."""

    name: str | None = None
    engine: Literal["job", "ray"] | None = Field(default=None, description="job | ray (rayjob is an alias)")
    entrypoint: str | None = None
    script: str | None = None
    image: str | None = None
    main_script: str | None = None
    workload_kind: Literal["job", "rayjob", "ray-train", "ray_train"] | None = None
    source: RunSource | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=1, le=2**31 - 1)
    working_dir: str | None = Field(
        default=None, description="project dir shipped as Ray runtime_env; Ray only"
    )
    working_dir_excludes: list[str] = Field(
        default_factory=list,
        description="gitignore patterns left out of the project snapshot (after .gitignore), e.g. data/, *.pt",
    )
    active_deadline: Duration | None = Field(
        default=None,
        gt=0,
        description="taugrid: wall-clock limit of one attempt, e.g. 2h; capped by the workspace",
    )

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_alias(cls, value: Any) -> Any:
        return _engine_value(value)


class Security(Strict):
    mode: Literal["restricted", "default"] = "default"
    run_as_user: int | None = Field(default=None, ge=0)
    run_as_group: int | None = Field(default=None, ge=0)


class Runtime(Strict):
    image: str | None = None
    working_dir: str | None = Field(default=None, description="container workingDir; Job only")
    pip: list[str] = Field(default_factory=list, description="Ray runtime_env pip packages; Ray only")
    env: dict[str, Text] = Field(default_factory=dict)
    env_secret: dict[str, str] = Field(default_factory=dict, description='NAME: "secret-name:key"')
    security: Security = Field(default_factory=Security)
    devices: dict[str, int] = Field(
        default_factory=dict,
        description="taugrid: extra extended resources per pod, e.g. rdma/rdma_shared_device_a: 1 "
        "(a managed manifest's runtime.rdma)",
    )
    shm_size: MemoryQuantity | None = Field(default=None, description="taugrid: size of /dev/shm (in memory)")


class Compute(Strict):
    workers: int | None = Field(default=None, ge=1, description="Ray workers (default 1); Ray only")
    gpus: int | None = Field(default=None, ge=0, description="GPUs per pod; Job only")
    gpus_per_worker: int | None = Field(default=None, ge=0, le=8, description="Ray only")
    cpu_request: CpuQuantity | None = None
    memory_request: MemoryQuantity | None = None
    cpu_limit: CpuQuantity | None = None
    memory_limit: MemoryQuantity | None = None
    head_cpu_request: CpuQuantity | None = None
    head_cpu_limit: CpuQuantity | None = None
    head_memory_request: MemoryQuantity | None = None
    head_memory_limit: MemoryQuantity | None = None
    worker_cpu_request: CpuQuantity | None = None
    worker_cpu_limit: CpuQuantity | None = None
    worker_memory_request: MemoryQuantity | None = None
    worker_memory_limit: MemoryQuantity | None = None
    gpu_resource_mode: Literal["device-plugin", "nvidia", "dra", "mig"] | None = None
    mig_profile: str | None = Field(default=None, description="e.g. 1g.18gb; needs gpu_resource_mode: mig")
    gpu_vendor: Literal["nvidia", "amd", "intel-gaudi", "any"] | None = Field(
        default=None, description="taugrid: the GPU vendor (any, or absent: whichever the run's queue offers)")
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1, description="taugrid: share of one GPU")
    gpu_memory: MemoryQuantity | None = Field(
        default=None, description="taugrid: GPU memory share, e.g. 20Gi"
    )
    placement: Literal["binpack", "spread"] | None = Field(default=None, description="taugrid: pod packing")
    gang: bool | None = Field(default=None, description="taugrid: start all pods together or none")


class TopologySlice(Strict):
    """taugrid: Kueue TAS pod-set slices (``podset-slice-required-topology`` + ``podset-slice-size``): the pods
    in groups of ``size``, each group inside one domain of ``level``."""

    level: str = Field(description="a node label key (or hostname / node / single-node) each slice stays within")
    size: int = Field(ge=1, description="pods per slice; divides the run's pod count")


class Policy(Strict):
    workspace: str | None = None
    namespace: str | None = None
    profile: str | None = None
    queue: str | None = Field(default=None, description="LocalQueue name or 'auto'")
    team: str | None = None
    lane: Literal["eval", "training", "large-memory", "elastic"] | None = None
    gpu_class: str | None = None
    mode: Literal["fixed", "elastic"] | None = None
    elastic: ElasticRange | None = Field(default=None, description="taugrid: size range of an elastic run")
    topology: str | None = None
    shape: str | None = None
    priority: str | None = Field(default=None, description="alias of priority_tier")
    priority_tier: str | None = None
    topology_policy: str | None = Field(default=None, description="required (default), preferred or unconstrained")
    topology_slice: TopologySlice | None = None
    workload_profile_snapshot: str | None = None
    workload_priority_class: str | None = None
    pod_priority_class: str | None = None
    node_selector: dict[str, Text] = Field(default_factory=dict)
    clear_node_selector: bool = False
    disable_default_priorities: bool = False
    preemptible: bool | None = Field(
        default=None, description="taugrid: false asks for a non-preemptible class"
    )


class ImageAsset(Strict):
    name: str
    image: str
    source_path: str
    mount_path: str


class Mount(Strict):
    """An existing PVC mounted into every pod of the run (a managed manifest's camelCase keys are mapped)."""

    name: str = Field(description="a DNS label naming the volume")
    pvc: str = Field(description="the PersistentVolumeClaim, in the workspace's namespace")
    mount_path: str = Field(description="absolute path in the container")
    read_only: bool = False
    sub_path: str | None = Field(default=None, description="a directory inside the claim")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        """TauGrid's direct configs write a mount as text: ``claim:/path`` or ``claim:/path:ro``."""
        if isinstance(value, str):
            claim, _, rest = value.partition(":")
            path, _, mode = rest.partition(":")
            if not claim or not path or mode not in ("", "ro", "rw"):
                raise ValueError(f"{value!r} is not claim:/path[:ro]")
            return {"name": claim, "pvc": claim, "mount_path": path, "read_only": mode == "ro"}
        return value


class Storage(Strict):
    data_pvc: str | None = Field(default=None, description="existing PVC mounted at /data")
    result_pvc: str | None = None
    output: str | None = Field(
        default=None, description="durable output path under the workspace output root"
    )
    checkpoint: str | None = None
    publish: Literal["staged"] | None = None
    volumes: list[str] = Field(
        default_factory=list, description="existing PVCs, each mounted at /mnt/<claim>"
    )
    mounts: list[Mount] = Field(default_factory=list)
    image_assets: list[ImageAsset] = Field(default_factory=list)


class Profiler(Strict):
    mode: Literal["nsys", "ncu"]
    rank: Text = "0"
    warmup: Duration | None = None
    duration: Duration | None = None


class Offload(Strict):
    enabled: bool = False
    image: str | None = None
    out: str | None = None


class Metrics(Strict):
    history: list[str] = Field(default_factory=list)
    offload: Offload = Field(default_factory=Offload)


class Experiment(Strict):
    project: str | None = None
    name: str | None = None
    group: str | None = None
    title: str | None = Field(default=None, description="deprecated; use name")


class Execution(Strict):
    launcher: Literal["python", "torchrun", "ray-train", "ray-tune"] | None = None
    processes_per_node: int | None = Field(default=None, ge=1)
    nodes: int = Field(default=1, ge=1)
    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    num_samples: int | None = Field(default=None, ge=1)
    max_concurrent_trials: int | None = Field(default=None, ge=1)
    configs: dict[str, Any] = Field(default_factory=dict)
    allow_nccl_override: bool = False


class Resilience(Strict):
    max_retries: int = Field(default=0, ge=0, le=100)
    retry_on: list[str] = Field(default_factory=lambda: ["Preempted", "Evicted"])
    checkpoint_path: str | None = Field(default=None, description="exported as TAU_RESUME_FROM on a retry")
    backoff_initial: Duration = 30.0
    backoff_max: Duration = 300.0
    hang_timeout: Duration | None = Field(
        default=None, description="taugrid: a run that prints nothing for this long is stopped as hung (reason Hang)"
    )


class TauConfig(Strict):
    """A validated direct ``tau.yaml``. Build it with :func:`load_tau_config` to get line-aware errors."""

    name: str | None = None
    engine: Literal["job", "ray"] | None = Field(default=None, description="job | ray (rayjob is an alias)")
    entrypoint: str | None = None
    script: str | None = Field(default=None, description="alias of entrypoint")
    image: str | None = Field(default=None, description="lowest-priority alias of runtime.image")
    args: list[Text] = Field(default_factory=list, description="taugrid: CLI arguments for the script")
    run: RunBlock = Field(default_factory=RunBlock)
    runtime: Runtime = Field(default_factory=Runtime)
    compute: Compute = Field(default_factory=Compute)
    policy: Policy = Field(default_factory=Policy)
    storage: Storage = Field(default_factory=Storage)
    profiler: Profiler | None = None
    metrics: Metrics = Field(default_factory=Metrics)
    experiment: Experiment = Field(default_factory=Experiment)
    execution: Execution = Field(default_factory=Execution)
    resilience: Resilience = Field(default_factory=Resilience)

    # where the config came from; excluded from dumps and from the hash
    _path: str = pydantic.PrivateAttr(default="tau.yaml")
    _lines: Lines = pydantic.PrivateAttr(default_factory=dict)
    # problems that do not stop the run (a managed manifest's unknown keys, keys meaning nothing here)
    _warnings: list[dict[str, object]] = pydantic.PrivateAttr(default_factory=list)
    _managed: bool = pydantic.PrivateAttr(default=False)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_alias(cls, value: Any) -> Any:
        return _engine_value(value)

    @model_validator(mode="after")
    def _fold_aliases(self) -> TauConfig:
        run = self.run
        self.name = self.name or run.name
        self.entrypoint = self.entrypoint or self.script or run.entrypoint or run.script or run.main_script
        self.runtime.image = self.runtime.image or run.image or self.image
        if self.engine is None:
            self.engine = run.engine or self._inferred_engine()
        return self

    def _inferred_engine(self) -> Literal["job", "ray"]:
        c = self.compute
        ray_kind = self.run.workload_kind not in (None, "job")
        ray_launcher = self.execution.launcher in ("ray-train", "ray-tune")
        if (
            c.workers is not None
            or c.gpus_per_worker is not None
            or self.runtime.pip
            or ray_kind
            or ray_launcher
        ):
            return "ray"
        return "job"

    @property
    def source_path(self) -> str:
        return self._path

    @property
    def warnings(self) -> list[dict[str, object]]:
        """Issues (``field``, ``message``, ``fix``, ``line``) that ``tau run validate`` prints and ``--strict``
        turns into errors."""
        return list(self._warnings)

    @property
    def managed(self) -> bool:
        """Whether the file was a managed workflow manifest (projected; see ``config.managed``)."""
        return self._managed

    def written(self, *path: str | int) -> bool:
        """Whether the source file spelled out this key (as opposed to a default)."""
        return tuple(path) in self._lines

    def line(self, *path: str | int) -> int | None:
        """The line of a key in the source file (or its nearest parent), for issues raised after loading."""
        return line_of(self._lines, tuple(path))


def _engine_value(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("rayjob", "ray"):
        return "ray"
    return value.strip().lower() if isinstance(value, str) else value


_DEADLINE = ("the time limit of one attempt is run.active_deadline",
             "move it to run.active_deadline (seconds, or a duration such as 2h)")
ELSEWHERE: dict[tuple[str, ...], tuple[str, str]] = {
    # keys people write for a setting that lives elsewhere: (where it is, the fix)
    **{(key,): _DEADLINE for key in ("active_deadline", "deadline", "timeout", "time_limit")},
    **{(block, key): _DEADLINE for block in ("resilience", "compute", "runtime", "execution", "policy")
       for key in ("active_deadline", "deadline", "timeout", "time_limit")},
}


def load_tau_config(text: str, *, path: str = "tau.yaml") -> TauConfig:
    """Parse and validate a ``tau.yaml``; raises ``ConfigError`` listing each problem at file:line.

    A managed workflow manifest (``schema_version`` and no ``engine``/``run.engine``) is projected onto a direct
    config first (``config.managed``): its unknown keys become warnings (``cfg.warnings``) instead of errors."""
    from taugrid.config import managed
    from taugrid.config.taurules import check_rules

    data, lines = load_yaml(text, path=path, what="tau.yaml")
    _refuse_removed_eval(data, path, lines)
    warnings: list[dict[str, object]] = []
    is_managed = managed.looks_managed(data)
    if is_managed:
        data, warnings = managed.project(data, path=path, lines=lines, direct=_direct_paths(),
                                         elsewhere=ELSEWHERE)
    elif "schema_version" in data:
        data = {k: v for k, v in data.items() if k != "schema_version"}
        warnings.append(make_issue(
            ("schema_version",), "schema_version marks a managed workflow manifest; with engine set this is a "
            "direct config and schema_version is ignored", "remove schema_version", file=path, lines=lines))
    try:
        cfg = TauConfig.model_validate(data)
    except pydantic.ValidationError as exc:
        raise_issues(pydantic_issues(exc, TauConfig, file=path, lines=lines, elsewhere=ELSEWHERE))
        raise  # unreachable: pydantic never reports zero errors
    cfg._path, cfg._lines, cfg._managed = path, lines, is_managed
    raise_issues(check_rules(cfg, raw=data))
    from taugrid.config.keyrules import key_warnings

    cfg._warnings = warnings + key_warnings(cfg)
    return cfg


def _direct_paths() -> dict[str, bool]:
    from taugrid.config.managed import model_paths

    return model_paths(TauConfig)


def _refuse_removed_eval(data: dict[str, Any], path: str, lines: Lines) -> None:
    """TauGrid removed ``task: eval``, ``eval.harness`` and ``eval.model``: evaluation is an ordinary run."""
    run: dict[str, Any] = data["run"] if isinstance(data.get("run"), dict) else {}
    task = next((t for t in (run.get("task"), data.get("task")) if isinstance(t, str) and t.strip()), "")
    evaluation: dict[str, Any] = data["eval"] if isinstance(data.get("eval"), dict) else {}
    found: list[tuple[str, ...]] = [("task",)] if task.strip().lower() == "eval" and "task" in data else []
    found += [("run", "task")] if task.strip().lower() == "eval" and "task" in run else []
    found += [("eval", k) for k in ("harness", "model") if k in evaluation]
    raise_issues([
        make_issue(p, "task: eval, eval.harness and eval.model were removed; evaluation is an ordinary run",
                   "drop them, keep engine: job, pass the checkpoint and results paths through runtime.env "
                   "(e.g. MODEL_PATH, RESULTS_PATH) and keep storage.output pointing at the results",
                   file=path, lines=lines)
        for p in found
    ])


_PARSED: OrderedDict[tuple[str, str], TauConfig] = OrderedDict()
_PARSED_MAX = 256


def load_tau_config_shared(text: str, *, path: str = "tau.yaml") -> TauConfig:
    """``load_tau_config`` memoised by (sha256 of the text, path): services see the same few configs again and
    again. The result is shared between callers, so it must be treated as read-only. Configs that fail to
    load are not cached (each call raises afresh, with the same issues)."""
    key = (hashlib.sha256(text.encode()).hexdigest(), path)
    cfg = _PARSED.get(key)
    if cfg is not None:
        _PARSED.move_to_end(key)
        return cfg
    cfg = load_tau_config(text, path=path)
    _PARSED[key] = cfg
    if len(_PARSED) > _PARSED_MAX:
        _PARSED.popitem(last=False)
    return cfg


def tau_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of ``tau.yaml``; every object has ``additionalProperties: false``."""
    schema = TauConfig.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://taugrid.io/schemas/tau.yaml.json"
    schema["title"] = "tau.yaml (direct run config)"
    return schema


def config_hash(cfg: TauConfig) -> str:
    """Hex sha256 of the validated config's canonical JSON (sorted keys, no spaces, defaults included)."""
    canonical = json.dumps(
        cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
