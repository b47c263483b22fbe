"""CPU per run, per service: submit a burst of N runs on a running stack (``TAU_DATA_DIR`` or the default data
dir, workspace ``bench`` as ``bench/pipeline.py`` sets it up), wait until they end and are sealed (the evidence
service runs niced and seals after a run's end: counted before its seals, its figure would swing with how far
behind it was), and print each process's CPU time divided by N, and their sum. A diagnostic (which service a
burst waits on); it asserts nothing."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import msgspec
import psutil

from taugrid import settings
from taugrid.bus.envelope import run_of
from taugrid.client import open_client

RUN = ("name: cpu\nentrypoint: sim.py\ncompute: {gpus: 0, cpu_request: '1', memory_request: 1Mi}\n"
       "runtime: {env: {SIMULATED_DURATION: '0.05'}}\n")


def cpu(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    data = settings.data_dir()
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    procs = {s["service"]: psutil.Process(s["pid"]) for s in state["services"] if s.get("pid")}
    procs["nats-server"] = psutil.Process(state["nats_pid"])
    client = await open_client(state["nats_url"], creds=state["user_creds"])
    admin = await open_client(state["nats_url"], creds=data / "creds" / "bootstrap.nk")
    ended: set[str] = set()
    sealed: set[str] = set()

    async def on_end(msg: object) -> None:
        ended.add(run_of(msg))

    async def on_sealed(msg: object) -> None:
        sealed.add(run_of(msg))

    await admin.bus.nc.subscribe("run.bench.*.exec.succeeded", cb=on_end)
    await admin.bus.nc.subscribe("run.bench.*.evidence.sealed", cb=on_sealed)
    before, t0 = cpu(procs), time.time()
    runs = await asyncio.gather(*(client.submit_text(RUN, workspace="bench", name="cpu") for _ in range(args.runs)))
    while not set(runs) <= ended and time.time() - t0 < 600:
        await asyncio.sleep(0.2)
    wall = time.time() - t0
    while not set(runs) <= sealed and time.time() - t0 < 600:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    after = cpu(procs)
    total = 1000 * sum(after[k] - before[k] for k in after) / len(runs)
    print(f"{len(set(runs) & ended)}/{len(runs)} ended in {wall:.1f} s, {len(set(runs) & sealed)} sealed after "
          f"{time.time() - t0:.1f} s; load {os.getloadavg()[0]:.1f}; {total:.1f} ms CPU per run in all")
    for k in sorted(after, key=lambda k: before[k] - after[k]):
        print(f"  {k:<20}{1000 * (after[k] - before[k]) / len(runs):7.2f} ms CPU per run")
    await client.close()
    await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
