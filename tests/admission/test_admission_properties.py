"""Property tests: random cohorts, queues, policies, nodes and arrivals; every invariant checked each cycle."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taugrid.core.admission import (
    GPU,
    BorrowWithinCohort,
    BorrowWithinCohortPolicy,
    ClusterQueue,
    Engine,
    FlavorQuotas,
    GpuDevice,
    Node,
    PodSet,
    PreemptionPolicy,
    QueueingStrategy,
    ReclaimWithinCohort,
    ResourceGroup,
    ResourceQuota,
    WithinClusterQueue,
    Workload,
)
from taugrid.core.admission import invariants as inv


@dataclass(frozen=True)
class Arrival:
    workload: Workload
    step: int
    duration: int


@st.composite
def quota(draw: st.DrawFn, in_cohort: bool, top: int) -> ResourceQuota:
    nominal = draw(st.integers(0, top))
    if not in_cohort:
        return ResourceQuota(nominal)
    blimit = draw(st.one_of(st.none(), st.integers(0, top)))
    llimit = draw(st.one_of(st.none(), st.integers(0, nominal)))
    return ResourceQuota(nominal, blimit, llimit)


@st.composite
def cluster_queue(draw: st.DrawFn, name: str, cohorts: int) -> ClusterQueue:
    cohort = draw(st.one_of(st.none(), st.sampled_from([f"c{i}" for i in range(cohorts)])))
    flavors = tuple(
        FlavorQuotas(f, {GPU: draw(quota(cohort is not None, 4)), "cpu": draw(quota(cohort is not None, 8))})
        for f in (["f0", "f1"] if draw(st.booleans()) else ["f0"]))
    bwc = draw(st.sampled_from([BorrowWithinCohort(), BorrowWithinCohort(BorrowWithinCohortPolicy.LOWER_PRIORITY),
                                BorrowWithinCohort(BorrowWithinCohortPolicy.LOWER_PRIORITY, 1)]))
    policy = PreemptionPolicy(draw(st.sampled_from(list(WithinClusterQueue))),
                              draw(st.sampled_from(list(ReclaimWithinCohort))), bwc)
    return ClusterQueue(name, (ResourceGroup((GPU, "cpu"), flavors),), cohort=cohort,
                        queueing_strategy=draw(st.sampled_from(list(QueueingStrategy))), preemption=policy,
                        fair_weight=draw(st.sampled_from([0.5, 1.0, 2.0])))


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[ClusterQueue], list[Node] | None, list[Arrival], bool]:
    cohorts = draw(st.integers(1, 2))
    cqs = [draw(cluster_queue(f"q{i}", cohorts)) for i in range(draw(st.integers(1, 4)))]
    nodes = None
    if draw(st.booleans()):
        nodes = [Node(f"n{i}", tuple(GpuDevice(g) for g in range(draw(st.integers(1, 3)))), cpu=8, memory=1e12)
                 for i in range(draw(st.integers(1, 3)))]
    arrivals = []
    for i in range(draw(st.integers(1, 14))):
        share = nodes is not None and draw(st.booleans())
        gpu = 0 if share else draw(st.integers(0, 3))
        frac = draw(st.sampled_from([0.25, 0.5, 0.75])) if share else 0.0
        ps = PodSet("main", draw(st.integers(1, 3)), {GPU: gpu, "cpu": draw(st.integers(0, 2))}, gpu_fraction=frac)
        step = draw(st.integers(0, 5))
        w = Workload(f"w{i}", draw(st.sampled_from(cqs)).name, (ps,), priority=draw(st.integers(0, 3)),
                     preemptible=draw(st.booleans()), created_at=float(step))
        arrivals.append(Arrival(w, step, draw(st.integers(1, 4))))
    return cqs, nodes, arrivals, draw(st.booleans())


def check_cycle(engine: Engine, cqs: list[ClusterQueue], workloads: dict[str, Workload], now: float,
                with_nodes: bool) -> None:
    strict = [q.name for q in cqs if q.queueing_strategy == QueueingStrategy.STRICT_FIFO]
    before = {q: engine.queue_order(q, now) for q in strict}
    admitted_before = set(engine.admitted_names())
    res = engine.cycle(now)
    assert res.violations == []  # audit: every preemption allowed, ordered, sufficient and minimal
    assert inv.check_quota(cqs, [], {q.name: engine.usage(q.name) for q in cqs}) == []
    assert inv.check_gangs(workloads, res.admitted, with_nodes=with_nodes) == []
    assert inv.check_strict_fifo(before, strict, res.admitted) == []
    placements = [p for n in engine.admitted_names() for p in engine.admission(n).placements]  # type: ignore[union-attr]
    assert inv.check_gpu_fractions(placements) == []
    for p in res.preempted:
        assert workloads[p.victim].preemptible and p.victim in admitted_before
        assert not engine.is_admitted(p.victim)
    if not with_nodes:
        for a in res.admitted:
            assert a.placements == ()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_engine_keeps_every_invariant(case: tuple[list[ClusterQueue], list[Node] | None, list[Arrival], bool]) -> None:
    cqs, nodes, arrivals, fair = case
    # Preempted runs back off: requeued at once (the default), two queues that may reclaim from each other can
    # evict each other's runs cycle after cycle at a standing clock and never reach quiescence (docs §16, the
    # preemption ping-pong; hypothesis finds it here with fair sharing and StrictFIFO queues).
    engine = Engine(cqs, nodes=nodes, fair_sharing=fair, audit=True, backoff_preempted=True)
    workloads = {a.workload.name: a.workload for a in arrivals}
    duration = {a.workload.name: a.duration for a in arrivals}
    for step in range(10):
        for a in arrivals:
            if a.step == step:
                engine.submit(a.workload, step)
        for name in engine.admitted_names():
            if engine.admission(name).admitted_at + duration[name] <= step:  # type: ignore[union-attr]
                engine.finish(name, step)
        for sub in range(3):
            check_cycle(engine, cqs, workloads, step + sub / 10, nodes is not None)
    # No more arrivals or completions: cycle to quiescence (at least once: every backoff of the steps is over
    # by then), then nothing that fits may still wait.
    for _ in range(300):
        check_cycle(engine, cqs, workloads, 20.0, nodes is not None)
        if engine.quiescent():
            break
    assert engine.quiescent()
    strict = {q.name for q in cqs if q.queueing_strategy == QueueingStrategy.STRICT_FIFO}
    # StrictFIFO queues may legitimately hold back everything behind a blocked head; check their heads only.
    # A run backing off after a preemption waits for its timer, not for capacity.
    eligible = [n for n in engine.pending_names() if engine.states[n].requeue_at is None
                and (engine.states[n].cq not in strict or engine.pending_info(n).position == 1)]  # type: ignore[union-attr]
    assert inv.check_no_starvation(eligible, engine.would_fit) == []
