"""Each invariant checker passes on good states and FAILS on a hand-made broken one."""

from __future__ import annotations

from adm_build import cq

from taugrid.core.admission import GPU, Admission, PodPlacement, PodSet, PodSetAdmission, Workload
from taugrid.core.admission import invariants as inv
from taugrid.core.admission.model import PreemptionPolicy, ReclaimWithinCohort, WithinClusterQueue, to_units
from taugrid.core.admission.preemption import Candidate

FR = ("default", GPU)


def test_quota_checker_accepts_borrowing_within_limits() -> None:
    cqs = [cq("a", cohort="lab", gpu=(2, 2, None)), cq("b", cohort="lab", gpu=4)]
    assert inv.check_quota(cqs, [], {"a": {FR: to_units(4)}, "b": {FR: to_units(2)}}) == []


def test_quota_checker_flags_over_nominal_without_cohort() -> None:
    assert inv.check_quota([cq("solo", gpu=2)], [], {"solo": {FR: to_units(3)}}) != []


def test_quota_checker_flags_over_borrowing_limit() -> None:
    cqs = [cq("a", cohort="lab", gpu=(2, 1, None)), cq("b", cohort="lab", gpu=4)]
    out = inv.check_quota(cqs, [], {"a": {FR: to_units(4)}})
    assert out and "borrowing limit" in out[0]


def test_quota_checker_flags_borrowing_beyond_lending_limit() -> None:
    cqs = [cq("a", cohort="lab", gpu=2), cq("b", cohort="lab", gpu=(4, None, 1))]
    assert inv.check_quota(cqs, [], {"a": {FR: to_units(3)}}) == []
    assert inv.check_quota(cqs, [], {"a": {FR: to_units(4)}}) != []  # b lends only 1
    assert inv.check_quota(cqs, [], {"a": {FR: to_units(3)}, "b": {FR: to_units(4)}}) != []


def gang_workload() -> Workload:
    return Workload("g", "q", (PodSet("main", 3, {GPU: 1}),))


def test_gang_checker_flags_partial_admission() -> None:
    full = Admission(workload="g", cluster_queue="q", flavors={GPU: "default"}, borrowing=False,
                     pod_sets=(PodSetAdmission(name="main", count=3, flavors={}, resource_usage={}),),
                     placements=tuple(PodPlacement(pod_set="main", index=i, node="n", gpus=(i,)) for i in range(3)))
    assert inv.check_gangs({"g": gang_workload()}, [full], with_nodes=True) == []
    partial_pods = Admission(workload="g", cluster_queue="q", flavors={}, borrowing=False,
                             pod_sets=full.pod_sets, placements=full.placements[:2])
    assert inv.check_gangs({"g": gang_workload()}, [partial_pods], with_nodes=True) != []
    partial_count = Admission(workload="g", cluster_queue="q", flavors={}, borrowing=False,
                              pod_sets=(PodSetAdmission(name="main", count=2, flavors={}, resource_usage={}),))
    assert inv.check_gangs({"g": gang_workload()}, [partial_count], with_nodes=False) != []


def test_fraction_checker_flags_oversubscribed_gpu() -> None:
    ok = [PodPlacement(pod_set="m", index=0, node="n", gpus=(0,), gpu_fraction=0.5),
          PodPlacement(pod_set="m", index=1, node="n", gpus=(0,), gpu_fraction=0.5)]
    assert inv.check_gpu_fractions(ok) == []
    bad = ok + [PodPlacement(pod_set="m", index=2, node="n", gpus=(0,), gpu_fraction=0.25)]
    assert inv.check_gpu_fractions(bad) == ["GPU 0 on node n is 1.25 used (> 1)"]
    whole_on_shared = ok[:1] + [PodPlacement(pod_set="w", index=0, node="n", gpus=(0,))]
    assert inv.check_gpu_fractions(whole_on_shared) != []


def adm(name: str, q: str) -> Admission:
    return Admission(workload=name, cluster_queue=q, flavors={}, borrowing=False)


def test_strict_fifo_checker_flags_admission_past_the_head() -> None:
    before = {"q": [("head", 5, 0.0), ("next", 5, 1.0)]}
    assert inv.check_strict_fifo(before, ["q"], [adm("head", "q")]) == []
    assert inv.check_strict_fifo(before, ["q"], [adm("next", "q")]) != []
    assert inv.check_strict_fifo(before, [], [adm("next", "q")]) == []  # BestEffortFIFO may pass
    assert inv.check_strict_fifo(before, ["q"], [adm("head", "q"), adm("next", "q")]) != []


def test_starvation_checker_flags_fitting_pending_workload() -> None:
    assert inv.check_no_starvation(["a", "b"], lambda n: False) == []
    assert inv.check_no_starvation(["a", "b"], lambda n: n == "b") == ["b is pending although it fits free capacity"]


class CapacityOracle:
    """Fits when the removed victims free at least ``need`` units; sizes per victim."""

    def __init__(self, sizes: dict[str, int], need: int) -> None:
        self.sizes, self.need, self.removed = sizes, need, set[str]()

    def remove(self, name: str) -> None:
        self.removed.add(name)

    def restore(self, name: str) -> None:
        self.removed.discard(name)

    def fits(self) -> bool:
        return sum(self.sizes[n] for n in self.removed) >= self.need


def cand(name: str, prio: int, *, other: bool = False, at: float = 0.0, preemptible: bool = True) -> Candidate:
    return Candidate(name, "other" if other else "q", prio, 0.0, at, other, preemptible=preemptible)


LOWER = PreemptionPolicy(within_cluster_queue=WithinClusterQueue.LOWER_PRIORITY,
                         reclaim_within_cohort=ReclaimWithinCohort.LOWER_PRIORITY)


def check(victims: list[Candidate], sizes: dict[str, int], need: int) -> list[str]:
    return inv.check_preemption(policy=LOWER, preemptor_priority=10, preemptor_ts=0.0, victims=victims,
                                sim=CapacityOracle(sizes, need))


def test_preemption_checker_accepts_minimal_ordered_allowed_victims() -> None:
    assert check([cand("x", 1, other=True), cand("y", 1, at=5), cand("z", 1, at=2)],
                 {"x": 1, "y": 1, "z": 1}, 3) == []


def test_preemption_checker_flags_disallowed_victims() -> None:
    assert any("not allowed" in v for v in check([cand("eq", 10)], {"eq": 1}, 1))
    assert any("not preemptible" in v for v in check([cand("np", 1, preemptible=False)], {"np": 1}, 1))


def test_preemption_checker_flags_wrong_order() -> None:
    out = check([cand("older", 1, at=1), cand("newer", 1, at=5)], {"older": 1, "newer": 1}, 2)
    assert any("order" in v for v in out)
    out = check([cand("high", 5), cand("low", 1)], {"high": 1, "low": 1}, 2)
    assert any("order" in v for v in out)


def test_preemption_checker_flags_more_victims_than_needed_and_too_few() -> None:
    out = check([cand("a", 1, at=2), cand("b", 1, at=1)], {"a": 2, "b": 2}, 2)
    assert any("not needed" in v for v in out)
    assert any("do not free enough" in v for v in check([cand("a", 1)], {"a": 1}, 2))
