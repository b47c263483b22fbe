"""A bus server SIGKILLed during a burst of runs: every run must end exactly once (issue 14 item 5).

For each mode (``--mode ha``: `tau up --ha`, a 3-server JetStream cluster, and the server leading RUNS is killed;
``--mode single``: the default stack, and its only nats-server is killed; ``both`` by default), the embedded
stack runs with simulated pods (``TAU_LOCAL_SIMULATE``), ``--runs`` runs (500) are submitted as fast as one client
can, the server is killed once half of them are submitted, and the bench waits until every run is sealed. Then
every run's stored events must hold exactly one terminal event, ``exec.succeeded`` (a simulated pod succeeds),
and exactly one ``evidence.sealed``, and its record must say ``succeeded``. Exits 1 on any miss (a run lost,
doubled, ended otherwise or not sealed in time), naming the first few.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pipeline import PLATFORM, stack_up  # the same unlimited bench workspace (bench/ is on sys.path)

from taugrid.bus.replay import batches
from taugrid.client import open_client
from taugrid.core.errors import NotFound
from taugrid.core.ids import new_submission_id

RUN = ("name: {name}\nentrypoint: sim.py\ncompute: {{gpus: 0, cpu_request: '1', memory_request: 1Mi}}\n"
       "runtime: {{env: {{SIMULATED_DURATION: '1'}}}}\n")
TERMINAL = ("exec.succeeded", "exec.failed", "recovery.gave_up", "submit.rejected", "policy.rejected",
            "exec.cancelled")


def tau_command() -> list[str]:
    tau_bin = Path(sys.executable).parent / "tau"
    return [str(tau_bin)] if tau_bin.exists() else [sys.executable, "-m", "taugrid.cli.main"]


async def leader_index(url: str) -> int:
    """Which server (0, 1, 2 as `tau up --ha` numbers them) leads RUNS now."""
    client = await open_client(url)
    try:
        info = await client.bus.js.stream_info("RUNS")
    finally:
        await client.close()
    assert info.cluster is not None and info.cluster.leader
    return int(info.cluster.leader.removeprefix("tau-n"))


async def burst(data: Path, runs: int, *, ha: bool, timeout: float) -> dict[str, object]:
    state = json.loads((data / "stack.json").read_text())
    url = state["nats_url"]
    victim = state["nats_pids"][await leader_index(url)] if ha else state["nats_pid"]
    client = await open_client(url, max_reconnect_attempts=-1)
    ids: list[str] = []
    killed_at = 0.0
    started = time.monotonic()
    try:
        for i in range(runs):
            sid = new_submission_id()
            name = f"chaos{i}"
            while True:  # a submit the dying server never acknowledged is sent again with the same id
                try:
                    ids.append(await client.submit_text(RUN.format(name=name), workspace="bench",
                                                        submission_id=sid, name=name))
                    break
                except Exception as exc:  # noqa: BLE001 - the bus is changing leaders; say so and retry
                    print(f"  submit {i} retried: {exc!r}", file=sys.stderr)
                    await asyncio.sleep(0.5)
            if i == runs // 2 and not killed_at:
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
        submitted_s = time.monotonic() - started
        pending, deadline = set(ids), time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for run in sorted(pending):
                try:
                    if (await client.status(run, workspace="bench")).evidence_digest:
                        pending.discard(run)
                except NotFound:
                    pass
            if pending:
                await asyncio.sleep(1.0)
        sealed_s = time.monotonic() - killed_at
        types: dict[str, list[str]] = defaultdict(list)
        async for batch in batches(client.bus, "run.bench.>"):
            for ev in batch:
                types[ev.subject].append(ev.type)
        states = Counter([(await client.status(run, workspace="bench")).state for run in ids])
    finally:
        await client.close()
    wrong = [run for run in ids
             if [t for t in types[run] if t in TERMINAL] != ["exec.succeeded"] or types[run].count(
                 "evidence.sealed") != 1]
    return {"runs": runs, "distinct": len(set(ids)), "submitted_s": submitted_s, "sealed_after_kill_s": sealed_s,
            "never_sealed": sorted(pending), "wrong": [(r, types[r]) for r in wrong], "states": dict(states),
            "victim": victim}


def one_mode(mode: str, runs: int, timeout: float, keep: bool) -> bool:
    data = Path(tempfile.mkdtemp(prefix=f"tau-bench-bus-{mode}-"))
    env = {**os.environ, "TAU_DATA_DIR": str(data), "TAU_LOCAL_SIMULATE": "1"}
    env.pop("TAU_NATS_URL", None)
    tau = tau_command()
    os.environ["TAU_DATA_DIR"] = str(data)  # this process's client finds the stack and its user there
    os.environ.pop("TAU_NATS_URL", None)
    up_args = ("--timeout", "300", *(["--ha"] if mode == "ha" else []))
    with stack_up(data, env, tau, PLATFORM, keep=keep, up_args=up_args):
        result = asyncio.run(burst(data, runs, ha=mode == "ha", timeout=timeout))
        restarted = json.loads((data / "stack.json").read_text())
    pids = restarted["nats_pids"] if mode == "ha" else [restarted["nats_pid"]]
    ok = (not result["never_sealed"] and not result["wrong"] and result["distinct"] == runs
          and result["states"] == {"succeeded": runs} and result["victim"] not in pids)
    what = "the server leading RUNS of 3" if mode == "ha" else "the only nats-server"
    print(f"{mode}: {runs} runs, {what} SIGKILLed after {runs // 2 + 1} submissions; submitted in "
          f"{result['submitted_s']:.1f} s, all sealed {result['sealed_after_kill_s']:.1f} s after the kill; "
          f"states {result['states']} → {'ok' if ok else 'MISS'}")
    for run in list(result["never_sealed"])[:5]:  # type: ignore[call-overload]
        print(f"  never sealed: {run}")
    for run, types in list(result["wrong"])[:5]:  # type: ignore[call-overload]
        print(f"  not exactly one end: {run}: {types}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--mode", choices=["ha", "single", "both"], default="both")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for every run to be sealed")
    ap.add_argument("--keep", action="store_true", help="keep the data directories (service logs)")
    args = ap.parse_args()
    modes = ["ha", "single"] if args.mode == "both" else [args.mode]
    ok = all([one_mode(m, args.runs, args.timeout, args.keep) for m in modes])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
