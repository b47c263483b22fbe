"""SIGKILL of any single service while 50 runs are in flight: the supervisor restarts it, and every run reaches
exactly one terminal state, sealed once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from taugrid.core.events import TERMINAL_EVENTS
from tests.e2e.conftest import Stack, write_project

KILL_ORDER = ["submitter", "policy", "renderer", "admission_watcher", "recovery", "evidence", "local_cluster"]


def test_sigkill_each_service_mid_flight_every_run_ends_exactly_once(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "chaos", (
        "import os, sys, time\n"
        "time.sleep(1.5)\n"
        "sys.exit(0 if int(os.environ['TAU_RUN_ID'][-1], 16) % 4 else 1)\n"  # a quarter fail (and give up)
    ), "name: chaos\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    runs = [stack.tau("run", str(cfg), check=True).stdout.strip() for _ in range(50)]
    killed: dict[str, int] = {}
    for svc in KILL_ORDER:
        entry = next(s for s in stack.state()["services"] if s["service"] == svc and s["pid"])
        os.kill(entry["pid"], signal.SIGKILL)
        killed[svc] = entry["pid"]
        time.sleep(0.7)
    deadline = time.time() + 240
    pending = set(runs)
    while pending and time.time() < deadline:
        for r in list(pending):
            evs = stack.events(r)
            if any(e["short_type"] == "evidence.sealed" for e in evs):
                pending.discard(r)
        time.sleep(1)
    assert not pending, f"{len(pending)} run(s) never finished: {sorted(pending)[:5]}"
    for r in runs:
        types = [e["short_type"] for e in stack.events(r)]
        terminal = [t for t in types if t in TERMINAL_EVENTS]
        assert len(terminal) == 1, (r, types)
        assert types.count("evidence.sealed") == 1, (r, types)
        assert stack.json("status", r)["state"] in ("succeeded", "failed")
    restarted = {s["service"]: s["pid"] for s in stack.state()["services"] if s["replica"] == 0}
    for svc, old in killed.items():
        assert restarted[svc] and restarted[svc] != old, f"{svc} was not restarted"
