"""TauGrid's managed workflow manifests (``schema_version`` and no ``engine``), projected onto a direct config.

Routing (TauGrid's ``rawLooksLikeManagedWorkflow``): a document with ``schema_version`` and neither ``engine``
nor ``run.engine`` is a managed manifest, read leniently: a key neither the direct config nor the manifest
schema knows is dropped with a warning (did-you-mean where one is close), never an error. Everything else is a
direct config and stays strict.

The projection maps the manifest's own keys onto the direct config, so both reach the same ``ResolvedRun``:
- ``compute.gpus``/``cpus``/``memory``/``cpu_limit``/``memory_limit``: per pod (a Job's pod; a CPU Ray run's
  head); ``compute.worker_cpus``/``worker_memory``/``worker_cpu_limit``/``worker_memory_limit``: each Ray worker
  (default: the head's); ``compute.workers``: TauGrid's total Ray pod count, head included, whose head also does
  work. taugrid's head runs no tasks, so a CPU manifest becomes the head plus ``workers - 1`` workers
  (``workers: 5`` = 1 head + 4 workers) and a GPU manifest ``workers`` GPU workers beside a default head (the
  same GPUs, one more pod; ``workers: 1, gpus: 1`` = one A100 worker);
- the engine: ``run.workload_kind`` (or ``workflow.workload_kind``/``compute.workload_kind``) ``job`` or
  ``rayjob``/``ray-train``; absent, a Ray run when ``workers > 1``; a Job with ``gpus > 1`` and no launcher runs
  torchrun with one process per GPU (TauGrid's shape table);
- ``runtime.env`` as a list of ``{name, value}``; ``storage.mounts`` with camelCase keys (``mountPath``,
  ``readOnly``); ``workflow.script``/``main_script`` as the entrypoint.
- ``runtime.rdma`` (enabled) as ``runtime.devices`` (the RDMA extended resource) and ``runtime.shm_size``.
SDK metadata (``resource_naming``, ``research``, ``model``, ``artifacts``) is accepted silently, as TauGrid does;
keys that change nothing here (``eval``, ``workflow.file``/``secret_payload``/``smoke_pairs``/
``upstream_checkpoint``, ``compute.cpu_workers``) are accepted with an unused warning; ``runtime.env_kv`` (Azure
Key Vault), image assets (TauGrid: direct Job dispatch only) and ``task: eval``/``eval.harness``/``eval.model``
(removed by TauGrid itself) are refused.

Invariant: ``project`` is pure; the same document gives the same direct mapping and the same warnings.
"""

from __future__ import annotations

import typing
from typing import Any

import pydantic

from taugrid.config.source import Lines, make_issue, raise_issues
from taugrid.core.quantity import parse_cpu, parse_memory

Issue = dict[str, object]

# Manifest-owned keys (TauGrid's managedPassthroughPaths plus the keys this projection maps); True = structured
# (its children are checked too), False = opaque or a leaf.
MANAGED_PATHS: dict[str, bool] = {
    "schema_version": False,
    "eval": False,
    "artifacts": False,
    "research": False,
    "model": False,
    "resource_naming": False,
    "workflow": True,
    "workflow.file": False,
    "workflow.script": False,
    "workflow.main_script": False,
    "workflow.workload_kind": False,
    "workflow.extra_scripts": False,
    "workflow.upstream_checkpoint": False,
    "workflow.secret_payload": False,
    "workflow.smoke_pairs": False,
    "run.smoke_pairs": False,
    "compute.cpus": False,
    "compute.memory": False,
    "compute.worker_cpus": False,
    "compute.worker_memory": False,
    "compute.cpu_workers": False,
    "compute.workload_kind": False,
    "runtime.env_kv": False,
    "runtime.rdma": True,
    "runtime.rdma.enabled": False,
    "runtime.rdma.resource_name": False,
    "runtime.rdma.count": False,
    "runtime.rdma.shm_size": False,
    "storage.mounts": True,
    "storage.mounts.name": False,
    "storage.mounts.mountPath": False,
    "storage.mounts.pvc": False,
    "storage.mounts.readOnly": False,
    "storage.mounts.subPath": False,
}

# Accepted manifest keys that change nothing in taugrid, and why (reported as warnings, so --strict refuses).
# SDK metadata (``resource_naming``, ``research``, ``model``, ``artifacts``) is accepted silently, as TauGrid does:
# it describes the run and changes nothing that runs. ``workflow.extra_scripts`` is honoured by the snapshot (the
# whole project folder is shipped).
UNUSED: dict[str, str] = {
    "eval": "eval.* describes TauGrid's SDK evaluation stage; taugrid runs the entrypoint as an ordinary run",
    "workflow.file": "taugrid runs this file's entrypoint; the delegated manifest is not read",
    "workflow.upstream_checkpoint": "pass the path to your script through runtime.env instead",
    "workflow.secret_payload": "use runtime.env_secret",
    "workflow.smoke_pairs": "no smoke mode in taugrid",
    "run.smoke_pairs": "no smoke mode in taugrid",
    "compute.cpu_workers": "used by TauGrid's SDK eval stage only",
}

RDMA_RESOURCE = "rdma/rdma_shared_device_a"
RAY_KINDS = ("rayjob", "ray-train", "ray_train", "ray")


def looks_managed(data: dict[str, Any]) -> bool:
    """TauGrid's routing rule: ``schema_version`` present and no (non-blank) ``engine`` / ``run.engine``."""
    run = data.get("run")
    run_engine = run.get("engine") if isinstance(run, dict) else None
    return data.get("schema_version") is not None and not any(
        isinstance(e, str) and e.strip() for e in (data.get("engine"), run_engine)
    )


def _unwrap(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return [c for a in typing.get_args(tp) for c in _unwrap(a)]
    if origin is list:
        return _unwrap(typing.get_args(tp)[0])
    return [tp]


def model_paths(model: type[pydantic.BaseModel], prefix: str = "") -> dict[str, bool]:
    """Every dotted key path of ``model`` → whether it is a nested model (list items share their list's path);
    free-form maps are leaves: their keys are user data."""
    out: dict[str, bool] = {}
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = [t for t in _unwrap(info.annotation) if isinstance(t, type) and issubclass(t, pydantic.BaseModel)]
        out[path] = bool(nested)
        for sub in nested:
            out.update(model_paths(sub, f"{path}."))
    return out


def _known(path: str, direct: dict[str, bool]) -> bool | None:
    """None if unknown, else whether to descend into it."""
    if path in MANAGED_PATHS:
        return MANAGED_PATHS[path]
    if path in direct:
        return direct[path]
    return None


def unknown_keys(data: Any, direct: dict[str, bool]) -> list[tuple[str, list[str]]]:
    """(dotted path, child keys) of every key of a managed manifest that nobody knows, sorted, each once."""
    found: dict[str, list[str]] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, prefix)
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            descend = _known(path, direct)
            if descend is None:
                found.setdefault(path, [str(k) for k in value] if isinstance(value, dict) else [])
            elif descend:
                walk(value, path)

    walk(data, "")
    return sorted(found.items())


def _levenshtein(a: str, b: str, cutoff: int | None = None) -> int:
    """The edit distance of ``a`` and ``b``; with ``cutoff``, any distance over it reads ``cutoff + 1``, found as
    soon as a whole row of the table is over it (a row's minimum never falls)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(cur[j - 1] + 1, prev[j] + 1, prev[j - 1] + (ca != cb)))
        if cutoff is not None and min(cur) > cutoff:
            return cutoff + 1
        prev = cur
    return prev[-1] if cutoff is None else min(prev[-1], cutoff + 1)


SUGGEST_MAX_CHARS = 128  # a longer unknown path is given no did-you-mean (Python's edit distance is quadratic)


def suggest_path(path: str, candidates: list[str]) -> str | None:
    """The closest known path (TauGrid's rule: edit distance on the path, or on the leaf at equal depth; at most
    a third of the leaf wrong, between 2 and 6 edits).

    Only a candidate within that limit is ever returned, so one that cannot come within it is measured no further
    than it takes to know (a distance is at least the difference in length; ``_levenshtein``'s cutoff): the answer
    is TauGrid's, and a manifest of unknown keys costs milliseconds, not the minutes its full tables took."""
    if len(path) > SUGGEST_MAX_CHARS:
        return None  # no typo of a known path (the longest is under 64 characters)
    leaf, depth = path.rsplit(".", 1)[-1], path.count(".")
    limit = min(max(len(leaf) // 3, 2), 6)
    best, best_d, best_pd = None, -1, -1
    for cand in candidates:
        cand_leaf = cand.rsplit(".", 1)[-1]
        leaf_d = limit + 1
        if cand.count(".") == depth and abs(len(leaf) - len(cand_leaf)) <= limit:
            leaf_d = _levenshtein(leaf, cand_leaf, limit)
        if leaf_d <= limit:
            pd = _levenshtein(path, cand)  # exact: it breaks ties between candidates within the limit
        elif abs(len(path) - len(cand)) > limit or (pd := _levenshtein(path, cand, limit)) > limit:
            continue  # neither the path nor the leaf comes within the limit
        d = min(pd, leaf_d)
        if best is None or d < best_d or (d == best_d and pd < best_pd):
            best, best_d, best_pd = cand, d, pd
    return best if best is not None and best_d <= limit else None


def _suggestion(path: str, children: list[str], candidates: list[str]) -> str | None:
    """A suggestion for ``path`` itself, else the one parent every child is a typo under (the search ends at the
    first child that is none, or under a second parent)."""
    if (got := suggest_path(path, candidates)) is not None:
        return got
    parents: set[str] = set()
    for child in children:
        s = suggest_path(f"{path}.{child}", candidates)
        if not s or "." not in s:
            return None
        parents.add(s.rsplit(".", 1)[0])
        if len(parents) > 1:
            return None
    return parents.pop() if parents else None


def _kind(data: dict[str, Any]) -> str | None:
    for block in ("run", "workflow", "compute"):
        value = (data.get(block) or {}).get("workload_kind") if isinstance(data.get(block), dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip().lower()
    return None


def project(
    data: dict[str, Any], *, path: str, lines: Lines, direct: dict[str, bool],
    elsewhere: dict[tuple[str, ...], tuple[str, str]] | None = None,
) -> tuple[dict[str, Any], list[Issue]]:
    """The direct-config mapping of a managed manifest and its warnings; raises ``ConfigError`` for what the
    manifest asks and taugrid cannot do."""
    errors: list[Issue] = []
    warnings: list[Issue] = []
    elsewhere = elsewhere or {}

    def err(p: tuple[str | int, ...], message: str, fix: str) -> None:
        errors.append(make_issue(p, message, fix, file=path, lines=lines))

    def warn(p: tuple[str | int, ...], message: str, fix: str, kind: str = "unused") -> None:
        warnings.append({**make_issue(p, message, fix, file=path, lines=lines), "kind": kind})

    candidates = sorted({p for p in direct if not direct[p]} | {p for p, d in MANAGED_PATHS.items() if not d})
    for key, children in unknown_keys(data, direct):
        hint = _suggestion(key, children, candidates)
        meant = elsewhere.get(tuple(key.split(".")))
        # the message is TauGrid's own (its did-you-mean); the fix may point further, at where the setting lives
        warn(tuple(key.split(".")), f"unknown config key {key!r} in {path} (ignored)"
             + (f"; did you mean {hint!r}?" if hint else ""),
             f"rename it to {hint}" if hint else f"{meant[0]}: {meant[1]}" if meant
             else "remove it (see `tau run schema`)", "unknown")

    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in direct and not direct[key]:
            out[key] = value
    for block in ("run", "policy", "profiler", "metrics", "experiment", "execution", "resilience"):
        if isinstance(data.get(block), dict):
            out[block] = _known_only(data[block], block, direct)
        elif block in data:
            out[block] = data[block]  # a wrong type: the direct model reports it
    run = out.setdefault("run", {}) if isinstance(out.get("run", {}), dict) else {}
    workflow: dict[str, Any] = data["workflow"] if isinstance(data.get("workflow"), dict) else {}
    if not any(run.get(k) for k in ("entrypoint", "script", "main_script")) and not any(
        out.get(k) for k in ("entrypoint", "script")
    ):
        for key in ("script", "main_script"):
            if workflow.get(key):
                run["entrypoint"] = workflow[key]
                break
    for key, why in UNUSED.items():
        head, _, rest = key.partition(".")
        present = key in data if not rest else isinstance(data.get(head), dict) and rest in data[head]
        if present:
            warn(tuple(key.split(".")), f"{key} is accepted but unused: {why}", f"remove {key}")

    if isinstance(data.get("run"), dict) and data["run"].get("source") is not None:
        err(("run", "source"), "run.source requires direct Job dispatch (TauGrid's rule)",
            "write a direct config (engine: job) to run from a source image")
    _runtime(data, out, err, warn)
    _storage(data, out, err)
    _compute(data, out, err, warn, direct)
    raise_issues(errors)
    return out, warnings


def _known_only(node: Any, prefix: str, direct: dict[str, bool]) -> Any:
    """``node`` with the keys the direct config does not know removed (they were warned about)."""
    if isinstance(node, list):
        return [_known_only(item, prefix, direct) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        path = f"{prefix}.{key}"
        if path in direct:
            out[key] = _known_only(value, path, direct) if direct[path] else value
    return out


def _runtime(data: dict[str, Any], out: dict[str, Any], err: Any, warn: Any) -> None:
    runtime = data.get("runtime")
    if not isinstance(runtime, dict):
        if "runtime" in data:
            out["runtime"] = runtime
        return
    got: dict[str, Any] = {k: v for k, v in runtime.items()
                           if k in ("image", "pip", "env_secret", "working_dir", "security")}
    env = runtime.get("env")
    if isinstance(env, list):
        mapped: dict[str, Any] = {}
        for i, item in enumerate(env):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or set(item) - {"name", "value"}:
                err(("runtime", "env", i), "each runtime.env entry is {name, value}",
                    'write - name: LOG_LEVEL\n      value: "info"')
                continue
            mapped[item["name"]] = "" if item.get("value") is None else item["value"]
        got["env"] = mapped
    elif env is not None:
        got["env"] = env
    if runtime.get("env_kv"):
        err(("runtime", "env_kv"), "Azure Key Vault references are not supported by taugrid",
            'use runtime.env_secret (NAME: "secret-name:key") with a Secret in the workspace')
    rdma = runtime.get("rdma")
    if isinstance(rdma, dict) and rdma.get("enabled") is True:
        # the RDMA device as an extended resource of every pod, and a larger /dev/shm for NCCL
        name, count = rdma.get("resource_name") or RDMA_RESOURCE, rdma.get("count", 1)
        if not isinstance(name, str) or "/" not in name:
            err(("runtime", "rdma", "resource_name"), f"{name!r} is not an extended resource name",
                f"e.g. {RDMA_RESOURCE}")
        elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
            err(("runtime", "rdma", "count"), f"must be a whole number ≥ 1, got {count!r}", "e.g. 1")
        else:
            got["devices"] = {name: count}
        if rdma.get("shm_size") is not None:
            got["shm_size"] = rdma["shm_size"]
    out["runtime"] = got


def _storage(data: dict[str, Any], out: dict[str, Any], err: Any) -> None:
    storage = data.get("storage")
    if not isinstance(storage, dict):
        if "storage" in data:
            out["storage"] = storage
        return
    got = {k: v for k, v in storage.items()
           if k in ("data_pvc", "result_pvc", "output", "publish", "checkpoint", "volumes", "image_assets")}
    if storage.get("image_assets"):
        err(("storage", "image_assets"), "storage.image_assets requires direct Job dispatch (TauGrid's rule)",
            "write a direct config (engine: job) to stage image assets")
    mounts = storage.get("mounts")
    if isinstance(mounts, list):
        got["mounts"] = [
            {"name": m.get("name"), "pvc": m.get("pvc"), "mount_path": m.get("mountPath"),
             **({"read_only": m["readOnly"]} if "readOnly" in m else {}),
             **({"sub_path": m["subPath"]} if "subPath" in m else {})}
            if isinstance(m, dict) else m
            for m in mounts
        ]
    elif mounts is not None:
        got["mounts"] = mounts
    out["storage"] = got


def _quantity(value: Any, key: str, parse: Any, err: Any) -> Any:
    if value is None:
        return None
    try:
        parse(value)
    except (ValueError, TypeError) as exc:
        err(("compute", key), str(exc), "write a quantity like 2, 500m, 16Gi")
        return None
    return value


def _compute(
    data: dict[str, Any], out: dict[str, Any], err: Any, warn: Any, direct: dict[str, bool]
) -> None:
    compute: dict[str, Any] = data["compute"] if isinstance(data.get("compute"), dict) else {}
    if "compute" in data and not isinstance(data.get("compute"), dict):
        out["compute"] = data["compute"]
        return
    direct_keys = {k: v for k, v in compute.items() if f"compute.{k}" in direct and k not in ("workers", "gpus")}
    cpus = _quantity(compute.get("cpus"), "cpus", parse_cpu, err)
    memory = _quantity(compute.get("memory"), "memory", parse_memory, err)
    worker_cpus = _quantity(compute.get("worker_cpus"), "worker_cpus", parse_cpu, err)
    worker_memory = _quantity(compute.get("worker_memory"), "worker_memory", parse_memory, err)
    workers, gpus = compute.get("workers"), compute.get("gpus")
    for key, value in (("workers", workers), ("gpus", gpus)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            err(("compute", key), f"must be a whole number ≥ {1 if key == 'workers' else 0}, got {value!r}",
                f"set compute.{key} to e.g. 1")
            return
    if workers == 0:
        err(("compute", "workers"), "must be at least 1 (the total Ray pod count)", "set compute.workers: 1")
        return
    kind = _kind(data)
    ray = kind in RAY_KINDS if kind else (workers or 1) > 1
    if kind and kind not in (*RAY_KINDS, "job"):
        err(("run", "workload_kind"), f"unknown workload_kind {kind!r}", "use job or rayjob")
        return
    out["engine"] = "ray" if ray else "job"
    run = out.get("run")
    if isinstance(run, dict):
        run.pop("workload_kind", None)  # the engine is decided above
    c: dict[str, Any] = dict(direct_keys)
    if ray:
        # TauGrid's head does work too. taugrid's head runs no tasks, so the GPUs stay where TauGrid puts them:
        # a GPU manifest gets `workers` GPU workers beside the head (same GPUs, one more pod); a CPU manifest
        # keeps its pod count (the head, with cpus/memory, plus workers - 1 workers).
        gpu_pods = (gpus or 0) > 0
        c.setdefault("workers", (workers or 1) if gpu_pods else max((workers or 1) - 1, 1))
        c.setdefault("gpus_per_worker", gpus or 0)
        cpu_limit, memory_limit = c.pop("cpu_limit", None), c.pop("memory_limit", None)
        if (workers or 1) > 1 and not gpu_pods:  # the head is a pod of TauGrid's count, sized by cpus/memory
            for key, value in (("head_cpu_request", cpus), ("head_memory_request", memory),
                               ("head_cpu_limit", cpu_limit), ("head_memory_limit", memory_limit)):
                if value is not None:
                    c.setdefault(key, value)
        for key, value in (("worker_cpu_request", worker_cpus or cpus),
                           ("worker_memory_request", worker_memory or memory),
                           ("worker_cpu_limit", compute.get("worker_cpu_limit") or compute.get("cpu_limit")),
                           ("worker_memory_limit", compute.get("worker_memory_limit") or compute.get("memory_limit"))):
            if value is not None:
                c.setdefault(key, value)
    else:
        if workers is not None and workers > 1:
            err(("compute", "workers"), f"{workers} pods need a Ray run; this manifest runs a Job",
                "set run.workload_kind: rayjob, or compute.workers: 1")
        for key, value in (("gpus", gpus), ("cpu_request", cpus), ("memory_request", memory)):
            if value is not None:
                c.setdefault(key, value)
        for key in ("worker_cpus", "worker_memory"):
            if key in compute:
                warn(("compute", key), f"compute.{key} sizes Ray workers; this manifest runs a Job", "remove it")
        execution = out.setdefault("execution", {})
        if isinstance(execution, dict) and (gpus or 0) > 1 and not execution.get("launcher"):
            execution["launcher"] = "torchrun"  # TauGrid's shape table: one pod, N GPUs → torchrun, N processes
            execution.setdefault("processes_per_node", gpus)
    out["compute"] = c
