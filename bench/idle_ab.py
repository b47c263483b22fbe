"""Idle latency of running embedded stacks side by side: batches of idle runs submitted to each stack in turn
(alternating the order every round, so a change of the machine's load falls on both alike), each run as
``bench/pipeline.py`` times its idle runs (submit, wait for its end, 0.3 s pause), and per stack submit →
``admission.admitted`` and submit → ``exec.succeeded`` (p50, p90, p99) with the services' CPU per run.

For a before/after comparison on this shared machine: start one stack per tree (``TAU_DATA_DIR`` of its own,
``TAU_LOCAL_SIMULATE=1``, the tree first on ``PYTHONPATH``) with ``bench/pipeline.py``'s platform applied
(``one_queue_platform("bench")``), then ``idle_ab.py DIR_A DIR_B``. A diagnostic: it checks no target,
but exits 1 when a run did not end within 30 s (its figures would be the wait until the bench gave up)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import msgspec
from pipeline import RUN, cpu_seconds, pct  # bench/ is this script's directory, first on sys.path

from taugrid.client import open_client


class Side:
    """One stack: its clients and what its idle runs took."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.admitted: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.changed = asyncio.Event()
        self.to_admit: list[float] = []
        self.to_succeed: list[float] = []
        self.given_up = 0  # kept runs not ended within 30 s: their figures are the wait until then, not a time
        self.cpu_s = 0.0
        self.client: Any = None
        self.admin: Any = None

    async def open(self) -> None:
        state = msgspec.json.decode((self.data / "stack.json").read_bytes())
        self.client = await open_client(state["nats_url"], creds=state["user_creds"])
        self.admin = await open_client(state["nats_url"], creds=self.data / "creds" / "bootstrap.nk")

        async def on_admitted(msg: Any) -> None:
            self.admitted.setdefault(msg.subject.split(".")[2], time.time())

        async def on_end(msg: Any) -> None:
            self.ended.setdefault(msg.subject.split(".")[2], time.time())
            self.changed.set()

        await self.admin.bus.nc.subscribe("run.*.*.admission.admitted", cb=on_admitted)
        await self.admin.bus.nc.subscribe("run.*.*.exec.succeeded", cb=on_end)

    async def batch(self, runs: int, *, keep: bool = True) -> None:
        before = cpu_seconds(self.data)
        for _ in range(runs):
            t0 = time.time()
            run_id = await self.client.submit_text(RUN.format(name="idle"), workspace="bench", name="idle")
            deadline = t0 + 30
            while run_id not in self.ended and time.time() < deadline:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout=1.0)
            if keep:  # a run that never got there counts until the bench gave up on it, and is counted
                self.given_up += run_id not in self.ended
                self.to_admit.append(1000 * (self.admitted.get(run_id, time.time()) - t0))
                self.to_succeed.append(1000 * (self.ended.get(run_id, time.time()) - t0))
            await asyncio.sleep(0.3)
        after = cpu_seconds(self.data)
        if keep:
            self.cpu_s += sum(after[k] - before[k] for k in after if k in before and k != "nats-server")

    async def close(self) -> None:
        await self.client.close()
        await self.admin.close()


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dirs", nargs="+", type=Path, help="the data directories of running stacks")
    ap.add_argument("--runs", type=int, default=10, help="idle runs a batch")
    ap.add_argument("--rounds", type=int, default=4, help="batches per stack, alternating")
    args = ap.parse_args()
    sides = [Side(d) for d in args.data_dirs]
    for side in sides:
        await side.open()
        await side.batch(2, keep=False)  # warm-up: the services' first run of each kind
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            await side.batch(args.runs)
    given_up = 0
    for side in sides:
        a, s = side.to_admit, side.to_succeed
        given_up += side.given_up
        print(f"{side.data}: {len(a)} idle runs ({side.given_up} not ended in 30 s); "
              f"submit → admitted p50 {pct(a, 50):.1f}  p90 {pct(a, 90):.1f}  "
              f"p99 {pct(a, 99):.1f} ms; → succeeded (50 ms pod) p50 {pct(s, 50):.1f}  p99 {pct(s, 99):.1f} ms; "
              f"services' CPU {1000 * side.cpu_s / max(1, len(a)):.1f} ms a run")
        await side.close()
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 1 if given_up else 0  # a percentile over runs that never ended would read as a time


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
