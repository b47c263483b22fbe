"""taugrid's elastic resizing on top of Kueue's slices: shrink for a preemptor before evicting anything whole,
quota held until the removed pods are gone, growth into freed quota by priority with a cooldown, and the same
with nodes (the new pods' placements, the removed pods' devices held)."""

from __future__ import annotations

import pytest
from adm_build import cq, run_until_quiet

from taugrid.core.admission import (
    GPU,
    Elastic,
    Engine,
    GpuDevice,
    Node,
    PodSet,
    PreemptionPolicy,
    WithinClusterQueue,
    Workload,
)
from taugrid.core.admission import results as R

LOWER = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY)


def gpus(engine: Engine, queue: str = "q") -> float:
    return engine.usage(queue).get(("default", GPU), 0) / 1000


def elastic(name: str, count: int, *, lo: int, hi: int, prio: int = 0, t: float = 0.0, cooldown: float = 0.0,
            step: int = 1) -> Workload:
    return Workload(name, "q", (PodSet("main", count, {GPU: 1}),), priority=prio, created_at=t,
                    elastic=Elastic(min_count=lo, max_count=hi, step=step, cooldown_s=cooldown))


def fixed(name: str, count: int, *, prio: int = 0, t: float = 0.0) -> Workload:
    return Workload(name, "q", (PodSet("main", count, {GPU: 1}),), priority=prio, created_at=t)


def test_a_preemptor_shrinks_an_elastic_workload_instead_of_evicting_it_and_waits_for_its_pods() -> None:
    engine = Engine([cq("q", gpu=4, preemption=LOWER)])
    engine.submit(elastic("e", 4, lo=2, hi=4), 0.0)
    run_until_quiet(engine)
    engine.submit(fixed("hi", 1, prio=10, t=1.0), 1.0)
    res = engine.cycle(1.0)
    assert res.preempted == []
    assert [(r.workload, r.old_count, r.new_count, r.cause, r.preemptor) for r in res.resized] == [
        ("e", 4, 3, R.SHRUNK_FOR_PREEMPTOR, "hi")]  # only as far as the preemptor needs
    pending = engine.pending_info("hi")
    assert pending is not None and pending.reason == R.WAITING_FOR_PREEMPTED and pending.waiting_for == ("e",)
    assert gpus(engine) == 4  # the removed pod still holds its GPU
    assert run_until_quiet(engine, 2.0)[0] == []
    engine.release_removed("e")
    assert gpus(engine) == 3
    assert run_until_quiet(engine, 3.0)[0] == ["hi"]
    assert gpus(engine) == 4 and engine.is_admitted("e")


def test_elastic_victims_go_down_to_their_minimum_before_a_whole_workload_is_evicted() -> None:
    engine = Engine([cq("q", gpu=6, preemption=LOWER)])
    engine.submit(fixed("f", 2, prio=-5), 0.0)  # lowest priority: Kueue's first candidate
    engine.submit(elastic("e", 4, lo=1, hi=4, t=1.0), 1.0)
    run_until_quiet(engine)
    engine.submit(fixed("hi", 3, prio=10, t=2.0), 2.0)
    res = engine.cycle(2.0)
    # Evicting f (2) and e (4) is Kueue's minimal set; e gives up 3 pods instead and f is kept.
    assert res.preempted == []
    assert [(r.workload, r.new_count) for r in res.resized] == [("e", 1)]
    engine.release_removed("e")
    assert run_until_quiet(engine, 3.0)[0] == ["hi"]
    assert sorted(engine.admitted_names()) == ["e", "f", "hi"]


def test_a_whole_workload_is_evicted_when_the_elastic_surplus_is_not_enough() -> None:
    engine = Engine([cq("q", gpu=4, preemption=LOWER)])
    engine.submit(elastic("e", 2, lo=1, hi=2, prio=-5), 0.0)
    engine.submit(fixed("f", 2, prio=-1, t=1.0), 1.0)
    run_until_quiet(engine)
    engine.submit(fixed("hi", 3, prio=10, t=2.0), 2.0)
    res = engine.cycle(2.0)
    # e's one surplus pod and no whole workload do not make room for 3; evicting e (2) and f (2) does, and
    # then e's surplus instead of e whole is enough: f evicted, e shrunk to 1.
    assert [p.victim for p in res.preempted] == ["f"]
    assert [(r.workload, r.new_count) for r in res.resized] == [("e", 1)]


def test_an_elastic_workload_grows_back_when_quota_frees_after_its_cooldown() -> None:
    engine = Engine([cq("q", gpu=4, preemption=LOWER)])
    engine.submit(elastic("e", 4, lo=2, hi=4, cooldown=60), 0.0)
    run_until_quiet(engine)
    engine.submit(fixed("hi", 2, prio=10, t=1.0), 1.0)
    assert [(r.workload, r.new_count) for r in engine.cycle(1.0).resized] == [("e", 2)]
    engine.release_removed("e")
    run_until_quiet(engine, 2.0)
    engine.finish("hi", 10.0)
    res = engine.cycle(10.0)
    assert res.resized == []  # shrunk at t=1: no growth before t=61
    grown = engine.cycle(61.0).resized
    assert [(r.workload, r.old_count, r.new_count, r.cause) for r in grown] == [("e", 2, 3, R.GROWN)]
    assert engine.cycle(62.0).resized == []  # one step per cooldown
    assert [(r.old_count, r.new_count) for r in engine.cycle(121.0).resized] == [(3, 4)]
    assert engine.cycle(300.0).resized == [] and gpus(engine) == 4  # at its maximum
    adm = engine.admission("e")
    assert adm is not None and adm.pod_sets[0].count == 4 and adm.pod_sets[0].resource_usage == {GPU: 4}


def test_growth_leaves_freed_quota_to_a_pending_workload_and_goes_by_priority() -> None:
    engine = Engine([cq("q", gpu=4, preemption=LOWER)])
    engine.submit(elastic("low", 1, lo=1, hi=3, prio=1), 0.0)
    engine.submit(elastic("high", 1, lo=1, hi=3, prio=5), 0.0)
    engine.submit(fixed("blocker", 2, prio=0, t=1.0), 1.0)
    run_until_quiet(engine)
    assert sorted(engine.admitted_names()) == ["blocker", "high", "low"]
    engine.submit(fixed("waiting", 2, prio=9, t=2.0), 2.0)  # needs 2; a preemptor of blocker
    res = engine.cycle(2.0)
    assert res.resized == [] and [p.victim for p in res.preempted] == ["blocker"]
    res = engine.cycle(3.0)
    assert [a.workload for a in res.admitted] == ["waiting"] and res.resized == []
    engine.finish("waiting", 4.0)
    grown = [(r.workload, r.new_count) for r in engine.cycle(4.0).resized]
    # 2 GPUs free and blocker (2) is back in the queue: it is admitted first; nothing is left to grow into.
    assert grown == [] and sorted(engine.admitted_names()) == ["blocker", "high", "low"]
    engine.finish("blocker", 5.0)
    assert [(r.workload, r.new_count) for r in engine.cycle(5.0).resized] == [("high", 2), ("low", 2)]


def test_with_nodes_growth_places_new_pods_and_a_shrink_holds_the_devices_until_released() -> None:
    node = Node("n1", gpus=tuple(GpuDevice(i) for i in range(4)), cpu=64, memory=512e9)
    engine = Engine([cq("q", gpu=4, preemption=LOWER)], nodes=[node])
    engine.submit(elastic("e", 2, lo=1, hi=4, step=2), 0.0)
    res = engine.cycle(0.0)  # admitted at 2, and it grows in the same cycle (free room, no cooldown)
    assert [a.workload for a in res.admitted] == ["e"]
    grown = res.resized
    assert [(r.new_count, [(p.index, p.node) for p in r.placements]) for r in grown] == [(4, [(2, "n1"), (3, "n1")])]
    adm = engine.admission("e")
    assert adm is not None and sorted(g for p in adm.placements for g in p.gpus) == [0, 1, 2, 3]
    removed = engine.shrink("e", 3, 2.0)
    assert [p.index for p in removed.placements] == [3]
    engine.submit(fixed("x", 1, t=3.0), 3.0)
    assert run_until_quiet(engine, 3.0)[0] == []  # the GPU of pod 3 is still held
    engine.release_removed("e")
    admitted, _ = run_until_quiet(engine, 4.0)
    assert admitted == ["x"]
    adm_x = engine.admission("x")
    assert adm_x is not None and adm_x.placements[0].gpus == removed.placements[0].gpus


@pytest.mark.parametrize("seed", [25, 26, 27])
def test_random_resizes_keep_the_ledger_equal_to_what_the_workloads_hold(seed: int) -> None:
    """Random arrivals (elastic and fixed, mixed priorities), cycles, releases of removed pods and finishes on a
    2-node pool: after every step each queue is charged exactly what its admitted workloads hold (held pods
    included), never more than its quota, every admitted pod has a placement, and no GPU is given twice."""
    import random

    rng = random.Random(seed)
    nodes = [Node(f"n{i}", gpus=tuple(GpuDevice(g) for g in range(4)), cpu=64, memory=512e9) for i in range(2)]
    engine = Engine([cq("q", gpu=8, preemption=LOWER)], nodes=nodes)
    held: set[str] = set()
    for step in range(400):
        now = float(step)
        roll = rng.random()
        if roll < 0.25:
            name, prio = f"w{step}", rng.choice((0, 5, 10))
            if rng.random() < 0.6:
                hi = rng.randint(2, 5)
                engine.submit(elastic(name, rng.randint(1, hi), lo=1, hi=hi, prio=prio, t=now,
                                      cooldown=rng.choice((0, 3))), now)
            else:
                engine.submit(fixed(name, rng.randint(1, 3), prio=prio, t=now), now)
        elif roll < 0.45 and held:
            name = rng.choice(sorted(held))
            held.discard(name)
            if engine.is_admitted(name):
                engine.release_removed(name)
        elif roll < 0.55 and engine.admitted_names():
            name = rng.choice(sorted(engine.admitted_names()))
            held.discard(name)
            engine.finish(name, now)
        elif roll < 0.62:
            shrinkable = [ws for ws in map(engine.states.get, engine.admitted_names()) if ws is not None
                          and ws.workload.elastic is not None and ws.workload.pod_sets[0].count > 1]
            if shrinkable:
                ws = rng.choice(shrinkable)
                engine.shrink(ws.workload.name, ws.workload.pod_sets[0].count - 1, now)
                held.add(ws.workload.name)
        else:
            res = engine.cycle(now)
            held |= {r.workload for r in res.resized if r.cause != R.GROWN}
        admitted = [engine.states[n] for n in engine.admitted_names()]
        total = sum(ws.usage.get(("default", GPU), 0) for ws in admitted)
        assert engine.usage("q").get(("default", GPU), 0) == total <= 8000, step
        devices = [(p.node, g) for ws in admitted for p in (*ws.placements, *ws.held_pods) for g in p.gpus]
        assert len(devices) == len(set(devices)) == total // 1000, step
        for ws in admitted:
            assert len(ws.placements) == sum(ps.count for ps in ws.workload.pod_sets), (step, ws.workload.name)


def test_an_unconstrained_tas_workload_grows_and_shrinks_with_its_topology_assignment() -> None:
    import dataclasses

    from test_tas import engine as tas_engine
    from test_tas import job, pool

    from taugrid.core.admission import TopologyRequest

    engine = tas_engine(pool())  # two GPUs per node
    w = dataclasses.replace(job("e", 2, TopologyRequest(unconstrained=True)),
                            elastic=Elastic(min_count=1, max_count=4, step=2))
    engine.submit(w, 0.0)
    res = engine.cycle(0.0)
    assert [(r.old_count, r.new_count) for r in res.resized] == [(2, 4)]
    adm = engine.admission("e")
    assert adm is not None
    (assignment,) = adm.topology_assignments.values()
    assert sorted(n for (n,), _ in assignment.domains) == sorted({p.node for p in adm.placements})
    assert sum(c for _, c in assignment.domains) == 4
    engine.shrink("e", 1, 1.0)
    adm = engine.admission("e")
    assert adm is not None
    (assignment,) = adm.topology_assignments.values()
    assert sum(c for _, c in assignment.domains) == 1
