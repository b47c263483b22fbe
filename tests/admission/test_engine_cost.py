"""What a cycle costs, beside what it decides (issue 30 item 4): a head settled by a memo keeps no object of its
own (it shares the memo's pending record and its shape's number), a parked cycle leaves nothing behind for the
garbage collector, shape numbers are never given twice, and the victim search a preemption oracle already did
is not done again. Decisions are checked against the reference engine in ``test_memo_parking``."""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from taugrid.core.admission import engine as engine_module
from taugrid.core.admission.queues import CQQueue, WState
from taugrid.core.admission.quota import QuotaTree
from taugrid.core.admission.victims import Target

ANY = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)  # a no-victims verdict is its nomination's alone
MESSAGE = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor f, 1 more needed"


def full_queue(policy: PreemptionPolicy | None = None, cpu: int = 2, memo: bool = True) -> Engine:
    cq = ClusterQueue("cq", (ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(cpu)}),)),),
                      preemption=policy or ANY)
    return Engine([cq], memo=memo)


def run(name: str, cpu: int = 1, priority: int = 0, at: float = 0.0) -> Workload:
    return Workload(name, "cq", (PodSet("main", 1, {"cpu": cpu}),), priority=priority, created_at=at)


def test_heads_settled_by_a_memo_share_its_pending_record_and_their_shape_number() -> None:
    engine = full_queue()
    for i in range(6):
        engine.submit(run(f"w{i}", at=float(i)), 0.0)
    for _ in range(5):
        engine.cycle(0.0)
    queue = engine.queues["cq"]
    entry = queue._first()  # w5's, the last head: settled by the memo, it is parked as the very entry popped
    engine.cycle(0.0)
    assert entry is not None and entry[3] == "w5" and queue.parked[-1] is entry
    assert engine.quiescent() and sorted(engine.admitted_names()) == ["w0", "w1"]
    memo = engine.queues["cq"].memo
    assert memo is not None and memo.workload.name == "w2" and engine.nominations == 3  # w0, w1, w2
    assert memo.why == ("WaitingForQuota", MESSAGE, ())
    assert [engine.states[n].why is memo.why for n in ("w3", "w4", "w5")] == [True, True, True]
    assert len({engine.states[n].shape for n in ("w0", "w1", "w2", "w3", "w4", "w5")}) == 1
    engine.submit(run("big", cpu=2, at=9.0), 0.0)
    assert engine.states["big"].shape != engine.states["w0"].shape
    assert {n: (p.reason, p.message, p.position) for n, p in engine.pending_all().items()} == {
        "w2": ("WaitingForQuota", MESSAGE, 1), "w3": ("WaitingForQuota", MESSAGE, 2),
        "w4": ("WaitingForQuota", MESSAGE, 3), "w5": ("WaitingForQuota", MESSAGE, 4),
        "big": ("Pending", "Waiting for the next scheduling cycle", 5)}


def tracked() -> int:
    """Objects the collector tracks, after collecting until that number is steady (a tuple whose items were
    tracked is untracked one collection after they are)."""
    counts = [-1]
    while True:
        gc.collect()
        counts.append(len(gc.get_objects()))
        if counts[-1] == counts[-2]:
            return counts[-1]


def test_a_cycle_that_settles_heads_by_memos_leaves_no_object_for_the_garbage_collector() -> None:
    """Ten queues, each a memo and twenty waiting runs of its shape: a cycle pops, settles and parks one head
    per queue, and afterwards the collector tracks exactly as many objects as before it."""
    group = ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(1)}),))
    engine = Engine([ClusterQueue(f"cq{i}", (group,), preemption=ANY) for i in range(10)])
    for i in range(10):
        for k in range(22):
            engine.submit(Workload(f"w{i}-{k}", f"cq{i}", (PodSet("main", 1, {"cpu": 1}),), created_at=k), 0.0)
    engine.cycle(0.0)  # admits one run per queue
    engine.cycle(0.0)  # nominates the next head of each queue: the memos
    nominated = engine.nominations
    before = tracked()
    result = engine.cycle(0.0)
    heads = result.heads
    del result
    assert (heads, engine.nominations, tracked()) == (10, nominated, before)


def test_shape_numbers_are_never_given_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the table of shapes starts afresh, a shape met again gets a new number: a memo kept under the old
    one stops matching (the head is nominated again) rather than matching another shape."""
    monkeypatch.setattr(engine_module, "SHAPES_KEPT", 2)
    engine = full_queue(cpu=1)
    engine.submit(run("first", cpu=1), 0.0)
    engine.submit(run("a1", cpu=1, at=1.0), 0.0)
    engine.submit(run("b1", cpu=2, at=2.0), 0.0)  # over the queue's quota whatever is admitted
    engine.submit(run("c1", cpu=3, at=3.0), 0.0)  # a third shape: the table starts afresh
    engine.submit(run("a2", cpu=1, at=4.0), 0.0)  # a1's shape again, under a new number
    numbers = [engine.states[n].shape for n in ("a1", "b1", "c1", "a2")]
    assert numbers == [1, 2, 3, 4]
    assert engine.states["first"].shape == 1
    assert [a.workload for a in engine.cycle(0.0).admitted] == ["first"]
    engine.cycle(0.0)  # a1 nominated: its memo is kept under number 1
    assert engine.nominations == 2
    for _ in range(3):
        engine.cycle(0.0)  # b1, c1 and a2 each nominated: no memo has their number
    assert engine.nominations == 5 and engine.quiescent()
    assert {n: p.reason for n, p in engine.pending_all().items()} == {
        "a1": "WaitingForQuota", "b1": "ExceedsMaxQuota", "c1": "ExceedsMaxQuota", "a2": "WaitingForQuota"}


@pytest.mark.parametrize("memo", [True, False])
def test_a_head_whose_preemption_oracle_found_no_victims_is_not_searched_again(
        memo: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head needs preemption (the queue is full of runs of its own priority, which it may not preempt):
    the oracle's search finds no victims; with the memo that answer stands for the head's targets too (one
    search), the reference engine searches again as Kueue does (two); the verdict is the same."""
    engine = full_queue(PreemptionPolicy(WithinClusterQueue.LOWER_PRIORITY, ReclaimWithinCohort.ANY), memo=memo)
    for i in range(2):
        engine.submit(run(f"held{i}", priority=5, at=float(i)), 0.0)
    engine.cycle(0.0)
    engine.cycle(0.0)  # one head per queue and cycle: held0, then held1
    assert sorted(engine.admitted_names()) == ["held0", "held1"]
    engine.submit(run("head", priority=5, at=9.0), 0.0)
    searches: list[str] = []
    find = engine._find_targets

    def counted(ws: WState, *args: Any, **kwargs: Any) -> list[Target]:
        searches.append(ws.workload.name)
        return find(ws, *args, **kwargs)

    monkeypatch.setattr(engine, "_find_targets", counted)
    result = engine.cycle(0.0)
    assert (result.admitted, result.preempted, result.heads) == ([], [], 1)
    assert searches == (["head"] if memo else ["head", "head"])
    info = engine.pending_info("head")
    assert info is not None and (info.reason, info.message) == ("WaitingForQuota", MESSAGE)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_a_queue_pops_its_pending_runs_in_priority_then_age_order(seed: int) -> None:
    """A queue's pending runs come out as a sorted list of them would give them (priority, then queue
    timestamp, then arrival), whether they sit in the heap of recent pushes or in the sorted run, are parked and
    come back, or return with a new version (an entry left behind is skipped)."""
    rng = random.Random(seed)
    cq = ClusterQueue("cq", (ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(1)}),)),))
    q = CQQueue(cq, QuotaTree([cq]).cqs["cq"])
    states: dict[str, WState] = {}
    popped: WState | None = None
    for n in range(300):
        op = rng.choice(["submit"] * rng.choice([1, 4]) + ["pop", "pop", "park", "park", "unpark", "requeue"])
        if op == "submit":
            ws = WState(Workload(f"w{n}", "cq", priority=rng.randrange(4)), "cq", [], queue_ts=rng.randrange(6))
            states[ws.workload.name] = ws
            q.push(ws)
        elif op == "requeue" and states:
            ws = states[rng.choice(sorted(states))]
            if ws is not popped and not ws.parked:
                ws.version += 1  # its old entry is stale now
                ws.queue_ts = rng.randrange(6)
                q.push(ws)
        elif op == "park" and popped is not None:
            q.park(popped)
            popped = None
        elif op == "unpark":
            q.unpark(states)
        elif op == "pop":
            if popped is not None:
                del states[popped.workload.name]  # the last head was admitted: gone from the pending runs
            waiting = [ws for ws in states.values() if ws is not popped and not ws.parked]
            expected = min(waiting, key=lambda w: (-w.workload.priority, w.queue_ts, w.seq), default=None)
            popped = q.pop_head(states)
            assert popped is expected


def test_a_drained_queue_forgets_its_memos_and_stale_entries_and_decides_as_before() -> None:
    engine = full_queue()
    for i in range(6):
        engine.submit(run(f"w{i}", at=float(i)), 0.0)
    while not engine.quiescent():
        engine.cycle(0.0)
    queue = engine.queues["cq"]
    assert engine.settle_idle() == 0  # four wait: nothing is dropped
    assert queue.memo is not None and queue.memo.workload.name == "w2" and len(queue.parked) == 4
    admitted: list[str] = []
    for step in range(6):  # each end frees room for the next head
        running = sorted(engine.admitted_names())
        engine.finish(running[0], float(step + 1))
        admitted += [a.workload for a in engine.cycle(float(step + 1)).admitted]
    assert admitted == ["w2", "w3", "w4", "w5"] and engine.admitted_names() == []
    queue.run.append((0, 0.5, 99, "w0", 0))  # a stale entry, as lazy deletion leaves one (w0 ended)
    assert queue.memo is not None and queue.memo.workload.name == "w2"  # what the backlog left
    assert engine.settle_idle() == 1
    assert (queue.memos, queue.memo_epochs, queue.heap, queue.run, queue.parked, queue.parked_on_nodes) == (
        {}, None, [], [], [], [])
    for i in range(3):  # the next backlog is decided as the first was
        engine.submit(run(f"v{i}", at=10.0 + i), 10.0)
    engine.cycle(10.0)
    engine.cycle(10.0)
    engine.cycle(10.0)
    assert sorted(engine.admitted_names()) == ["v0", "v1"]
    assert {n: (p.reason, p.message, p.position) for n, p in engine.pending_all().items()} == {
        "v2": ("WaitingForQuota", MESSAGE, 1)}
