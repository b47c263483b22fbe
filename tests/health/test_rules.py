"""The pure fault rules: each condition raised and cleared, hysteresis, blast radius, re-validation gate."""

from __future__ import annotations

import msgspec

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.health.rules import Fleet, Policy, evaluate, guard, plan, wants_cordon
from taugrid.health.wire import NodeState, NodeValidation

POLICY = Policy(clean_samples_to_release=2)


def gpu(i: int = 0, **kw: object) -> GpuSample:
    base = dict(memory_total_mb=80000, temperature_c=40, ecc_volatile_uncorrected=0,
                ecc_aggregate_uncorrected=0, remapped_rows_pending=False, remapped_rows_failure=False,
                pcie_replay_count=0)
    base.update(kw)
    return GpuSample(index=i, **base)  # type: ignore[arg-type]


def sample(t: float, gpus: list[GpuSample] | None = None, source: str = "declared",
           node: str = "n1") -> NodeSample:
    return NodeSample(node=node, time=t, cpus=8, memory_bytes=1 << 34,
                      gpus=[gpu(0), gpu(1)] if gpus is None else gpus, gpu_source=source)


class Node:
    """Drives one node's state through successive samples like the monitor does."""

    def __init__(self, policy: Policy = POLICY, fleet: Fleet | None = None) -> None:
        self.state: NodeState | None = None
        self.policy, self.fleet = policy, fleet or Fleet(total=10)

    def feed(self, s: NodeSample, validation: NodeValidation | None = None):
        p = plan(evaluate(self.state, s, policy=self.policy, validation=validation), policy=self.policy,
                 fleet=self.fleet)
        self.state = p.state
        return p

    def status(self, key: str) -> str:
        assert self.state is not None
        c = self.state.conditions.get(key)
        return c.status if c else "absent"


def test_healthy_samples_raise_nothing() -> None:
    node = Node()
    p = node.feed(sample(1))
    assert p.transitions == [] and p.actions == [] and p.state.verdict == "healthy"
    assert p.state.expected_gpus == 2


def test_evaluate_does_not_modify_the_previous_state() -> None:
    node = Node()
    node.feed(sample(1))
    before = msgspec.json.encode(node.state)
    evaluate(node.state, sample(2, [gpu(0, xid_events=[79]), gpu(1)]), policy=POLICY)
    assert msgspec.json.encode(node.state) == before


def test_fatal_xid_raises_condition_cordons_and_drains() -> None:
    node = Node()
    node.feed(sample(1))
    p = node.feed(sample(2, [gpu(0, xid_events=[79]), gpu(1)]))
    [cond] = p.transitions
    assert (cond.type, cond.status, cond.reason, cond.gpu) == ("GpuXidError", "True", "Xid79", 0)
    assert "fallen off the bus" in cond.message
    [action] = p.actions
    assert action.kind == "cordon" and action.drain and action.seq == 1
    assert p.state.verdict == "unhealthy" and p.state.cordoned


def test_app_xid_is_not_a_node_fault() -> None:
    node = Node()
    p = node.feed(sample(1, [gpu(0, xid_events=[13, 31, 43]), gpu(1)]))
    assert p.transitions == [] and p.actions == [] and p.state.verdict == "healthy"


def test_latched_xid_clears_only_after_clean_samples_and_a_passed_validation() -> None:
    node = Node()
    node.feed(sample(1, [gpu(0, xid_events=[48]), gpu(1)]))
    p = node.feed(sample(2))  # clean 1 of 2: still held, nothing asked yet
    assert node.status("GpuXidError/0") == "True" and not p.state.validation_wanted_since
    p = node.feed(sample(3))  # clean 2 of 2: the agent is asked to validate
    assert p.state.validation_wanted_since == 3 and p.actions == []
    stale = NodeValidation(node="n1", ok=True, detail="old", time=2.5)
    p = node.feed(sample(4), stale)  # a validation from before the request does not count
    assert p.actions == [] and node.status("GpuXidError/0") == "True"
    p = node.feed(sample(5), NodeValidation(node="n1", ok=True, detail="2 GPUs answer", time=4.5))
    assert [(t.type, t.status) for t in p.transitions] == [("GpuXidError", "False")]
    [action] = p.actions
    assert action.kind == "uncordon" and action.seq == 1 and "2 GPUs answer" in action.reason
    assert not p.state.cordoned and p.state.verdict == "healthy"


def test_failed_validation_keeps_the_node_cordoned_and_raises_a_condition() -> None:
    node = Node()
    node.feed(sample(1, [gpu(0, xid_events=[79]), gpu(1)]))
    node.feed(sample(2))
    node.feed(sample(3))
    p = node.feed(sample(4), NodeValidation(node="n1", ok=False, detail="GPU 0 reports no memory", time=3.5))
    assert node.status("GpuValidationFailed") == "True" and p.state.cordoned and p.actions == []
    assert p.state.clean_samples == 0
    # Later a validation passes: everything latched clears and the node comes back.
    node.feed(sample(5))
    node.feed(sample(6))
    p = node.feed(sample(7), NodeValidation(node="n1", ok=True, detail="ok", time=6.5))
    assert node.status("GpuValidationFailed") == "False" and node.status("GpuXidError/0") == "False"
    assert [a.kind for a in p.actions] == ["uncordon"]


def test_an_unclean_sample_restarts_the_clean_streak() -> None:
    node = Node()
    node.feed(sample(1, [gpu(0, xid_events=[79]), gpu(1)]))
    node.feed(sample(2))
    node.feed(sample(3))
    assert node.state is not None and node.state.validation_wanted_since == 3
    p = node.feed(sample(4, [gpu(0, temperature_c=95), gpu(1)]))
    assert p.state.clean_samples == 0 and not p.state.validation_wanted_since


def test_ecc_volatile_raises_and_aggregate_history_does_not() -> None:
    node = Node()
    p = node.feed(sample(1, [gpu(0, ecc_aggregate_uncorrected=7), gpu(1)]))  # lifetime history only
    assert p.transitions == []
    p = node.feed(sample(2, [gpu(0, ecc_aggregate_uncorrected=8), gpu(1)]))  # growth we watched
    assert [(t.type, t.reason) for t in p.transitions] == [
        ("GpuEccUncorrectable", "AggregateUncorrectedEccRising")]
    node2 = Node()
    p = node2.feed(sample(1, [gpu(0, ecc_volatile_uncorrected=2), gpu(1)]))
    assert [(t.type, t.status) for t in p.transitions] == [("GpuEccUncorrectable", "True")]
    assert p.actions[0].drain
    # Volatile errors persist until a reset: the node never counts as clean meanwhile.
    for t in (2, 3, 4):
        p = node2.feed(sample(t, [gpu(0, ecc_volatile_uncorrected=2), gpu(1)]))
        assert p.state.clean_samples == 0 and p.transitions == []


def test_remapped_rows_pending_and_failure_follow_the_signal() -> None:
    node = Node()
    p = node.feed(sample(1, [gpu(0, remapped_rows_pending=True), gpu(1, remapped_rows_failure=True)]))
    assert {(t.type, t.gpu, t.status) for t in p.transitions} == {
        ("GpuRemappedRowsPending", 0, "True"), ("GpuRemappedRowsFailure", 1, "True")}
    assert p.state.verdict == "unhealthy"
    p = node.feed(sample(2, [gpu(0, remapped_rows_pending=None), gpu(1, remapped_rows_failure=None)]))
    assert p.transitions == []  # unknown (NotSupported) neither raises nor clears
    p = node.feed(sample(3))
    assert {(t.type, t.status) for t in p.transitions} == {
        ("GpuRemappedRowsPending", "False"), ("GpuRemappedRowsFailure", "False")}


def test_thermal_hysteresis() -> None:
    node = Node()
    temps_and_status = [(89, "absent"), (90, "True"), (88, "True"), (86, "True"), (85, "False"),
                        (88, "False"), (None, "False"), (93, "True")]
    for t, (temp, want) in enumerate(temps_and_status, start=1):
        node.feed(sample(t, [gpu(0, temperature_c=temp), gpu(1)]))
        assert node.status("GpuThermal/0") == want, (temp, want)


def test_missing_gpu_against_the_high_water_mark_and_the_policy() -> None:
    node = Node()
    node.feed(sample(1, [gpu(0), gpu(1), gpu(2), gpu(3)]))
    p = node.feed(sample(2, [gpu(0), gpu(1), gpu(3)]))
    [cond] = p.transitions
    assert (cond.type, cond.status) == ("GpuMissing", "True") and "[2]" in cond.message
    p = node.feed(sample(3, [gpu(0), gpu(1), gpu(2), gpu(3)]))
    assert [(t.type, t.status) for t in p.transitions] == [("GpuMissing", "False")]
    declared = Node(Policy(expected_gpus=8))
    p = declared.feed(sample(1))
    assert [(t.type, t.status) for t in p.transitions] == [("GpuMissing", "True")]


def test_nvml_unavailable_only_where_gpus_were_expected() -> None:
    cpu_only = Node()
    p = cpu_only.feed(sample(1, [], source="none"))
    assert p.transitions == [] and p.state.verdict == "healthy"
    node = Node()
    node.feed(sample(1))
    p = node.feed(sample(2, [], source="none"))
    assert [(t.type, t.status) for t in p.transitions] == [("NvmlUnavailable", "True")]
    assert p.state.verdict == "unhealthy"
    p = node.feed(sample(3))
    assert [(t.type, t.status) for t in p.transitions] == [("NvmlUnavailable", "False")]


def test_pcie_replays_rising_fast_over_a_window() -> None:
    node = Node()
    node.feed(sample(0, [gpu(0, pcie_replay_count=100), gpu(1)]))
    p = node.feed(sample(30, [gpu(0, pcie_replay_count=200), gpu(1)]))
    assert p.transitions == []  # window not yet full: one burst cannot trip it
    p = node.feed(sample(60, [gpu(0, pcie_replay_count=200), gpu(1)]))
    [cond] = p.transitions
    assert (cond.type, cond.status) == ("PcieReplays", "True") and "100.0/min" in cond.message
    assert p.actions == [] and p.state.verdict == "degraded"  # alert only, no cordon
    p = node.feed(sample(120, [gpu(0, pcie_replay_count=210), gpu(1)]))
    assert [(t.type, t.status) for t in p.transitions] == [("PcieReplays", "False")]


def test_reset_pending_xid_cordons_without_draining() -> None:
    node = Node()
    p = node.feed(sample(1, [gpu(0, xid_events=[63]), gpu(1)]))
    [action] = p.actions
    assert action.kind == "cordon" and not action.drain and p.state.verdict == "degraded"
    p = node.feed(sample(2, [gpu(0, xid_events=[79]), gpu(1)]))  # escalation on a cordoned node
    assert [(a.kind, a.drain, a.seq) for a in p.actions] == [("cordon", True, 1)]
    assert [(t.type, t.reason) for t in p.transitions] == [("GpuXidError", "Xid79")]


def test_blast_radius_guard_budget() -> None:
    policy = Policy(max_cordoned=3, max_cordoned_fraction=0.2)
    assert guard(Fleet(total=10, cordoned=frozenset({"a"})), "n1", policy)[0]
    ok, why = guard(Fleet(total=10, cordoned=frozenset({"a", "b"})), "n1", policy)
    assert not ok and "2 of 10" in why and "budget 2" in why
    assert not guard(Fleet(total=100, cordoned=frozenset({"a", "b", "c"})), "n1", policy)[0]  # K caps 20 %
    assert guard(Fleet(total=1), "n1", policy)[0]  # a one-machine fleet may still protect itself
    assert not guard(Fleet(total=1), "n1", Policy(min_cordon_budget=0))[0]
    assert guard(Fleet(total=10, cordoned=frozenset({"a", "n1"})), "n1", policy)[0]  # itself is not "another"


def test_guard_withholds_cordon_and_drain_then_retries_when_budget_frees() -> None:
    node = Node(fleet=Fleet(total=5, cordoned=frozenset({"a"})))
    p = node.feed(sample(1, [gpu(0, xid_events=[79]), gpu(1)]))
    assert p.actions == [] and not p.state.cordoned and "blast-radius" in p.state.guard_blocked
    assert node.status("GpuXidError/0") == "True"  # the condition is still reported
    ev = evaluate(node.state, sample(2), policy=POLICY)
    assert wants_cordon(ev)
    node.fleet = Fleet(total=5)
    p = node.feed(sample(2))
    assert [(a.kind, a.drain) for a in p.actions] == [("cordon", True)] and p.state.guard_blocked == ""
