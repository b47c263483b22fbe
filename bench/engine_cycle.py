"""Time the admission engine alone (no bus, no clock): one cycle over 10k pending, then cycles to quiescence,
plus a simulated-time replay of Kueue's baseline shape (5 cohorts x 6 ClusterQueues, 15,000 workloads).

Usage: python bench/engine_cycle.py [--cqs 100] [--cohorts 10] [--pending 10000] [--kueue-baseline]
"""

from __future__ import annotations

import argparse
import heapq
import time

from taugrid.core.admission import (
    ClusterQueue,
    Engine,
    FlavorQuotas,
    PodSet,
    PreemptionPolicy,
    ReclaimWithinCohort,
    ResourceGroup,
    ResourceQuota,
    WithinClusterQueue,
    Workload,
)

POLICY = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY,
                          reclaim_within_cohort=ReclaimWithinCohort.ANY)
CLASSES = [("small", 1, 50, 0.2), ("medium", 5, 100, 0.5), ("large", 20, 200, 1.0)]  # name, cpu, prio, runtime


def make_cqs(n_cqs: int, n_cohorts: int) -> list[ClusterQueue]:
    group = ResourceGroup(("cpu",), (FlavorQuotas("default", {"cpu": ResourceQuota(20, 100)}),))
    return [ClusterQueue(f"cq{i}", (group,), cohort=f"cohort{i % n_cohorts}", preemption=POLICY)
            for i in range(n_cqs)]


def workload(i: int, cq: str, cls: int, t: float) -> Workload:
    name, cpu, prio, _ = CLASSES[cls]
    return Workload(f"{name}-{i}", cq, (PodSet("main", 1, {"cpu": cpu}),), priority=prio, created_at=t)


def bench_pending(n_cqs: int, n_cohorts: int, n_pending: int) -> None:
    engine = Engine(make_cqs(n_cqs, n_cohorts))
    t0 = time.perf_counter()
    for i in range(n_pending):
        engine.submit(workload(i, f"cq{i % n_cqs}", i % 3, float(i)), 0.0)
    t_submit = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = engine.cycle(0.0)
    t_first = time.perf_counter() - t0
    cycles, admitted, preempted = 1, len(first.admitted), len(first.preempted)
    t0 = time.perf_counter()
    while not engine.quiescent():
        res = engine.cycle(0.0)
        cycles += 1
        admitted += len(res.admitted)
        preempted += len(res.preempted)
    t_rest = time.perf_counter() - t0
    total = t_first + t_rest
    print(f"[pending] {n_cqs} CQs in {n_cohorts} cohorts, {n_pending} pending")
    print(f"  submit:        {t_submit * 1e3:8.1f} ms ({n_pending / t_submit:,.0f} submits/s)")
    print(f"  first cycle:   {t_first * 1e3:8.2f} ms ({len(first.admitted)} admitted, {first.heads} heads, "
          f"{len(first.admitted) / t_first:,.0f} admissions/s)")
    print(f"  to quiescence: {cycles} cycles, {total * 1e3:8.1f} ms total, {total / cycles * 1e3:.3f} ms/cycle, "
          f"{admitted} admitted ({admitted / total:,.0f}/s), {preempted} preempted")


def bench_kueue_baseline(n_cohorts: int = 5, per_cohort: int = 6) -> None:
    """Kueue's baseline generator shape replayed in simulated time; counts engine wall time only."""
    n_cqs = n_cohorts * per_cohort
    engine = Engine(make_cqs(n_cqs, n_cohorts))
    # (time, seq, kind, payload): arrivals per class on Kueue's cadence, completions after runtime.
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    for c in range(n_cqs):
        for cls, (count, every) in enumerate([(350, 0.1), (100, 0.5), (50, 1.2)]):
            for k in range(count):
                seq += 1
                events.append((k * every, seq, "submit", (c, cls, seq)))
    heapq.heapify(events)
    busy = 0.0
    cycles = admitted = preempted = 0
    finished = 0
    now = 0.0
    running: dict[str, int] = {}  # name -> generation, so a completion for a preempted run is ignored
    gen = 0
    while events or not engine.quiescent():
        if events:
            now = max(now, events[0][0])
        t0 = time.perf_counter()
        while events and events[0][0] <= now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == "submit":
                c, cls, i = payload  # type: ignore[misc]
                engine.submit(workload(i, f"cq{c}", cls, now), now)
            else:
                name, g = payload  # type: ignore[misc]
                if running.get(name) == g:
                    del running[name]
                    engine.finish(name, now)
                    finished += 1
        res = engine.cycle(now)
        busy += time.perf_counter() - t0
        cycles += 1
        admitted += len(res.admitted)
        preempted += len(res.preempted)
        for p in res.preempted:
            running.pop(p.victim, None)
        for a in res.admitted:
            gen += 1
            running[a.workload] = gen
            runtime = next(r for n, _, _, r in CLASSES if a.workload.startswith(n + "-"))
            seq += 1
            heapq.heappush(events, (now + runtime, seq, "finish", (a.workload, gen)))
        if not res.heads and events:
            continue
        if not res.heads and not events:
            break
    print(f"[kueue-baseline] {n_cohorts} cohorts x {per_cohort} CQs, {seq} events, simulated {now:,.1f} s")
    print(f"  engine time {busy:.2f} s over {cycles} cycles ({busy / cycles * 1e3:.3f} ms/cycle), "
          f"{admitted} admissions ({admitted / busy:,.0f}/s of engine time), {preempted} preemptions, "
          f"{finished} finished")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cqs", type=int, default=100)
    ap.add_argument("--cohorts", type=int, default=10)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--kueue-baseline", action="store_true", help="also replay the 15,000-workload shape")
    args = ap.parse_args()
    bench_pending(args.cqs, args.cohorts, args.pending)
    if args.kueue_baseline:
        bench_kueue_baseline()


if __name__ == "__main__":
    main()
