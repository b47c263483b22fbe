"""Where an idle run's time goes: submit N runs one at a time on a running stack (``TAU_DATA_DIR`` or the default
data dir) and print, for each, when every message about it was stored (RUNS, BACKEND, K8S) relative to the
submit, and the median of each over the runs, after the submit and after the message before it (the stage that
made it, its wait for the CPU included). A diagnostic for the idle figures of ``bench/pipeline.py``; it changes
nothing."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import time

import msgspec
from watch_counts import holding_backend, holding_k8s  # bench/ is this script's directory, first on sys.path

from taugrid import settings
from taugrid.bus import replay
from taugrid.client import open_client

RUN = ("name: trace\nentrypoint: sim.py\ncompute: {gpus: 0, cpu_request: '1', memory_request: 1Mi}\n"
       "runtime: {env: {SIMULATED_DURATION: '0.05'}}\n")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workspace", default="bench")
    args = ap.parse_args()
    data = settings.data_dir()
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    client = await open_client(state["nats_url"], creds=state["user_creds"])
    admin = await open_client(state["nats_url"], creds=data / "creds" / "bootstrap.nk")
    hops: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}  # each message's time since the run's message before it
    # K8S and BACKEND keep a message only until its readers acked it: held for the replay below
    # a warm-up run, not traced: the client's first submit imports and reads what the later ones have in hand
    await client.submit_text(RUN, workspace=args.workspace, name="trace")
    await asyncio.sleep(1.5)
    async with holding_k8s(admin.bus.js), holding_backend(admin.bus.js):
        for _ in range(args.runs):
            t0 = time.time()
            since = dt.datetime.fromtimestamp(t0 - 1, tz=dt.UTC)
            run_id = await client.submit_text(RUN, workspace=args.workspace, name="trace")
            await asyncio.sleep(1.5)
            rows: list[tuple[float, str]] = []
            async for got in replay.batches(admin.bus, f"run.*.{run_id}.>"):
                rows += [(ev.stored, ev.type) for ev in got]
            async for got in replay.batches(admin.bus, "backend.>", stream="BACKEND", since=since):
                rows += [(ev.stored, f"backend {ev.nats_subject}") for ev in got if ev.subject == run_id
                         or run_id.encode() in ev.data[:4000]]
            async for got in replay.batches(admin.bus, "k8s.local.>", stream="K8S", since=since):
                parts = [ev.nats_subject.split(".") for ev in got]
                rows += [(ev.stored, f"k8s {p[2]}.{p[-1]}") for ev, p in zip(got, parts, strict=True)
                         if p[4].startswith(run_id)]
            rows.sort()
            print(run_id)
            prev = t0
            for at, what in rows:
                print(f"  {1000 * (at - t0):8.1f} ms  +{1000 * (at - prev):6.1f}  {what}")
                hops.setdefault(what, []).append(1000 * (at - t0))
                steps.setdefault(what, []).append(1000 * (at - prev))
                prev = at
    print("median ms after submit, and since the message before it (the stage that made it, with its wait):")
    for what, v in sorted(hops.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(v):8.1f}  +{statistics.median(steps[what]):6.1f}  max {max(v):8.1f}  "
              f"n={len(v):3d}  {what}")
    await client.close()
    await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
