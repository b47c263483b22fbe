"""Whose fault a failed attempt was, from the node's health record (pure): the order in which the failure and
the node's fault reach recovery does not change the answer."""

from __future__ import annotations

from typing import Any

from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.health.blame import blame, may_wait
from taugrid.health.wire import ConditionState, NodeState


def node(*, last_sample: float, fault_since: float | None = None, severity: int = 4) -> NodeState:
    st = NodeState(node="gpu-a", last_sample=last_sample)
    if fault_since is not None:
        st.conditions["GpuXidError/0"] = ConditionState(type="GpuXidError", gpu=0, status="True", reason="Xid79",
                                                        message="GPU 0: XID 79", severity=severity, latched=True,
                                                        since=fault_since)
    return st


def test_a_failure_before_the_nodes_next_sample_waits_for_it() -> None:
    assert blame(node(last_sample=99.0), failed_at=100.0, now=101.0, settle_s=10).verdict == "wait"


def test_a_drain_grade_fault_raised_just_after_the_failure_blames_the_node() -> None:
    b = blame(node(last_sample=102.0, fault_since=102.0), failed_at=100.0, now=103.0, settle_s=10)
    assert (b.verdict, b.condition, b.message) == ("node", "GpuXidError", "GPU 0: XID 79")


def test_a_fault_seen_before_the_failure_blames_the_node_too() -> None:
    assert blame(node(last_sample=90.0, fault_since=90.0), failed_at=100.0, now=100.5, settle_s=10).verdict == "node"


def test_a_clean_sample_after_the_failure_leaves_it_to_the_run() -> None:
    assert blame(node(last_sample=101.0), failed_at=100.0, now=101.5, settle_s=10).verdict == "run"


def test_a_minor_condition_or_one_long_after_the_failure_is_not_the_cause() -> None:
    assert blame(node(last_sample=101.0, fault_since=101.0, severity=2), failed_at=100.0, now=102,
                 settle_s=10).verdict == "run"
    assert blame(node(last_sample=200.0, fault_since=200.0), failed_at=100.0, now=201, settle_s=10).verdict == "run"


def test_a_node_no_agent_watches_leaves_it_to_the_run_and_the_wait_is_bounded() -> None:
    assert blame(None, failed_at=100.0, now=100.1, settle_s=10).verdict == "run"
    assert blame(node(last_sample=50.0), failed_at=100.0, now=111.0, settle_s=10).verdict == "run"


def run(**kw: Any) -> ResolvedRun:
    return ResolvedRun(run_id="r", submission_id="s", workspace="w", namespace="n", name="r", **kw)


def test_only_a_sudden_death_on_the_nodes_gpus_or_across_nodes_waits_for_a_sample() -> None:
    gpu = run(resources=Resources(gpu=1))
    assert may_wait(gpu, "app_error") and may_wait(gpu, "unknown")
    assert may_wait(run(resources=Resources(gpu_fraction=0.5)), "app_error")
    assert may_wait(run(nodes=2), "app_error") and may_wait(run(workers=2), "app_error")
    assert not may_wait(run(), "app_error")  # no GPU, one node: no node fault kills it unseen
    for settled in ("oom", "timeout", "hang", "config", "cancelled", "preempted", "evicted"):
        assert not may_wait(gpu, settled), settled


def test_a_failure_that_may_not_wait_still_blames_a_fault_already_on_record() -> None:
    assert blame(node(last_sample=99.0), failed_at=100.0, now=100.1, settle_s=0).verdict == "run"
    assert blame(node(last_sample=99.0, fault_since=99.0), failed_at=100.0, now=100.1, settle_s=0).verdict == "node"
