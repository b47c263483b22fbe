"""Kueue's large-scale scheduler-performance scenario, replayed through the whole taugrid pipeline (issue 27).

The configuration is Kueue's ``test/performance/scheduler/configs/large-scale/generator.yaml`` and its limits
``configs/large-scale/rangespec.yaml`` (kubernetes-sigs/kueue at ff69552e79ad21652c36caa97038382e55625cf7):
10 cohorts x 100 ClusterQueues = 1,000, each nominalQuota 20, borrowingLimit 100, reclaimWithinCohort Any,
withinClusterQueue LowerPriority; per ClusterQueue 35 small (request 1, 150 ms, priority 50, one every 60 ms),
11 medium (5, 350 ms, priority 100, every 300 ms) and 4 large (20, 700 ms, priority 200, every 700 ms) =
50,000 workloads. Kueue's limits (calibrated from 19 periodic runs, mean x 1.2 / mean - 7 %): wall ≤ 1,416 s,
average ClusterQueue usage ≥ 31.6 %, mean time to admission large ≤ 128 s, medium ≤ 308 s, small ≤ 841 s.
(Kueue's generator waits one interval before each creation, the first included; here, as in
``kueue_scenario.py``, the first of each class is submitted at the start: a shift of under 0.7 s, and times to
admission count from each run's actual submission either way.)

It runs on ``kueue_scenario.py``'s machinery (the same platform shape, submissions, measurement and report):
the embedded stack (nats-server, every service its own process) with the local cluster's simulated pods, the
runs submitted through the client at Kueue's cadence, each class of each queue on its own clock; usage from the
runs' own events (units held from admission to end over the 1,000 queues' nominal quota and the wall), mean
time to admission per class and the wall by the cluster's clock (each event's ``ce-time``). Every run started is
counted: one never admitted counts with its wait until the bench gave up, one unfinished makes the wall the
time it gave up, one that ended other than ``exec.succeeded`` is a miss, two submissions given one run id a
lost run.

Before the clock starts, one warm-up run is submitted and waited for to its end: every service reads and parses
the platform on its first run, and a platform of 1,000 ClusterQueues takes seconds to parse (about 2.4 s of CPU
and 44 MB of resident memory in a fresh process, pure-Python PyYAML), which Kueue's runner pays before it starts
too (its ClusterQueues exist before the first Workload). The bench keeps at most ``--in-flight`` submissions
awaiting the server's ack (200; Kueue's runner creates its Workloads through a rate-limited client): with all
1,000 queues' first runs due at once, thousands of unbounded publishes time out in the bench's own client while
it signs and sends the others. A publish not acknowledged in 10 s is sent again under the same submission id
(the server keeps one). Each run's wait counts from when it was sent, as Kueue's from its Workload's creation;
how far the sending fell behind Kueue's cadence is printed. CPU per run is counted from the clock's start.

After the last run ends the bench waits (up to ``--settle`` seconds) for every run's evidence to be sealed, then
prints what the bus stores, per stream, KV bucket (``KV_<bucket>``) and object store (``OBJ_<store>``): bytes
and messages gained over the scenario, in all and per run (JetStream account info, as ``storage.py`` reads
it), and every process's resident memory, nats-server's beside the services'. Exits 1 when a run was lost,
never admitted or did not succeed, a service is above 80 MB after the scenario (issue 27's target; nats-server
is not a service), or, at the full configuration, one of Kueue's limits is missed.

``--fraction 0.02`` shrinks each class's total (not the cadence, not the 1,000 queues) to 2 %, spread evenly
over the queues (1,000 runs: 700 small, 220 medium, 80 large) for a quick look; Kueue's limits are printed but
judged only at ``--fraction 1``, since a fraction of the runs cannot fill the quota Kueue's usage is measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from kueue_scenario import Shape, drive, platform_yaml, report  # bench/ is this script's directory, first on sys.path
from pipeline import cpu_seconds, rss, simulated_stack, stack_up
from storage import Store, gained, stores

from taugrid.bus.envelope import run_of
from taugrid.client import open_client

LARGE = Shape(
    "Kueue large-scale scenario", cohorts=10, cqs=100,
    classes={  # name: (count per CQ, units, seconds, priority class, interval)
        "small": (35, 1, 0.15, "p50", 0.06),
        "medium": (11, 5, 0.35, "p100", 0.3),
        "large": (4, 20, 0.7, "p200", 0.7),
    },
    limits={"wall_s": 1416.0, "usage_pct": 31.6, "large": 128.0, "medium": 308.0, "small": 841.0},
    spread=True,
)


async def scenario(url: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The scenario (``kueue_scenario.drive``) with the bus's stores read before it and once every run is sealed."""
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    sealed: set[str] = set()

    async def on_sealed(msg: Any) -> None:
        sealed.add(run_of(msg))

    await admin.bus.nc.subscribe("run.*.*.evidence.sealed", cb=on_sealed)
    before = await stores(admin.bus.nc)
    user_creds = msgspec.json.decode((data / "stack.json").read_bytes())["user_creds"]
    cpu_before: dict[str, float] = {}
    result = await drive(url, args.fraction, creds=data / "creds" / "bootstrap.nk", user_creds=user_creds,
                         stages=args.stages, timeout=args.timeout, shape=LARGE, warmup=True,
                         in_flight=args.in_flight, on_start=lambda: cpu_before.update(cpu_seconds(data)))
    cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_seconds(data).items()}
    memory_at_end = rss(data)
    ids: list[str] = result["run_ids"]  # type: ignore[assignment]
    t0 = time.time()
    # Seals follow a run's end (the evidence service runs niced and lags in a burst): what the bus stores per run
    # is read once every run is sealed, or when the bench gave up waiting.
    while not all(r in sealed for r in ids) and time.time() - t0 < args.settle:
        await asyncio.sleep(1.0)
    settle_s = time.time() - t0
    await asyncio.sleep(2.0)  # projections and the last acks settle
    after = await stores(admin.bus.nc)
    await admin.close()
    return {"result": result, "cpu": cpu, "memory_at_end": memory_at_end, "memory": rss(data), "before": before,
            "after": after, "sealed": sum(1 for r in ids if r in sealed), "settle_s": settle_s}


def print_storage(before: dict[str, Store], after: dict[str, Store], runs: int) -> None:
    n = max(1, runs)
    print(f"\nbus storage gained over the scenario (JetStream account info; {runs} runs)")
    print(f"  {'store':<22}{'kind':<8}{'MB':>10}{'B/run':>10}{'msgs/run':>10}{'subjects/run':>14}")
    total = logs = 0.0
    for s, nbytes, messages, subjects in gained(before, after):
        total += nbytes
        logs += nbytes if s.logs else 0
        print(f"  {s.name:<22}{s.kind:<8}{nbytes / 2**20:10.1f}{nbytes / n:10.0f}{messages / n:10.2f}"
              f"{subjects / n:14.2f}" + ("   (logs)" if s.logs else ""))
    print(f"  {'all stores':<30}{total / 2**20:10.1f} MB, {total / n:.0f} B/run ({logs / n:.0f} of it LOGS)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, default=1.0, help="share of each class's runs (rates and the "
                    "1,000 queues unchanged); Kueue's limits are judged only at 1")
    ap.add_argument("--scale", action="append", default=[], help="SERVICE=N replicas (repeatable)")
    ap.add_argument("--stages", action="store_true", help="print how many runs passed each stage, every second, "
                    "and at the end the mean time from submission to each stage per class")
    ap.add_argument("--in-flight", type=int, default=200, help="submissions awaiting the server's ack at most "
                    "(a client's rate limit; 0: no bound)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds to wait for every run to finish")
    ap.add_argument("--settle", type=float, default=900, help="seconds to wait, after the last run ended, for "
                    "every run to be sealed before the bus's stores are read")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs, the bus's store)")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-kueue-large-")
    load_before = os.getloadavg()
    with stack_up(data, env, tau, platform_yaml(LARGE), keep=args.keep,
                  up_args=tuple(a for s in args.scale for a in ("--scale", s))) as url:
        print(f"{LARGE.title} through the full pipeline: {len(LARGE.queues)} ClusterQueues, "
              f"{LARGE.total(args.fraction)} runs (fraction {args.fraction:g}; data dir {data})", flush=True)
        got = asyncio.run(scenario(url, data, args))
    result = got["result"]
    judged = args.fraction >= 1.0
    ok = report(result, LARGE, got["memory"], got["cpu"], judge_limits=judged)
    runs = int(result["runs"])
    warm_ok = float(result["warmup_s"]) != float("inf")
    ok &= warm_ok
    print(f"(the bench submitted its last run {float(result['submit_s']):.1f} s after its first, Kueue's cadence "
          f"puts every submission within 3.3 s; {result['retries']} submissions sent again after a publish not "
          "acknowledged in 10 s; the warm-up run before the clock, while every service parsed the platform, "
          + (f"took {float(result['warmup_s']):.1f} s)" if warm_ok else "did NOT succeed: MISSED)"))
    print("resident memory per process (MB): when the last run ended → once every run was sealed")
    for name, mb in sorted(got["memory"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<28}{got['memory_at_end'].get(name, float('nan')):8.1f} → {mb:8.1f}")
    seals_ok = got["sealed"] == runs
    ok &= seals_ok
    print(f"runs sealed                 {got['sealed']}/{runs}{'' if seals_ok else '  MISSED'}"
          f"  ({got['settle_s']:.0f} s after the last run ended)")
    print_storage(got["before"], got["after"], runs)
    if not judged:
        print(f"(fraction {args.fraction:g}: Kueue's limits printed, not judged; they are for the full 50,000 runs)")
    print(f"load average: {', '.join(f'{x:.1f}' for x in load_before)} before, "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} after, on {os.cpu_count()} cores")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
