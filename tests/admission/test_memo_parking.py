"""The engine's memo of inadmissible heads (``Engine(memo=True)``, the default) changes the cost of a cycle, never
its decisions: on random platforms (cohorts, policies, flavors, nodes, topologies, fair sharing) and random
sequences of submits, finishes, evictions, cordons, readiness changes and backoff timers, the engine with the
memo and the reference engine without it (every head nominated) give the same admissions, preemptions,
resizes and head counts in every cycle and the same pending reason, message and position for every workload;
and parking never strands a run: once cycles have nothing left to do, no pending run outside backoff would fit.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taugrid.core.admission import (
    GPU,
    ClusterQueue,
    Engine,
    FlavorQuotas,
    GpuDevice,
    Node,
    PodSet,
    PreemptionPolicy,
    QueueingStrategy,
    ReclaimWithinCohort,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
    TopologyRequest,
    WithinClusterQueue,
    Workload,
)

RACK, HOST = "example.com/rack", "kubernetes.io/hostname"
NODES = [(f"n{i}", f"f{i % 2}", f"r{i // 2 % 2}") for i in range(6)]  # name, flavor pool, rack
SHAPES = [(1, 1, 0), (1, 2, 1), (2, 1, 1), (1, 4, 0), (3, 1, 0), (1, 1, 2)]  # pods, cpu per pod, GPUs per pod


def platform(rng: random.Random, *, strict: bool) -> dict[str, object]:
    nodes = rng.random() < 0.5
    tas = nodes and rng.random() < 0.5
    flavors = [ResourceFlavor(f, {"pool": f}, topology_name="racks" if tas else None) for f in ("f0", "f1")]
    cqs = []
    for i in range(rng.randint(2, 4)):
        cohort = rng.choice(["c0", "c0", "c1", None])

        def quota(top: int, cohort: str | None = cohort) -> ResourceQuota:
            limit = rng.choice([None, 0, 2]) if cohort is not None else None
            return ResourceQuota(rng.randint(0, top), limit)

        fqs = tuple(FlavorQuotas(f, {"cpu": quota(6), GPU: quota(3)})
                    for f in (["f0", "f1"] if rng.random() < 0.5 else [rng.choice(["f0", "f1"])]))
        policy = PreemptionPolicy(rng.choice(list(WithinClusterQueue)), rng.choice(list(ReclaimWithinCohort)))
        strategy = (rng.choice(list(QueueingStrategy)) if strict else QueueingStrategy.BEST_EFFORT_FIFO)
        cqs.append(ClusterQueue(f"cq{i}", (ResourceGroup(("cpu", GPU), fqs),), cohort=cohort,
                                queueing_strategy=strategy, preemption=policy))
    return dict(
        cluster_queues=cqs, flavors=flavors, fair_sharing=rng.random() < 0.3, backoff_base_s=1.0,
        nodes=[Node(n, tuple(GpuDevice(g) for g in range(2)), cpu=4, memory=1e12,
                    labels={"pool": pool, RACK: rack, HOST: n}) for n, pool, rack in NODES] if nodes else None,
        topologies=[Topology("racks", (RACK, HOST))] if tas else ())


def workload(rng: random.Random, i: int, now: float, cqs: int, tas: bool) -> Workload:
    pods, cpu, gpus = rng.choice(SHAPES)
    requests = {"cpu": cpu, GPU: gpus} if gpus else {"cpu": cpu}
    topology = TopologyRequest(required=RACK) if tas and rng.random() < 0.4 else None
    excluded = frozenset({rng.choice(NODES)[0]}) if rng.random() < 0.15 else frozenset()
    return Workload(f"w{i}", f"cq{rng.randrange(cqs)}", (PodSet("main", pods, requests, excluded_nodes=excluded,
                                                                topology_request=topology),),
                    priority=rng.choice([0, 0, 1, 2]), created_at=now + rng.choice([0.0, 0.0, -0.5, 0.5]))


def events(rng: random.Random, engine: Engine, now: float, next_id: int, cqs: int) -> list[tuple[str, object]]:
    """One step of random events, as plain data so both engines get exactly the same."""
    tas = bool(engine.topologies)
    out: list[tuple[str, object]] = []
    # Bursts of one shape, as the memo meets them (many runs of one kind queued at once).
    for k in range(rng.choice([0, 1, 1, 2, 4])):
        out.append(("submit", workload(rng, next_id + k, now, cqs, tas)))
    admitted = sorted(engine.admitted_names())
    rng.shuffle(admitted)
    if admitted and rng.random() < 0.35:
        out.append(("finish", admitted.pop()))
    if admitted and rng.random() < 0.15:
        out.append(("evict", admitted.pop()))
    if engine.cluster is not None and rng.random() < 0.2:
        out.append((rng.choice(["schedulable", "ready"]), (rng.choice(NODES)[0], rng.random() < 0.6)))
    return out


def apply(engine: Engine, ev: tuple[str, object], now: float) -> None:
    kind, arg = ev
    if kind == "submit":
        assert isinstance(arg, Workload)
        engine.submit(arg, now)
    elif kind == "finish":
        engine.finish(str(arg), now)
    elif kind == "evict":
        engine.evict(str(arg), now)
    else:
        assert isinstance(arg, tuple)
        (engine.set_schedulable if kind == "schedulable" else engine.set_ready)(arg[0], arg[1])


def step(rng: random.Random, engines: tuple[Engine, ...], now: float, next_id: int, cqs: int) -> int:
    """One step of random events (drawn from the first engine's state) applied to every engine; the next id."""
    evs = events(rng, engines[0], now, next_id, cqs)
    for ev in evs:
        for engine in engines:
            apply(engine, ev, now)
    return next_id + sum(1 for kind, _ in evs if kind == "submit")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_the_memo_never_changes_a_decision_or_a_pending_message(seed: int) -> None:
    rng = random.Random(seed)
    kw = platform(rng, strict=True)
    fast, ref = Engine(**kw), Engine(**kw, memo=False)  # type: ignore[arg-type]
    assert fast.memo and not ref.memo
    cqs, now, next_id = len(fast.queues), 0.0, 0
    for _ in range(40):
        next_id = step(rng, (fast, ref), now, next_id, cqs)
        a, b = fast.cycle(now), ref.cycle(now)
        assert (a.admitted, a.preempted, a.resized, a.heads, a.violations) == \
            (b.admitted, b.preempted, b.resized, b.heads, b.violations)
        assert fast.pending_all() == ref.pending_all()
        now += rng.choice([0.0, 0.0, 0.5, 1.0, 2.0])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_parking_never_strands_a_run_that_would_fit(seed: int) -> None:
    """BestEffortFIFO queues (StrictFIFO holds later runs back by design): after each step's events, cycles run
    until the engine is quiescent (every head admitted, parked or backing off); then no pending run outside
    backoff would fit the free quota and nodes without preemption. (Found two strands the engine had before
    the memo, both fixed: a head short of node room held for a preemptor until the cycle's end, and a head
    short of node room on its flavor whose next flavor had room once other admissions took its quota.)"""
    rng = random.Random(seed)
    # Preempted runs back off (the clock stands still within a step): two queues that may reclaim from each
    # other can otherwise preempt back and forth for ever, with or without the memo (see docs §16).
    engine = Engine(**platform(rng, strict=False), backoff_preempted=True)  # type: ignore[arg-type]
    cqs, now, next_id = len(engine.queues), 0.0, 0
    for _ in range(30):
        next_id = step(rng, (engine,), now, next_id, cqs)
        for _ in range(200):
            if engine.quiescent():
                break
            engine.cycle(now)
        assert engine.quiescent()
        stranded = [n for n in engine.pending_names()
                    if engine.states[n].requeue_at is None and engine.would_fit(n)]
        assert stranded == []
        now += rng.choice([0.0, 0.5, 1.0, 2.0])


def test_a_parked_run_is_admitted_in_the_cycle_after_quota_frees() -> None:
    """Three same-shape runs wait behind a full queue; the memo settles the fourth and fifth without nominating
    them (the second waiting run's verdict is the first's); the first finish admits the oldest waiting run at
    the next cycle, the next finish the one after."""
    cq = ClusterQueue("cq", (ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(2)}),)),),
                      preemption=PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY))
    engine = Engine([cq], flavors=[ResourceFlavor("f")])
    for i in range(5):
        engine.submit(Workload(f"w{i}", "cq", (PodSet("main", 1, {"cpu": 1}),), created_at=float(i)), 0.0)
    assert [a.workload for a in engine.cycle(0.0).admitted] == ["w0"]
    assert [a.workload for a in engine.cycle(0.0).admitted] == ["w1"]
    for _ in range(3):  # w2, w3, w4 tried in turn: no quota left
        assert engine.cycle(0.0).admitted == []
    memo = engine.queues["cq"].memo
    assert memo is not None and memo.workload.name == "w2"  # w3 and w4 were settled by it
    assert engine.quiescent()
    message = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor f, 1 more needed"
    assert {n: (p.reason, p.message, p.position) for n, p in engine.pending_all().items()} == {
        "w2": ("WaitingForQuota", message, 1), "w3": ("WaitingForQuota", message, 2),
        "w4": ("WaitingForQuota", message, 3)}
    engine.finish("w0", 1.0)
    assert [a.workload for a in engine.cycle(1.0).admitted] == ["w2"]
    engine.finish("w1", 2.0)
    assert [a.workload for a in engine.cycle(2.0).admitted] == ["w3"]
