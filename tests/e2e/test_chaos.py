"""SIGKILL of each service while 50 runs are in flight, and again while it is starting up, and of the only
nats-server mid-burst: the supervisor restarts it, and every run reaches exactly the terminal state its script
decides (a quarter exit 1 and fail, the rest succeed), once, sealed once. (The 500-run burst: bench/bus_chaos.py.)

Submitting and watching go through one client process each (`taugrid.client`), not one `tau` process per run:
what is under test is the services' recovery, and 50 CLI start-ups per poll would measure the CLI instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from taugrid.core.events import TERMINAL_EVENTS
from tests.e2e.conftest import Stack, write_project

KILL_ORDER = ["submitter", "policy", "renderer", "admission_watcher", "recovery", "evidence", "local_cluster"]

SUBMIT = """
import asyncio, sys
from pathlib import Path
from taugrid.client import open_client

async def main():
    client = await open_client()
    try:
        for _ in range(int(sys.argv[2])):
            print(await client.submit(Path(sys.argv[1])), flush=True)
    finally:
        await client.close()

asyncio.run(main())
"""

WAIT_SEALED = """
import asyncio, json, sys, time
from taugrid.client import open_client
from taugrid.core.errors import NotFound, TemporaryError

async def main():
    runs, deadline = sys.argv[1].split(","), time.time() + float(sys.argv[2])
    client = await open_client()
    try:
        pending = set(runs)
        while pending and time.time() < deadline:  # the run record carries the sealed digest
            for run in sorted(pending):
                try:
                    if (await client.status(run)).evidence_digest:
                        pending.discard(run)
                except NotFound:  # not projected yet (the submitter may just have been killed)
                    pass
                except TemporaryError:  # the bus is restarting or electing a leader: ask again
                    pass
            await asyncio.sleep(0.5)
        types = {}
        for run in runs:
            types[run] = [e.type async for e in client.events(run_id=run)]
        states = {run: (await client.status(run)).state for run in runs}
    finally:
        await client.close()
    print(json.dumps({"types": types, "states": states, "pending": sorted(pending)}))

asyncio.run(main())
"""


def pid_of(stack: Stack, service: str) -> int:
    return next(s["pid"] for s in stack.state()["services"] if s["service"] == service and s["replica"] == 0)


def respawned(stack: Stack, service: str, old: int, timeout: float = 30) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        pid = pid_of(stack, service)
        if pid and pid != old:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"{service} was not restarted after pid {old} was killed")


# A quarter of the runs exit 1 (and are given up), the rest succeed: which, the run id's last hex digit decides.
DECIDING_SCRIPT = ("import os, sys, time\n"
                   "time.sleep(1.5)\n"
                   "sys.exit(0 if int(os.environ['TAU_RUN_ID'][-1], 16) % 4 else 1)\n")


def submit_runs(stack: Stack, cfg: Path, n: int) -> list[str]:
    submitted = subprocess.run([sys.executable, "-c", SUBMIT, str(cfg), str(n)], env=stack.env,
                               capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr[-3000:]  # why the client gave up, not only its exit status
    runs = submitted.stdout.split()
    assert len(set(runs)) == n
    return runs


def assert_each_run_ends_as_its_script_decides(stack: Stack, runs: list[str], *, within: float = 240) -> None:
    """Sealed within ``within`` seconds, exactly one terminal event (the one the script decides), sealed once."""
    watched = subprocess.run([sys.executable, "-c", WAIT_SEALED, ",".join(runs), str(within)], env=stack.env,
                             capture_output=True, text=True, timeout=within + 60)
    assert watched.returncode == 0, watched.stderr[-3000:]
    result = json.loads(watched.stdout)
    assert result["pending"] == [], f"{len(result['pending'])} run(s) never sealed: " + ", ".join(
        f"{r} ({result['states'][r]}: {result['types'][r]})" for r in result["pending"][:5])
    for run in runs:
        types = result["types"][run]
        assert [t for t in types if t in TERMINAL_EVENTS] == [
            "exec.succeeded" if expected_state(run) == "succeeded" else "recovery.gave_up"], (run, types)
        assert types.count("evidence.sealed") == 1, (run, types)
    assert result["states"] == {run: expected_state(run) for run in runs}


def expected_state(run_id: str) -> str:
    return "succeeded" if int(run_id[-1], 16) % 4 else "failed"  # what the script below decides


def test_sigkill_each_service_mid_flight_and_at_start_up_every_run_ends_as_its_script_decides(
        stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "chaos", DECIDING_SCRIPT, "name: chaos\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    runs = submit_runs(stack, cfg, 50)
    for svc in KILL_ORDER:
        first = pid_of(stack, svc)
        os.kill(first, signal.SIGKILL)  # mid-flight
        second = respawned(stack, svc, first)
        os.kill(second, signal.SIGKILL)  # while it starts up (its imports alone take longer than this)
        respawned(stack, svc, second)
        time.sleep(0.3)
    assert_each_run_ends_as_its_script_decides(stack, runs)


def test_sigkill_of_the_only_nats_server_mid_burst_every_run_ends_once(stack: Stack, tmp_path: Path) -> None:
    """The default stack has one nats-server; the supervisor restarts it on the same port and store. Runs in
    flight when it dies reach exactly one terminal state, the one their script decides, sealed once; and the stack
    the later tests share still moves: runs submitted after it end too. (Before the local cluster tried a pod start
    again when the bus had not recorded it, a run whose pod was being started at the kill stayed `admitted`.)"""
    cfg = write_project(tmp_path, "busloss", DECIDING_SCRIPT,
                        "name: busloss\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    runs = submit_runs(stack, cfg, 30)
    time.sleep(2)  # the first pods are being prepared and started, the last runs are still being admitted
    os.kill(stack.state()["nats_pid"], signal.SIGKILL)
    assert_each_run_ends_as_its_script_decides(stack, runs)
    assert_each_run_ends_as_its_script_decides(stack, submit_runs(stack, cfg, 3), within=120)
