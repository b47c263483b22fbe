"""Example scenarios from the scheduling reference: quota, borrowing, reclaim, preemption, fair sharing,
StrictFIFO, gangs, fractional GPUs, placement, backoff, and the researcher-facing explanation."""

from __future__ import annotations

import pytest
from adm_build import cq, run_until_quiet, wl

from taugrid.core.admission import (
    GPU,
    BorrowWithinCohort,
    BorrowWithinCohortPolicy,
    Cohort,
    Engine,
    FlavorQuotas,
    GpuDevice,
    LocalQueue,
    Node,
    PlacementStrategy,
    PodSet,
    PreemptionPolicy,
    ReclaimWithinCohort,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Taint,
    Toleration,
    WithinClusterQueue,
    Workload,
)
from taugrid.core.admission import results as R
from taugrid.core.errors import PermanentError

LOWER = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY)


def cpu_wl(name: str, queue: str, cpu: float, **kw: object) -> Workload:
    return Workload(name, queue, (PodSet("main", 1, {"cpu": cpu}),), **kw)  # type: ignore[arg-type]


def test_admits_what_fits_and_explains_the_rest_in_kueue_words() -> None:
    e = Engine([cq("team", gpu=4)])
    e.submit(wl("a", "team", gpu=2), 0)
    e.submit(wl("b", "team", gpu=4, t=1), 0)
    run_until_quiet(e)
    assert e.is_admitted("a") and not e.is_admitted("b")
    info = e.pending_info("b")
    assert info is not None and info.reason == R.WAITING_FOR_QUOTA
    assert info.message == ("couldn't assign flavors to pod set main: insufficient unused quota for "
                            "nvidia.com/gpu in flavor default, 2 more needed")
    assert info.position == 1 and info.ahead == 0


def test_request_beyond_maximum_capacity_is_exceeds_max_quota() -> None:
    e = Engine([cq("team", gpu=4)])
    e.submit(wl("big", "team", gpu=5), 0)
    run_until_quiet(e)
    info = e.pending_info("big")
    assert info is not None and info.reason == R.EXCEEDS_MAX_QUOTA
    assert info.message.endswith("insufficient quota for nvidia.com/gpu in flavor default, "
                                 "request > maximum capacity (5 > 4)")
    assert "It can never fit" in e.explain("big")


@pytest.mark.parametrize(("a_quota", "b_quota", "max_a"), [
    (9, 12, 21),                  # no limits: A may take all of B's idle quota
    ((9, 1, None), 12, 10),       # borrowingLimit 1 on A
    (9, (12, None, 1), 10),       # lendingLimit 1 on B: B keeps 11
])
def test_borrowing_follows_kueue_flat_example(a_quota: object, b_quota: object, max_a: int) -> None:
    e = Engine([cq("a", cohort="lab", flavors={"default": {"cpu": a_quota}}),  # type: ignore[dict-item]
                cq("b", cohort="lab", flavors={"default": {"cpu": b_quota}})])  # type: ignore[dict-item]
    for i in range(25):
        e.submit(cpu_wl(f"a{i}", "a", 1, created_at=i), 0)
    run_until_quiet(e)
    assert len(e.admitted_names()) == max_a
    assert e.usage("a")[("default", "cpu")] == max_a * 1000
    assert e.admission("a20" if max_a == 21 else "a9").borrowing  # type: ignore[union-attr]
    assert not e.admission("a0").borrowing  # type: ignore[union-attr]


def test_lender_reclaims_its_quota_by_preempting_the_borrower() -> None:
    reclaim = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)
    e = Engine([cq("a", cohort="lab", gpu=2), cq("b", cohort="lab", gpu=2, preemption=reclaim)])
    e.submit(wl("a-big", "a", gpu=4, prio=100), 0)
    run_until_quiet(e)
    assert e.admission("a-big").borrowing  # type: ignore[union-attr]
    e.submit(wl("b-1", "b", gpu=2), 1)
    res = e.cycle(1)
    assert [(p.victim, p.preemptor, p.reason) for p in res.preempted] == [
        ("a-big", "b-1", R.IN_COHORT_RECLAMATION)]
    info = e.pending_info("b-1")
    assert info is not None and info.message == (  # Kueue's wording: why it preempts, then what it waits for
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor default, "
        "2 more needed. Pending the preemption of 1 workload(s)")
    assert info.reason == R.WAITING_FOR_PREEMPTED and info.waiting_for == ("a-big",)
    res = e.cycle(2)
    assert [a.workload for a in res.admitted] == ["b-1"]
    assert not res.admitted[0].borrowing


def test_reclaim_lower_priority_spares_higher_priority_borrowers() -> None:
    reclaim = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.LOWER_PRIORITY)
    e = Engine([cq("a", cohort="lab", gpu=2), cq("b", cohort="lab", gpu=2, preemption=reclaim)])
    e.submit(wl("a-big", "a", gpu=4, prio=100), 0)
    run_until_quiet(e)
    e.submit(wl("b-1", "b", gpu=2, prio=10), 1)
    _, preempted = run_until_quiet(e, 1)
    assert preempted == [] and e.is_admitted("a-big")
    assert "Nothing it may preempt frees enough" in e.explain("b-1")


def test_higher_priority_preempts_lower_in_its_queue() -> None:
    e = Engine([cq("team", gpu=4, preemption=LOWER)])
    e.submit(wl("low-1", "team", gpu=2, prio=1, t=0), 0)
    e.submit(wl("low-2", "team", gpu=2, prio=1, t=1), 0)
    run_until_quiet(e)
    e.submit(wl("high", "team", gpu=2, prio=10, t=5), 5)
    assert "It would preempt 1 workload(s): low-2" in e.explain("high")
    res = e.cycle(5)
    # most recently admitted goes first, and only one victim is needed
    assert [(p.victim, p.reason) for p in res.preempted] == [("low-2", R.IN_CLUSTER_QUEUE)]
    res = e.cycle(6)
    assert [a.workload for a in res.admitted] == ["high"]
    assert e.pending_info("low-2") is not None


@pytest.mark.parametrize(("policy", "victim_prio", "victim_preemptible"), [
    (PreemptionPolicy(), 1, True),       # withinClusterQueue: Never
    (LOWER, 10, True),                   # equal priority is not lower
    (LOWER, 1, False),                   # KAI non-preemptible is never a victim
])
def test_preemption_not_allowed(policy: PreemptionPolicy, victim_prio: int, victim_preemptible: bool) -> None:
    e = Engine([cq("team", gpu=2, preemption=policy)])
    e.submit(wl("running", "team", gpu=2, prio=victim_prio, preemptible=victim_preemptible), 0)
    run_until_quiet(e)
    e.submit(wl("high", "team", gpu=2, prio=10, t=1), 1)
    _, preempted = run_until_quiet(e, 1)
    assert preempted == [] and e.is_admitted("running")
    assert e.pending_info("high").reason == R.WAITING_FOR_QUOTA  # type: ignore[union-attr]


def test_lower_or_newer_equal_priority_preempts_newer_equal() -> None:
    pol = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_OR_NEWER_EQUAL_PRIORITY)
    e = Engine([cq("team", gpu=2, preemption=pol)])
    e.submit(wl("newer", "team", gpu=2, prio=5, t=10), 0)
    run_until_quiet(e)
    e.submit(wl("older", "team", gpu=2, prio=5, t=1), 1)
    _, preempted = run_until_quiet(e, 1)
    assert [p.victim for p in preempted] == ["newer"] and e.is_admitted("older")


def test_borrow_within_cohort_preempts_below_threshold_only() -> None:
    pol = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY,
                           reclaim_within_cohort=ReclaimWithinCohort.ANY,
                           borrow_within_cohort=BorrowWithinCohort(BorrowWithinCohortPolicy.LOWER_PRIORITY, 5))
    e = Engine([cq("a", cohort="lab", gpu=2, preemption=pol), cq("b", cohort="lab", gpu=4),
                cq("c", cohort="lab", gpu=0)])
    e.submit(wl("c-cheap", "c", gpu=2, prio=1), 0)
    e.submit(wl("c-dear", "c", gpu=2, prio=8, t=1), 0)
    run_until_quiet(e)
    assert e.is_admitted("c-cheap") and e.is_admitted("c-dear")
    e.submit(wl("a-wide", "a", gpu=4, prio=10, t=2), 2)  # must borrow 2 beyond its nominal
    _, preempted = run_until_quiet(e, 2)
    assert [(p.victim, p.reason) for p in preempted] == [("c-cheap", R.IN_COHORT_RECLAIM_WHILE_BORROWING)]
    assert e.is_admitted("a-wide") and e.is_admitted("c-dear")


def fair_setup(fair: bool) -> Engine:
    e = Engine([cq("a", cohort="lab", gpu=4), cq("b", cohort="lab", gpu=4), cq("lender", cohort="lab", gpu=8)],
               fair_sharing=fair)
    e.submit(wl("a-0", "a", gpu=8, t=0), 0)
    e.submit(wl("b-0", "b", gpu=4, t=0), 0)
    run_until_quiet(e)
    e.submit(wl("a-1", "a", gpu=4, t=1), 1)
    e.submit(wl("b-1", "b", gpu=4, t=2), 1)
    return e


def test_fair_sharing_favours_the_queue_borrowing_less() -> None:
    classic = fair_setup(fair=False)
    assert [a.workload for a in classic.cycle(1).admitted] == ["a-1"]  # older head first
    fair = fair_setup(fair=True)
    assert [a.workload for a in fair.cycle(1).admitted] == ["b-1"]  # lower DRS wins
    assert fair.pending_info("a-1").message == R.MSG_NO_LONGER_FITS  # type: ignore[union-attr]


@pytest.mark.parametrize("strict", [True, False])
def test_strict_fifo_blocks_behind_its_head_best_effort_does_not(strict: bool) -> None:
    e = Engine([cq("team", gpu=4, strict=strict)])
    e.submit(wl("a", "team", gpu=2, t=0), 0)
    run_until_quiet(e)
    e.submit(wl("b", "team", gpu=4, t=1), 1)
    e.submit(wl("c", "team", gpu=1, t=2), 1)
    run_until_quiet(e, 1)
    assert e.is_admitted("c") is (not strict)
    if strict:
        info = e.pending_info("c")
        assert info is not None and info.waiting_for == ("b",) and info.ahead == 1
        assert info.message == "Waiting for workload b at the head of StrictFIFO ClusterQueue team"
        e.finish("a", 2)
        run_until_quiet(e, 2)
        assert e.is_admitted("b") and not e.is_admitted("c")


def test_flavors_are_tried_in_order_and_fit_beats_preempt() -> None:
    e = Engine([cq("team", flavors={"h200": {GPU: 2}, "a100": {GPU: 4}}, preemption=LOWER)])
    e.submit(wl("first", "team", gpu=2, prio=0), 0)
    run_until_quiet(e)
    e.submit(wl("second", "team", gpu=2, prio=5, t=1), 0)
    _, preempted = run_until_quiet(e)
    assert e.admission("first").flavors == {GPU: "h200"}  # type: ignore[union-attr]
    assert e.admission("second").flavors == {GPU: "a100"}  # type: ignore[union-attr]
    assert preempted == []


def test_flavor_taints_and_node_labels_gate_eligibility() -> None:
    flavors = [ResourceFlavor("spot", {"pool": "spot"}, (Taint("spot", "true"),)), ResourceFlavor("ondemand")]
    e = Engine([cq("team", flavors={"spot": {GPU: 4}, "ondemand": {GPU: 1}})], flavors=flavors)
    e.submit(wl("tolerant", "team", gpu=2, tolerations=(Toleration("spot", "Exists"),)), 0)
    e.submit(wl("plain", "team", gpu=2, t=1), 0)
    run_until_quiet(e)
    assert e.admission("tolerant").flavors == {GPU: "spot"}  # type: ignore[union-attr]
    msg = e.pending_info("plain").message  # type: ignore[union-attr]
    assert msg == ("couldn't assign flavors to pod set main: untolerated taint {spot: true} in flavor spot, "
                   "insufficient quota for nvidia.com/gpu in flavor ondemand, request > maximum capacity (2 > 1)")


def test_hierarchical_cohorts_share_department_quota() -> None:
    dept_quota = (ResourceGroup((GPU,), (FlavorQuotas("default", {GPU: ResourceQuota(4)}),)),)
    cohorts = [Cohort("org"), Cohort("dept-a", parent="org", resource_groups=dept_quota), Cohort("dept-b", "org")]
    e = Engine([cq("proj-1", cohort="dept-a", gpu=2), cq("proj-2", cohort="dept-a", gpu=0),
                cq("proj-3", cohort="dept-b", gpu=(2, 0, None))], cohorts)
    e.submit(wl("p2", "proj-2", gpu=5), 0)  # dept's 4 + idle 2 of proj-1 + 2 lent by dept-b's proj-3 = 8
    e.submit(wl("p3", "proj-3", gpu=2), 0)
    run_until_quiet(e)
    assert e.is_admitted("p2") and e.is_admitted("p3")
    e.submit(wl("p1", "proj-1", gpu=1), 1)  # proj-1 lends all it has (no lending limit): 1 left in dept-a
    run_until_quiet(e, 1)
    assert e.is_admitted("p1")
    e.submit(wl("p2b", "proj-2", gpu=1), 2)
    run_until_quiet(e, 2)
    assert not e.is_admitted("p2b")


def gpu_nodes(n: int, gpus: int, mem: int = 81920) -> list[Node]:
    return [Node(f"n{i}", tuple(GpuDevice(g, mem) for g in range(gpus)), cpu=64, memory=1 << 40)
            for i in range(n)]


def test_two_half_gpus_share_one_device_and_a_third_waits() -> None:
    e = Engine([cq("team", gpu=4)], nodes=gpu_nodes(1, 1))
    e.submit(wl("pair", "team", frac=0.5, count=2), 0)
    e.submit(wl("third", "team", frac=0.5, t=1), 0)
    admitted, _ = run_until_quiet(e)
    assert admitted == ["pair"]
    placements = e.admission("pair").placements  # type: ignore[union-attr]
    assert [(p.node, p.gpus, p.gpu_fraction) for p in placements] == [("n0", (0,), 0.5), ("n0", (0,), 0.5)]
    info = e.pending_info("third")
    assert info is not None and info.reason == R.UNSCHEDULABLE and "pod set main" in info.message
    e.finish("pair", 1)
    admitted, _ = run_until_quiet(e, 1)
    assert admitted == ["third"]


def test_two_half_gpu_workloads_from_two_queues_admitted_in_one_cycle() -> None:
    e = Engine([cq("a", gpu=1), cq("b", gpu=1)], nodes=gpu_nodes(1, 1))
    e.submit(wl("x", "a", frac=0.5), 0)
    e.submit(wl("y", "b", frac=0.5), 0)
    e.submit(wl("z", "b", frac=0.5, t=1), 0)
    assert sorted(a.workload for a in e.cycle(0).admitted) == ["x", "y"]
    run_until_quiet(e)
    assert not e.is_admitted("z")


def test_binpack_fills_used_gpu_spread_picks_empty_one() -> None:
    for strategy, expect_same in [(PlacementStrategy.BINPACK, True), (PlacementStrategy.SPREAD, False)]:
        e = Engine([cq("team", gpu=4)], nodes=gpu_nodes(2, 2))
        e.submit(wl("w1", "team", frac=0.25, placement=strategy), 0)
        e.submit(wl("w2", "team", frac=0.25, t=1, placement=strategy), 0)
        run_until_quiet(e)
        p1 = e.admission("w1").placements[0]  # type: ignore[union-attr]
        p2 = e.admission("w2").placements[0]  # type: ignore[union-attr]
        assert ((p1.node, p1.gpus) == (p2.node, p2.gpus)) is expect_same


def test_gpu_memory_becomes_a_fraction_of_that_device() -> None:
    e = Engine([cq("team", gpu=2)], nodes=gpu_nodes(1, 1, mem=40000))
    e.submit(Workload("m", "team", (PodSet("main", 2, {}, gpu_memory_mb=20000),)), 0)
    run_until_quiet(e)
    assert [p.gpu_fraction for p in e.admission("m").placements] == [0.5, 0.5]  # type: ignore[union-attr]


def test_gang_is_all_or_nothing_on_nodes() -> None:
    e = Engine([cq("team", gpu=8)], nodes=gpu_nodes(2, 1))
    e.submit(wl("gang", "team", gpu=1, count=3), 0)
    run_until_quiet(e)
    assert not e.is_admitted("gang")
    assert "with 2 of 3 pods of the gang placed" in e.pending_info("gang").message  # type: ignore[union-attr]
    assert e.cluster is not None and all(u == 0 for ns in e.cluster.nodes for u in ns.gpu_used)
    assert e.usage("team") == {}


def test_eviction_requeues_with_exponential_backoff() -> None:
    e = Engine([cq("team", gpu=2)], backoff_base_s=10)
    e.submit(wl("w", "team", gpu=2), 0)
    run_until_quiet(e)
    e.evict("w", 5, "PodsReadyTimeout")
    info = e.pending_info("w")
    assert info is not None and info.reason == R.BACKOFF and info.requeue_at == 15
    assert e.cycle(14).admitted == []
    assert [a.workload for a in e.cycle(15).admitted] == ["w"]
    e.evict("w", 20, "PodsReadyTimeout")
    assert e.pending_info("w").requeue_at == 40  # type: ignore[union-attr]


def test_local_queue_maps_to_cluster_queue_and_bad_input_is_rejected() -> None:
    e = Engine([cq("team", gpu=2)], local_queues=[LocalQueue("team-lq", "team")])
    e.submit(wl("w", "team-lq", gpu=1), 0)
    assert [a.cluster_queue for a in e.cycle(0).admitted] == ["team"]
    with pytest.raises(PermanentError, match="names no LocalQueue"):
        e.submit(wl("x", "nope", gpu=1), 0)
    with pytest.raises(PermanentError, match="gpu_fraction"):
        e.submit(wl("y", "team", frac=1.5), 0)


def test_explain_names_resource_flavor_and_queue_position() -> None:
    e = Engine([cq("team", gpu=4)])
    e.submit(wl("a", "team", gpu=4), 0)
    run_until_quiet(e)
    e.submit(wl("b", "team", gpu=2, t=1), 1)
    e.submit(wl("c", "team", gpu=2, t=2), 1)
    run_until_quiet(e, 1)
    text = e.explain("c")
    assert "position 2, 1 workload(s) ahead" in text
    assert "nvidia.com/gpu in flavor default: needs 2, 0 free" in text
    assert "admitted in ClusterQueue team" in e.explain("a")
