"""Kueue's waitForPodsReady rules (``taugrid.local.podsready``), in-process with the clock as an argument.

Backoff cases are Kueue v0.19.2's ``pkg/util/wait/backoff_test.go`` TestBackoff_WaitTime (factor 2, no jitter) and
the defaults its ``RequeuingStrategy`` documents (60 s, 120 s, 240 s, ... capped at 3600 s); the deactivation case
is ``workload_controller_eviction_test.go``'s "exceeded the maximum number of requeue retries" (limit 0)."""

from __future__ import annotations

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.podsready import RequeuingStrategy, WaitForPodsReady
from taugrid.core.errors import ConfigError
from taugrid.local import podsready as rules


@pytest.mark.parametrize(("base", "cap", "count", "want"), [
    (0.001, 1, 0, 0.0),  # iteration zero returns zero
    (0.001, 1, -3, 0.0),  # negative iteration returns zero
    (0.001, 1, 4, 0.008),  # simple exponential: 1ms, 2ms, 4ms, 8ms
    (1, 5, 4, 5.0),  # caps at limit: 1s, 2s, 4s, 8s -> 5s
    (0.001, 1, 1000, 1.0),  # very large iteration still returns the cap
    (10, 5, 1, 10.0),  # the first wait is the base even above the cap (wait.Backoff.Step returns it unchanged)
    (10, 5, 2, 5.0),
])
def test_backoff_is_kueues_wait_time(base: float, cap: float, count: int, want: float) -> None:
    assert rules.backoff_s(count, base_s=base, max_s=cap) == pytest.approx(want)


def test_kueues_default_backoff_doubles_from_a_minute_up_to_an_hour() -> None:
    waits = [rules.backoff_s(n, base_s=60, max_s=3600) for n in range(1, 9)]
    assert waits == [60, 120, 240, 480, 960, 1920, 3600, 3600]


def test_no_cap_is_kueues_max_duration() -> None:
    assert rules.backoff_s(1000, base_s=0.001, max_s=0) == rules.UNCAPPED_S


def test_jitter_adds_at_most_a_ten_thousandth_of_the_wait() -> None:
    assert rules.backoff_s(2, base_s=60, max_s=3600, draw=0.5) == pytest.approx(120 * 1.00005)
    assert rules.backoff_s(2, base_s=60, max_s=3600, draw=0.999999) < 120 * 1.0001


def rule(**strategy: object) -> WaitForPodsReady:
    return WaitForPodsReady(timeout=300, requeuing_strategy=RequeuingStrategy.model_validate(strategy))


def test_a_workload_within_its_timeout_waits_until_admission_plus_timeout() -> None:
    assert rules.verdict(rule(), admitted_at=1000, count=0, now=1299, namespace="ns", name="wl") == \
        rules.Waiting(1300)


def test_a_workload_past_its_timeout_is_evicted_and_requeued_after_the_backoff() -> None:
    v = rules.verdict(rule(), admitted_at=1000, count=0, now=1300, namespace="ns", name="wl")
    assert v == rules.Evict(1, 1360, "Exceeded the PodsReady timeout ns/wl")
    v = rules.verdict(rule(), admitted_at=2000, count=1, now=2400, namespace="ns", name="wl")
    assert v == rules.Evict(2, 2520, "Exceeded the PodsReady timeout ns/wl")


def test_the_limit_counts_requeues_before_deactivation() -> None:
    limit0 = rule(backoff_limit_count=0)  # Kueue's case: the first timeout deactivates
    v = rules.verdict(limit0, admitted_at=0, count=0, now=300, namespace="ns", name="wl")
    assert isinstance(v, rules.Deactivate) and v.count == 0
    assert v.message.startswith(rules.DEACTIVATED_MESSAGE)
    limit2 = rule(backoff_limit_count=2)
    assert rules.verdict(limit2, admitted_at=0, count=1, now=300, namespace="ns", name="wl") == \
        rules.Evict(2, 420, "Exceeded the PodsReady timeout ns/wl")
    assert isinstance(rules.verdict(limit2, admitted_at=0, count=2, now=300, namespace="ns", name="wl"),
                      rules.Deactivate)


def test_the_check_off_decides_nothing() -> None:
    off = WaitForPodsReady(enable=False)
    assert rules.verdict(off, admitted_at=0, count=0, now=10**9, namespace="ns", name="wl") is None
    assert not rules.blocks_admission(off.model_copy(update={"block_admission": True}), 3)


def test_ready_counts_running_and_succeeded_pods() -> None:
    assert rules.pods_ready(["Running", "Succeeded"], 2)
    assert not rules.pods_ready(["Running", "Pending"], 2)
    assert not rules.pods_ready(["Running"], 2)  # a pod not created yet is not ready


def test_the_requeue_timestamp_is_eviction_or_creation() -> None:
    assert rules.queued_at(rule(), created=5, evicted_at=50) == 50
    assert rules.queued_at(rule(timestamp="Creation"), created=5, evicted_at=50) == 5


def test_block_admission_blocks_only_while_a_workload_is_not_ready() -> None:
    blocking = WaitForPodsReady(block_admission=True)
    assert rules.blocks_admission(blocking, 1)
    assert not rules.blocks_admission(blocking, 0)
    assert not rules.blocks_admission(WaitForPodsReady(), 1)


def test_platform_defaults_are_kueues_and_mistakes_name_line_and_fix() -> None:
    assert load_platform("cohorts: []\n").wait_for_pods_ready == WaitForPodsReady(
        enable=True, timeout=1800, block_admission=False, recovery_timeout=None,
        requeuing_strategy=RequeuingStrategy(timestamp="Eviction", backoff_limit_count=None,
                                             backoff_base_seconds=60, backoff_max_seconds=3600))
    with pytest.raises(ConfigError) as err:
        load_platform("cohorts: []\nwait_for_pods_ready:\n  timeout: 0\n"
                      "  requeuing_strategy: {backoff_base_seconds: -1, timestamp: Admission}\n")
    text = str(err.value)
    assert "platform.yaml:3: wait_for_pods_ready.timeout: a zero timeout would evict every workload" in text
    assert "fix: write how long its pods may take to become ready, e.g. 5m" in text
    assert "platform.yaml:4: wait_for_pods_ready.requeuing_strategy.backoff_base_seconds" in text
    assert "platform.yaml:4: wait_for_pods_ready.requeuing_strategy.timestamp" in text
    assert "fix: use 'Eviction' or 'Creation'" in text
    assert load_platform("wait_for_pods_ready: {recovery_timeout: 2m, timeout: 5m}\n"
                         ).wait_for_pods_ready.recovery_s() == 120
