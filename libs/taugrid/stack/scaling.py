"""Replica counts of the embedded stack's services: which names exist, what counts are allowed, and the control
file through which ``tau scale`` (and ``tau up --scale`` on a running stack) asks the supervisor for new ones.

The control channel is a desired-state file, ``$TAU_DATA_DIR/scale.json`` = ``{"request": <id>, "replicas":
{service: n}}``, written atomically by the CLI and polled by the supervisor (every loop, by mtime). The
supervisor applies it and echoes ``scale_request`` = the id in ``stack.json``, so the CLI can wait for it. No
bus is needed, so scaling works even when NATS is unhealthy. Validation lives here so the CLI refuses a bad
request (exit 2, naming the service and the valid ones) before anything is written or started, and the
supervisor ignores a hand-edited bad entry with the same message in its log.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from pathlib import Path

SERVICES = ["submitter", "policy", "renderer", "admission_watcher", "recovery", "evidence", "health_monitor",
            "node_agent", "local_cluster", "portal", "run_record", "dispatcher"]  # a new one goes last: metrics
# ports follow it
# Started only when the platform names clusters (stack/sites.py); the local cluster then runs once per site.
SITES_ONLY = {"dispatcher"}
SINGLETONS = {
    "local_cluster": "it owns this machine's pods and GPUs",
    "node_agent": "it samples this machine's GPUs",
}
# Services that run niced (this much above the supervisor): their work follows a run's end (evidence seals
# what ran), so on one machine short of CPU in a burst they wait, not the submission-to-admission path. In
# Kueue's scenario (bench/kueue_scenario.py, fraction 0.3) evidence at full priority took CPU from the stages
# before admission: large runs' mean time to admission was 7.3 s with it, 3.0 s without. Seals catch up after.
# The run record's projection too (issue 30): no stage on the path to admission waits for it (the renderer's
# cancel check takes a record not written yet as no cancel, the admission watcher reads one only on doubt), while
# it folds every event of every run (~2.8 ms of CPU a run). Niced, a 300-run burst admitted 182 / 197 → 242 / 241
# runs/s (bench/pipeline.py, alternating, load 1-2); the cost: in a burst on a machine short of CPU, `tau status`
# and the portal show a run's record that much later (a cancel or a retry waits for it: they read it first).
BACKGROUND = {"evidence", "run_record"}
BACKGROUND_NICENESS = 10
# taugrid.service.say_ready writes a replica's pid there once it consumes; `tau up` waits for every one
READY_FILE_ENV = "TAU_READY_FILE"
MAX_REPLICAS = 32  # one machine: a typo like renderer=200 should not fork two hundred processes
CONTROL_FILE = "scale.json"


class ScaleError(ValueError):
    """A replica request that cannot be applied; the message names the item and the fix."""


def parse_scale(items: list[str] | tuple[str, ...]) -> dict[str, int]:
    """``["renderer=2", "policy=3"]`` → ``{"renderer": 2, "policy": 3}``; ``-`` and ``_`` are the same."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, count = item.partition("=")
        out[check_service(name, item)] = check_count(name.replace("-", "_"), count, item, sep=bool(sep))
    return out


def check_service(name: str, item: str) -> str:
    svc = name.strip().replace("-", "_")
    if svc in SERVICES:
        return svc
    near = difflib.get_close_matches(svc, SERVICES, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ScaleError(
        f"{item!r}: unknown service {name!r}{hint}; services are {', '.join(SERVICES)}"
    )


def check_count(svc: str, count: str, item: str, *, sep: bool = True) -> int:
    if not sep or not count.strip().isdigit():
        raise ScaleError(f"{item!r}: expected SERVICE=N with N a whole number, e.g. {svc}=2")
    n = int(count)
    if svc in SINGLETONS and n != 1:
        raise ScaleError(f"{item!r}: {svc} runs exactly once per machine: {SINGLETONS[svc]}")
    if n < 1:
        raise ScaleError(
            f"{item!r}: at least 1 replica (with none, runs would stop at this stage); `tau down` stops the stack"
        )
    if n > MAX_REPLICAS:
        raise ScaleError(f"{item!r}: at most {MAX_REPLICAS} replicas of a service on one machine")
    return n


def control_path(data_dir: Path) -> Path:
    return data_dir / CONTROL_FILE


def write_request(data_dir: Path, replicas: dict[str, int]) -> int:
    """Ask the supervisor for these replica counts (the services not named keep theirs); returns the id the
    supervisor echoes as ``scale_request`` in ``stack.json`` once applied."""
    request = time.time_ns()
    path = control_path(data_dir)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"request": request, "replicas": replicas}))
    tmp.replace(path)
    return request


def read_request(path: Path) -> tuple[int, dict[str, int], list[str]]:
    """(request id, valid replica counts, problems) from the control file; a missing or garbled file is no
    request (id 0)."""
    try:
        doc = json.loads(path.read_text())
        request = int(doc["request"])
        wanted = dict(doc["replicas"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, {}, []
    valid: dict[str, int] = {}
    problems: list[str] = []
    for name, count in wanted.items():
        try:
            svc = check_service(str(name), f"{name}={count}")
            valid[svc] = check_count(svc, str(count), f"{name}={count}")
        except ScaleError as err:
            problems.append(str(err))
    return request, valid, problems


def ready_file(data_dir: Path, service: str, replica: int) -> Path:
    """Where a replica says it is consuming (holding its current pid; the supervisor names it in the replica's
    ``TAU_READY_FILE``)."""
    return data_dir / "ready" / f"{service}-{replica}"
