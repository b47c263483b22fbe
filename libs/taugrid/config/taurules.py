"""Cross-field rules of a direct ``tau.yaml`` (``taugrid.md`` §1.3) that a type system cannot express.

Invariant: ``check_rules`` never raises; it returns every problem at once, each naming the field, its line and
the fix, so a researcher fixes the whole file in one pass.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import shlex
from typing import Any

from taugrid.config.source import make_issue, suggest
from taugrid.config.taujob import TauConfig
from taugrid.core.classify import RETRY_ON_VALUES as RETRY_REASONS  # recovery's vocabulary
from taugrid.core.limits import ENV_TOTAL_MAX, ENV_VALUE_MAX

RAYJOB_NAME_MAX = 47
TAU_ENV_ALLOWED = frozenset({"TAU_RESUME_FROM", "TAU_RETRY_ATTEMPT", "TAU_RETRY_MAX", "TAU_RETRY_REASON"})
RAY_ONLY_COMPUTE = (
    "workers",
    "gpus_per_worker",
    "head_cpu_request",
    "head_cpu_limit",
    "head_memory_request",
    "head_memory_limit",
    "worker_cpu_request",
    "worker_cpu_limit",
    "worker_memory_request",
    "worker_memory_limit",
)

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that say "credential": a literal value here would sit in RUNS, AUDIT (a year), KV and evidence.
_CREDENTIAL_NAME = re.compile(
    r"(^|_)(PASSWORD|PASSWD|PASS|TOKEN|SECRET|APIKEY|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?|AUTH)($|_)"
    r"|SECRET"
)
_SECRET_REF = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[-._a-zA-Z0-9]+$")

Issues = list[dict[str, object]]


def check_rules(cfg: TauConfig, *, raw: dict[str, Any] | None = None) -> Issues:
    issues: Issues = []

    def add(path: tuple[str | int, ...], message: str, fix: str = "") -> None:
        issues.append(make_issue(path, message, fix, file=cfg.source_path, lines=cfg._lines))

    _identity(cfg, add, raw or {})
    _env(cfg, add)
    _engine(cfg, add)
    _launcher(cfg, add)
    _gpu_share(cfg, add)
    _misc(cfg, add)
    _gang(cfg, add)
    _paths(cfg, add)
    from taugrid.config.keyrules import refusals

    refusals(cfg, add)
    return issues


def _identity(cfg: TauConfig, add: Any, raw: dict[str, Any]) -> None:
    if not cfg.name:
        add(("name",), "a run name is required", "add 'name: my-run' (lower-case letters, digits, dashes)")
    elif len(cfg.name) > 63 or not _DNS_NAME.match(cfg.name):
        add(
            ("name",),
            f"{cfg.name!r} is not a DNS name",
            "use at most 63 lower-case letters, digits and dashes; start and end with a letter or digit",
        )
    elif cfg.engine == "ray" and len(cfg.name) > RAYJOB_NAME_MAX:
        add(
            ("name",),
            f"a RayJob name must be at most {RAYJOB_NAME_MAX} characters (KubeRay); this is {len(cfg.name)}",
            "shorten the name",
        )
    if cfg.run.name and cfg.name != cfg.run.name:
        add(("run", "name"), f"conflicts with name {cfg.name!r}", "set the name in one place")
    if not cfg.entrypoint:
        add(
            ("entrypoint",),
            "an entrypoint is required",
            "add 'entrypoint: train.py' (path relative to tau.yaml)",
        )
    given = {
        k: v
        for k, v in (
            ("entrypoint", raw.get("entrypoint")),
            ("script", cfg.script),
            ("run.entrypoint", cfg.run.entrypoint),
            ("run.script", cfg.run.script),
        )
        if v
    }
    if len(set(given.values())) > 1:
        second = list(given)[1]
        add(
            tuple(second.split(".")),
            f"conflicts with {list(given)[0]} ({', '.join(map(repr, given.values()))})",
            "set the entrypoint in one place",
        )
    if cfg.run.engine and cfg.engine != cfg.run.engine:
        add(("run", "engine"), f"conflicts with engine {cfg.engine!r}", "set the engine in one place")


def _env(cfg: TauConfig, add: Any) -> None:
    nccl_ok = cfg.execution.allow_nccl_override
    total = 0
    for block, names in (("env", cfg.runtime.env), ("env_secret", cfg.runtime.env_secret)):
        for key in names:
            path = ("runtime", block, key)
            upper = key.upper()
            if not _ENV_NAME.match(key):
                add(
                    path,
                    f"{key!r} is not a valid environment variable name",
                    "use letters, digits and underscores",
                )
            elif upper.startswith("TAU_") and upper not in TAU_ENV_ALLOWED:
                add(
                    path,
                    "the TAU_ namespace is reserved for the platform",
                    f"rename it; only {', '.join(sorted(TAU_ENV_ALLOWED))} may be set",
                )
            elif upper in ("MASTER_ADDR", "MASTER_PORT"):
                add(path, f"{key} is reserved: the platform sets the rendezvous address", "remove it")
            elif upper.startswith("NCCL_") and not nccl_ok:
                add(
                    path,
                    "NCCL_* variables are reserved: the platform tunes NCCL for the fabric",
                    "remove it, or set execution.allow_nccl_override: true if you must",
                )
    for key in cfg.runtime.env:
        if _CREDENTIAL_NAME.search(key.upper()):
            ref = key.lower().replace("_", "-")
            add(
                ("runtime", "env", key),
                f"{key} looks like a credential: a literal value would be stored in the run's events, the audit "
                "trail and its evidence",
                f'move it to runtime.env_secret, e.g. {key}: "{ref}:value" (locally the secret lives in '
                "$TAU_DATA_DIR/secrets/<workspace>.yaml; on Kubernetes in a Secret of the workspace's namespace)",
            )
    for key, value in cfg.runtime.env.items():
        size = len(value.encode())
        total += size
        if size > ENV_VALUE_MAX:
            add(
                ("runtime", "env", key),
                f"value is {size} bytes; the limit is {ENV_VALUE_MAX} (64 KiB)",
                "ship large values as a file or a secret",
            )
    if total > ENV_TOTAL_MAX:
        add(
            ("runtime", "env"),
            f"literal env values total {total} bytes; the limit is {ENV_TOTAL_MAX} (128 KiB)",
            "ship large values as a file or a secret",
        )
    for key, ref in cfg.runtime.env_secret.items():
        if not _SECRET_REF.match(ref):
            add(
                ("runtime", "env_secret", key),
                f"{ref!r} is not a secret reference",
                'write "secret-name:key", e.g. HF_TOKEN: "hf-credentials:token"',
            )


def _engine(cfg: TauConfig, add: Any) -> None:
    c = cfg.compute
    if cfg.engine == "job":
        for name in RAY_ONLY_COMPUTE:
            if getattr(c, name) is not None:
                add(
                    ("compute", name),
                    "Ray-only; this run uses engine: job",
                    "remove it, or set engine: ray"
                    + (" (use compute.gpus for a Job)" if "gpu" in name else ""),
                )
        if cfg.runtime.pip:
            add(
                ("runtime", "pip"),
                "Ray-only (Ray runtime_env); a Job installs packages in its image",
                "list them in the project's requirements.txt (built per run on a local stack), bake them "
                "into the image, or set engine: ray",
            )
        if cfg.run.working_dir:
            add(
                ("run", "working_dir"),
                "Ray-only (shipped as Ray runtime_env)",
                "use runtime.working_dir for a Job's container directory",
            )
    else:
        job_only = [
            (("compute", "gpus"), c.gpus is not None, "use compute.gpus_per_worker for Ray"),
            (("runtime", "working_dir"), bool(cfg.runtime.working_dir), "use run.working_dir for Ray"),
            (("run", "source"), cfg.run.source is not None, "remove it"),
            (("storage", "image_assets"), bool(cfg.storage.image_assets), "remove it"),
        ]
        for path, present, fix in job_only:
            if present:
                add(path, "Job-only; this run uses engine: ray", fix)
        wd = cfg.run.working_dir
        if wd and (wd.startswith("/") or ".." in wd.replace("\\", "/").split("/")):
            # The shipped project is the config file's directory; Ray runs the entrypoint from this directory
            # inside it, so it must not leave it (a path on the submitter's machine means nothing in a pod).
            add(
                ("run", "working_dir"),
                f"{wd!r} is outside the project directory that is shipped (the config file's directory)",
                "write it relative to the config file, e.g. `.` or `src`",
            )


def _launcher(cfg: TauConfig, add: Any) -> None:
    ex = cfg.execution
    launcher = ex.launcher
    if cfg.engine == "job" and launcher in ("ray-train", "ray-tune"):
        add(
            ("execution", "launcher"),
            f"{launcher} needs engine: ray",
            "set engine: ray, or use python/torchrun",
        )
    if cfg.engine == "ray" and launcher in ("python", "torchrun"):
        add(
            ("execution", "launcher"),
            f"{launcher} is a Job launcher; Ray uses ray-train or ray-tune",
            "set engine: job, or use ray-train",
        )
    if ex.nodes > 1 and (cfg.engine != "job" or launcher != "torchrun"):
        add(
            ("execution", "nodes"),
            "more than one node needs engine: job and execution.launcher: torchrun",
            "set launcher: torchrun (or use engine: ray with compute.workers)",
        )
    if launcher == "torchrun" and cfg.entrypoint and not cfg.entrypoint.endswith(".py"):
        add(
            ("entrypoint",),
            f"torchrun needs a .py entrypoint, got {cfg.entrypoint!r}",
            "point entrypoint at the training script (train.py)",
        )
    gpus = cfg.compute.gpus or 0
    if ex.processes_per_node is not None:
        if launcher != "torchrun" and ex.processes_per_node > 1:
            add(
                ("execution", "processes_per_node"),
                "only torchrun starts several processes per node",
                "set execution.launcher: torchrun, or remove it",
            )
        elif gpus > 0 and ex.processes_per_node > gpus:
            add(
                ("execution", "processes_per_node"),
                f"{ex.processes_per_node} processes on {gpus} GPU(s) per node; at most one process per GPU",
                f"set processes_per_node to {gpus} or fewer, or raise compute.gpus",
            )
    for i, reason in enumerate(cfg.resilience.retry_on):
        if reason not in RETRY_REASONS:
            guess = suggest(reason, list(RETRY_REASONS))
            add(
                ("resilience", "retry_on", i),
                f"unknown retry reason {reason!r}" + (f"; did you mean '{guess}'?" if guess else ""),
                f"use one of {', '.join(RETRY_REASONS)}",
            )
    r = cfg.resilience
    if r.backoff_initial > r.backoff_max:
        add(
            ("resilience", "backoff_initial"),
            f"{r.backoff_initial:g}s is longer than backoff_max {r.backoff_max:g}s",
            "make backoff_initial at most backoff_max",
        )


def _gpu_share(cfg: TauConfig, add: Any) -> None:
    c = cfg.compute
    share = c.gpu_fraction is not None or c.gpu_memory is not None
    if c.gpu_fraction is not None and c.gpu_memory is not None:
        add(("compute", "gpu_memory"), "set either gpu_fraction or gpu_memory, not both", "remove one")
    if share and (c.gpus or 0) > 0:
        add(
            ("compute", "gpu_fraction" if c.gpu_fraction is not None else "gpu_memory"),
            "a GPU share is a part of one GPU; it cannot be combined with compute.gpus",
            "remove compute.gpus (the share implies one shared GPU)",
        )
    if share and (cfg.engine != "job" or cfg.execution.nodes > 1 or cfg.execution.launcher == "torchrun"):
        add(
            ("compute", "gpu_fraction" if c.gpu_fraction is not None else "gpu_memory"),
            "a GPU share works for a single-process Job only",
            "use whole GPUs for distributed runs",
        )
    if c.mig_profile and c.gpu_resource_mode not in (None, "mig"):
        add(
            ("compute", "mig_profile"),
            f"needs gpu_resource_mode: mig, not {c.gpu_resource_mode}",
            "set compute.gpu_resource_mode: mig",
        )
    if share and c.gpu_resource_mode == "mig":
        add(
            ("compute", "gpu_resource_mode"), "MIG slices and GPU shares are different mechanisms", "pick one"
        )


def _gang(cfg: TauConfig, add: Any) -> None:
    """``compute.gang: false`` is refused: a run's pods always start as one gang. Kueue admits a workload's pods
    together or not at all and gives no workload a way out of waitForPodsReady (a controller-wide setting, here
    ``platform.yaml`` ``wait_for_pods_ready``); KAI gangs a PodGroup whole, and taugrid renders no PodGroup with a
    smaller ``minMember``. ``true`` is what every run gets."""
    if cfg.compute.gang is False:
        add(
            ("compute", "gang"),
            "a run's pods always start together or not at all (Kueue admits a workload whole, and the platform's "
            "wait_for_pods_ready evicts and requeues one whose pods are not all ready in time); there is no "
            "partial start to turn on",
            "remove compute.gang; for pods that should start and fail independently, submit them as separate "
            "runs (e.g. a sweep)",
        )


def _misc(cfg: TauConfig, add: Any) -> None:
    s = cfg.storage
    if s.result_pvc and s.data_pvc and s.result_pvc != s.data_pvc:
        add(("storage", "result_pvc"), "must equal storage.data_pvc when both are set", "use one PVC")
    if cfg.run.source is not None and "@sha256:" not in cfg.run.source.image:
        add(
            ("run", "source", "image"), "a source image must be pinned by digest", "use image@sha256:<digest>"
        )
    for i, asset in enumerate(s.image_assets):
        if "@sha256:" not in asset.image:
            add(
                ("storage", "image_assets", i, "image"),
                "an image asset must be pinned by digest",
                "use image@sha256:<digest>",
            )
    tier, alias = cfg.policy.priority_tier, cfg.policy.priority
    if tier and alias and tier != alias:
        add(
            ("policy", "priority"),
            f"conflicts with priority_tier {tier!r} (priority is its alias)",
            "set only priority_tier",
        )
    if cfg.metrics.offload.enabled and cfg.engine == "job" and cfg.execution.nodes > 1:
        add(
            ("metrics", "offload", "enabled"),
            "the metrics sidecar runs on a single-pod Job or a Ray head only",
            "disable offload for multi-node runs",
        )


_INTERPRETERS = frozenset({"python", "python3", "sh", "bash"})
_ENTRYPOINT_KEYS: tuple[tuple[str, ...], ...] = (
    ("entrypoint",), ("script",), ("run", "entrypoint"), ("run", "script"), ("run", "main_script"),
)


def _escapes(path: str) -> bool:
    """Whether a path leaves the directory it is relative to (absolute, or ``..`` past its start)."""
    if path.startswith(("/", "~")) or "\\" in path:
        return True
    normal = posixpath.normpath(path)
    return normal == ".." or normal.startswith("../")


def escape_depth(path: str) -> int:
    """How many folders above its start a relative path reaches (0: inside); -1 for an absolute one."""
    if path.startswith(("/", "~")) or "\\" in path:
        return -1
    normal = posixpath.normpath(path).split("/")
    return len(list(itertools.takewhile(lambda part: part == "..", normal)))


def entrypoint_escape(cfg: TauConfig) -> int:
    """The deepest escape of the entrypoint's file words (0 when none leaves the config's folder)."""
    if not cfg.entrypoint or cfg.run.source is not None:
        return 0
    return max([0, *(escape_depth(w) for w in _program_paths(cfg.entrypoint))])


def _program_paths(entrypoint: str) -> list[str]:
    """The words of an entrypoint that name what runs: the program, and an interpreter's script."""
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        words = entrypoint.split()
    if not words:
        return []
    named = [words[0]]
    if posixpath.basename(words[0]) in _INTERPRETERS:
        script = next((w for w in words[1:] if not w.startswith("-")), None)
        if script is not None and "-c" not in words[1:] and "-m" not in words[1:]:
            named.append(script)
    return [w for w in named if "/" in w or w.startswith("~")]


def _paths(cfg: TauConfig, add: Any) -> None:
    """Entrypoints and working directories stay inside the project snapshot (a source image's own paths are
    the image's business)."""
    if cfg.entrypoint and cfg.run.source is None:
        key = next((k for k in _ENTRYPOINT_KEYS if cfg.written(*k)), ("entrypoint",))
        for word in _program_paths(cfg.entrypoint):
            # A managed manifest may name a script beside its folder (TauGrid's CPU quickstart does): the client
            # then ships the folder that holds both (config/project.project_root), and policy checks the result.
            if _escapes(word) and not (cfg.managed and escape_depth(word) > 0):
                add(
                    key,
                    f"{word!r} is outside the project snapshot: an entrypoint runs a file of the project "
                    "(relative to the folder holding tau.yaml) or a command on PATH",
                    "copy the script into the project folder and name it relatively, e.g. scripts/run.sh",
                )
    wd = cfg.runtime.working_dir
    if wd and cfg.run.source is None:
        normal = posixpath.normpath(wd)
        if ".." in wd.replace("\\", "/").split("/") or normal == "/" or "\\" in wd:
            add(
                ("runtime", "working_dir"),
                f"{wd!r} is outside the project snapshot: an absolute runtime.working_dir is where the project "
                "is mounted, a relative one a directory inside it",
                "use a directory inside the project (e.g. src) or a mount point such as /workspace; no '..'",
            )
