"""Kueue's TAS scheduler-performance shape (``kueue_tas_shape``) replayed through the admission engine alone, in
simulated time: no bus, no services. Measures the engine's cycle time with the 640-node topology (what the local
cluster pays per admission cycle) and checks every admission's topology assignment against its request.

Arrivals follow Kueue's cadence; a workload finishes its runtime after admission; between events the engine runs
cycles until it is quiescent (the local cluster also runs cycles back to back while heads are admissible). The
time to admission printed is simulated time, so it shows the policy's outcome without the pipeline's costs; the
engine's own CPU time (process time, steadier than the wall clock on a loaded machine) is the figure this bench is
for, with the heads examined and how many of them were nominated (the rest settled by the engine's memo). A digest
of every decision in order (admissions with their domains, preemptions) is printed too: two versions of the
engine that print the same digest decided alike. ``--profile`` prints where the engine's time goes
(cProfile over ``Engine.cycle`` and ``Engine.finish`` only). Exits 1 on a topology violation, a workload never
admitted, or a class's mean simulated time to admission above Kueue's limit (and, at ``--fraction 1``, a simulated
wall or usage past Kueue's); the engine's CPU per cycle is printed, not judged (``engine_cycle.py`` judges the
engine's cycle time at scale).

Usage: python bench/kueue_tas_engine.py [--fraction 1.0] [--profile] [--one-at-a-time]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import heapq
import pstats
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from kueue_tas_shape import (  # bench/ is this script's directory, first on sys.path
    BLOCK_LABEL,
    BORROWING_LIMIT_CPU,
    CLASSES,
    FLAVOR,
    HOSTNAME_LABEL,
    NODE_CPU,
    NODE_GROUP,
    NODE_MEMORY_GI,
    NOMINAL_CPU,
    RACK_LABEL,
    TOPOLOGY,
    USAGE_LIMIT_PCT,
    WALL_LIMIT_S,
    TasClass,
    count,
    mean,
    nodes,
    queue_names,
)

from taugrid.core import admission as adm

T = TypeVar("T")
POLICY = adm.PreemptionPolicy(within_cluster_queue=adm.WithinClusterQueue.LOWER_PRIORITY,
                              reclaim_within_cohort=adm.ReclaimWithinCohort.ANY)


def engine() -> adm.Engine:
    group = adm.ResourceGroup(("cpu",), (adm.FlavorQuotas(FLAVOR, {"cpu": adm.ResourceQuota(
        float(NOMINAL_CPU), float(BORROWING_LIMIT_CPU))}),))
    cqs = [adm.ClusterQueue(cq, (group,), cohort=cohort, preemption=POLICY) for cohort, cq in queue_names()]
    cohorts = [adm.Cohort(c) for c in sorted({c for c, _ in queue_names()})]
    flavor = adm.ResourceFlavor(FLAVOR, {NODE_GROUP[0]: NODE_GROUP[1]}, topology_name=TOPOLOGY)
    pool = [adm.Node(n.name, cpu=float(NODE_CPU), memory=float(NODE_MEMORY_GI * 2**30),
                     labels={NODE_GROUP[0]: NODE_GROUP[1], BLOCK_LABEL: n.block, RACK_LABEL: n.rack,
                             HOSTNAME_LABEL: n.name}) for n in nodes()]
    topology = adm.Topology(TOPOLOGY, (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL))
    return adm.Engine(cqs, cohorts, [flavor], pool, topologies=[topology])


def request(cls: TasClass) -> adm.TopologyRequest:
    if cls.constraint == "required":
        return adm.TopologyRequest(required=RACK_LABEL)
    if cls.constraint == "preferred":
        return adm.TopologyRequest(preferred=RACK_LABEL)
    return adm.TopologyRequest(slice_required=RACK_LABEL, slice_size=cls.slice_size)


def workload(name: str, cq: str, cls: TasClass, at: float) -> adm.Workload:
    pod_set = adm.PodSet("main", cls.pods, {"cpu": cls.cpu}, topology_request=request(cls))
    return adm.Workload(name, cq, (pod_set,), priority=cls.priority, created_at=at)


RACK_OF = {n.name: n.rack for n in nodes()}


def racks(ta: adm.TopologyAssignment) -> dict[str, int] | None:
    """Pods per rack of an assignment. Kueue keeps only the hostname level in an assignment whose lowest level is
    the hostname (the node's name then says everything); the rack is the node's."""
    if RACK_LABEL in ta.levels:
        at = ta.levels.index(RACK_LABEL)
        rack = [values[at] for values, _ in ta.domains]
    elif HOSTNAME_LABEL in ta.levels:
        at = ta.levels.index(HOSTNAME_LABEL)
        rack = [RACK_OF.get(values[at], "?") for values, _ in ta.domains]
    else:
        return None
    out: dict[str, int] = {}
    for r, (_, n) in zip(rack, ta.domains, strict=True):
        out[r] = out.get(r, 0) + n
    return out


def violations(cls: TasClass, a: adm.Admission) -> list[str]:
    """What in one admission breaks its class's request: no assignment, a wrong pod count, or pods (or a slice's
    pods) in more than one rack where one is required."""
    ta = a.topology_assignments.get("main")
    if ta is None:
        return ["no topology assignment"]
    per_rack = racks(ta)
    if per_rack is None:
        return [f"assignment levels {ta.levels} name neither the rack nor the host"]
    out = []
    if sum(per_rack.values()) != cls.pods:
        out.append(f"{sum(per_rack.values())} pods assigned of {cls.pods}")
    if cls.constraint == "required" and len(per_rack) > 1:
        out.append(f"required rack, pods in {len(per_rack)} racks")
    if cls.constraint == "balanced" and any(n % cls.slice_size for n in per_rack.values()):
        out.append(f"slices of {cls.slice_size} split across racks: {per_rack}")
    return out


def replay(fraction: float, profiler: cProfile.Profile | None, *, one_at_a_time: bool = False) -> bool:
    eng = engine()
    events: list[tuple[float, int, str, tuple[str, str]]] = []  # (time, seq, kind, (name, cq or generation))
    seq = 0
    classes: dict[str, TasClass] = {}
    created: dict[str, float] = {}
    for _, cq in queue_names():
        for cls in CLASSES:
            for i in range(count(cls, fraction)):
                seq += 1
                name = f"{cls.name}-{cq}-{i}"
                classes[name] = cls
                events.append(((i + 1) * cls.every, seq, "submit", (name, cq)))
    heapq.heapify(events)
    running: dict[str, int] = {}  # name → admission generation (a preempted run's old completion is ignored)
    admitted_at: dict[str, float] = {}
    held = 0.0  # cpu-seconds admitted
    since: dict[str, float] = {}
    bad: dict[str, int] = {}
    examples: list[str] = []
    spread = 0  # preferred workloads given more than one rack
    busy, cycles, worst, admissions, preemptions, now, gen, heads = 0.0, 0, 0.0, 0, 0, 0.0, 0, 0
    # Every decision in order (simulated time, admission with its domains, preemption with its preemptor): two
    # engines that decide alike print the same digest, however many heads each examined to get there.
    decisions = hashlib.sha256()

    def timed(call: Callable[..., T], *args: object) -> T:
        nonlocal busy
        t0 = time.process_time()
        out = profiler.runcall(call, *args) if profiler else call(*args)
        busy += time.process_time() - t0
        return out

    while True:
        if eng.quiescent():  # nothing to try now: on to the next arrival, end or return from backoff
            later = [t for t in (events[0][0] if events else None, eng.next_requeue()) if t is not None]
            if not later:
                break
            now = max(now, min(later))
        while events and events[0][0] <= now:
            _, _, kind, (name, extra) = heapq.heappop(events)
            if kind == "submit":
                created[name] = now
                eng.submit(workload(name, extra, classes[name], now), now)
            elif running.get(name) == int(extra):
                del running[name]
                held += classes[name].units * (now - since.pop(name))
                timed(eng.finish, name, now)
            if one_at_a_time:  # as the local cluster sees them: each apply or end, then cycles to quiescence
                break
        t0 = time.process_time()
        res = timed(eng.cycle, now)
        worst = max(worst, time.process_time() - t0)
        cycles += 1
        heads += res.heads
        if cycles % 500 == 0:  # a long replay says how far it is
            print(f"  ... simulated t={now:.1f} s: {admissions} admissions, {heads} heads, engine CPU {busy:.1f} s",
                  flush=True)
        preemptions += len(res.preempted)
        for p in res.preempted:
            decisions.update(f"{now}|preempt|{p.victim}|{p.preemptor}|{p.reason}\n".encode())
            if p.victim in running:
                del running[p.victim]
                held += classes[p.victim].units * (now - since.pop(p.victim))
        for a in res.admitted:
            admissions += 1
            decisions.update(f"{now}|admit|{a.workload}|{sorted(a.topology_assignments.items())}\n".encode())
            cls = classes[a.workload]
            for v in violations(cls, a):
                bad[cls.name] = bad.get(cls.name, 0) + 1
                if len(examples) < 5:
                    examples.append(f"{a.workload}: {v}")
            ta = a.topology_assignments.get("main")
            if cls.constraint == "preferred" and ta is not None and len(racks(ta) or {}) > 1:
                spread += 1
            admitted_at.setdefault(a.workload, now)
            gen += 1
            running[a.workload] = gen
            since[a.workload] = now
            seq += 1
            heapq.heappush(events, (now + cls.seconds, seq, "finish", (a.workload, str(gen))))
    wall = now
    total = len(classes)
    print(f"Kueue TAS shape through the engine alone, fraction {fraction:g}: {total} workloads, 640 nodes; "
          f"simulated wall {wall:.1f} s")
    print(f"  engine CPU (process time) {busy:.2f} s over {cycles} cycles: {1e3 * busy / max(cycles, 1):.2f} ms/cycle "
          f"on average, "
          f"worst {1e3 * worst:.1f} ms; {admissions} admissions ({admissions / max(busy, 1e-9):,.0f}/s of engine "
          f"time), {preemptions} preemptions; {heads} heads examined ({heads / max(admissions, 1):.1f} per "
          f"admission, {1e3 * busy / max(heads, 1):.2f} ms each), {eng.nominations} of them nominated (the rest "
          f"settled by a memo)")
    usage = 100 * held / (NOMINAL_CPU * len(queue_names())) / max(wall, 1e-9)
    # The simulated figures are the policy's outcome alone (no machine in them), so Kueue's limits are judged on
    # them: the time to admission per class at any fraction (fewer runs wait no longer), the wall and the usage
    # only at the full counts (a fraction of the runs cannot keep the quota full).
    judged = fraction >= 1.0
    missed = [] if not judged or wall <= WALL_LIMIT_S else [f"simulated wall {wall:.1f} s > {WALL_LIMIT_S:g} s"]
    if judged and usage < USAGE_LIMIT_PCT:
        missed.append(f"usage {usage:.1f} % < {USAGE_LIMIT_PCT:g} %")
    print(f"  usage {usage:.1f} % of nominal over the simulated wall (Kueue's limits: wall <= {WALL_LIMIT_S:g} s, "
          f"usage >= {USAGE_LIMIT_PCT:g} %, {'judged' if judged else 'judged only at --fraction 1'}); "
          f"{len(admitted_at)}/{total} admitted")
    for cls in CLASSES:
        waits = [admitted_at.get(n, wall) - created[n] for n, c in classes.items() if c is cls]
        met = mean(waits) <= cls.limit_s
        if not met:
            missed.append(f"{cls.name} mean time to admission {mean(waits):.2f} s > {cls.limit_s:g} s")
        print(f"  {cls.name:<24} mean simulated time to admission {mean(waits):8.2f} s  (Kueue's limit "
              f"{cls.limit_s:g} s: {'ok' if met else 'MISSED'})")
    print(f"  topology violations: {sum(bad.values())} {bad or ''}; preferred spread over racks: {spread}")
    print(f"  decisions digest {decisions.hexdigest()[:16]} (admissions and preemptions in order, with domains)")
    for e in examples:
        print(f"    {e}")
    if len(admitted_at) != total:
        missed.append(f"{total - len(admitted_at)} workloads never admitted")
    if missed:
        print("MISSED: " + "; ".join(missed))
    return not bad and not missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, default=1.0, help="share of Kueue's workload counts (cadence kept)")
    ap.add_argument("--profile", action="store_true", help="print the engine's 25 costliest functions")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="cycle to quiescence after each arrival and each end, as the local cluster sees them "
                         "(by default, events of one instant are taken together)")
    args = ap.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    ok = replay(args.fraction, profiler, one_at_a_time=args.one_at_a_time)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
