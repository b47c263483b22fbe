"""MultiKueue's preemption gate (KEP-8303, OrchestratedPreemption) in the engine: a gated workload is admitted
where it fits, but where it could only fit by preempting it preempts nothing and waits ``PreemptionGated``, by
every way the engine preempts (its queue's quota, node room); submitted again ungated, it preempts as any other."""

from __future__ import annotations

from adm_build import cq, run_until_quiet, wl

from taugrid.core.admission import Engine, GpuDevice, Node, PreemptionPolicy, WithinClusterQueue
from taugrid.core.admission import results as R

LOWER = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY)


def test_a_gated_workload_preempts_nothing_until_submitted_ungated() -> None:
    e = Engine([cq("team", gpu=4, preemption=LOWER)])
    e.submit(wl("low-1", "team", gpu=2, prio=1, t=0), 0)
    e.submit(wl("low-2", "team", gpu=2, prio=1, t=1), 0)
    run_until_quiet(e)
    e.submit(wl("high", "team", gpu=2, prio=10, t=5, preemption_gated=True), 5)
    admitted, preempted = run_until_quiet(e, 5)
    assert (admitted, preempted) == ([], [])
    info = e.pending_info("high")
    assert info is not None and (info.reason, info.message) == (R.PREEMPTION_GATED, R.MSG_PREEMPTION_GATED)
    e.finish("high", 6)  # the gate lifted: the site submits it again, ungated
    e.submit(wl("high", "team", gpu=2, prio=10, t=5), 6)
    res = e.cycle(6)
    assert [(p.victim, p.preemptor) for p in res.preempted] == [("low-2", "high")]


def test_a_gated_workload_that_fits_is_admitted() -> None:
    e = Engine([cq("team", gpu=4, preemption=LOWER)])
    e.submit(wl("low", "team", gpu=2, prio=1, t=0), 0)
    e.submit(wl("high", "team", gpu=2, prio=10, t=1, preemption_gated=True), 1)
    admitted, preempted = run_until_quiet(e, 1)
    assert (sorted(admitted), preempted) == (["high", "low"], [])


def test_a_gated_workload_takes_no_node_room_from_others() -> None:
    """Quota fits, the node does not: the engine would preempt for node room (KAI); gated, it waits instead."""
    node = Node("n1", tuple(GpuDevice(g, 81920) for g in range(4)), cpu=64, memory=1 << 40)
    e = Engine([cq("team", gpu=8, preemption=LOWER)], nodes=[node])
    e.submit(wl("low", "team", gpu=4, prio=1, t=0), 0)
    run_until_quiet(e)
    e.submit(wl("high", "team", gpu=4, prio=10, t=1, preemption_gated=True), 1)
    admitted, preempted = run_until_quiet(e, 1)
    assert (admitted, preempted) == ([], [])
    info = e.pending_info("high")
    assert info is not None and info.reason == R.PREEMPTION_GATED
