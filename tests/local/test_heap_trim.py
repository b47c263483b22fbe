"""The local cluster gives a drained backlog's C heap back (``LocalCluster._trim_after_drain``): a heap trim when
what it holds falls to a quarter of a peak of at least ``TRIM_PEAK`` workloads, once a backlog, never per tick; and
when it holds nothing after at least ``TRIM_PEAK`` workloads ended since the last trim, or after a trim made while
some of a backlog was still held. Each trim first has the engine's empty queues drop what the backlog left there
(``Engine.settle_idle``, tests/admission/test_engine_cost.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from taugrid.local import controller
from taugrid.local.controller import TRIM_PEAK, LocalCluster


def test_a_drained_backlog_is_trimmed_once_and_a_small_one_never(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(controller.heap, "trim", lambda: trims.append(1) or True)
    settled: list[int] = []
    recycle_checks: list[int] = []
    cluster = SimpleNamespace(wls={}, _held_peak=0, _ended_since_trim=0, _drain_owed=False,
                              admitter=SimpleNamespace(settle_idle=lambda: settled.append(1) or 0),
                              _recycle_if_swollen=lambda: recycle_checks.append(len(cluster.wls)))

    def tick(held: int) -> None:
        cluster.wls = dict.fromkeys(range(held))
        LocalCluster._trim_after_drain(cluster)  # type: ignore[arg-type]

    for held in (10, TRIM_PEAK - 1, 0):  # a peak under TRIM_PEAK is not worth a trim
        tick(held)
    assert trims == []
    for held in (4 * TRIM_PEAK, 2 * TRIM_PEAK, TRIM_PEAK + 1):  # not yet down to a quarter
        tick(held)
    assert (trims, cluster._held_peak) == ([], 4 * TRIM_PEAK)
    tick(TRIM_PEAK)  # a quarter of the peak: trimmed once, the peak starts again from what is held
    assert (trims, cluster._held_peak) == ([1], TRIM_PEAK)
    for held in (TRIM_PEAK, TRIM_PEAK // 2, TRIM_PEAK // 4 + 1):
        tick(held)
    assert trims == [1]
    tick(TRIM_PEAK // 4)  # a quarter of the new peak of TRIM_PEAK
    assert (trims, cluster._held_peak) == ([1, 1], TRIM_PEAK // 4)
    tick(TRIM_PEAK // 8)  # the peak under TRIM_PEAK now: no trim until nothing is held
    assert trims == [1, 1]
    tick(0)  # the backlog's last workload ended: trimmed once more (its last queues are empty only now)
    assert (trims, settled, recycle_checks) == ([1, 1, 1], [1, 1, 1], [0])  # only then: nothing held
    for held in (0, 0, 0):  # an idle cluster is not trimmed tick after tick
        tick(held)
    assert (trims, settled, recycle_checks) == ([1, 1, 1], [1, 1, 1], [0])


def test_an_idle_cluster_is_trimmed_once_after_many_runs_none_held_long(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(controller.heap, "trim", lambda: trims.append(1) or True)
    cluster = SimpleNamespace(wls={}, _held_peak=0, _ended_since_trim=0, _drain_owed=False,
                              admitter=SimpleNamespace(settle_idle=lambda: 0), _recycle_if_swollen=lambda: None)

    def tick(held: int, ended: int) -> None:
        cluster.wls = dict.fromkeys(range(held))
        cluster._ended_since_trim += ended
        LocalCluster._trim_after_drain(cluster)  # type: ignore[arg-type]

    tick(0, TRIM_PEAK - 1)  # idle, but too few ended
    tick(3, 5)  # enough ended, but three still held
    assert trims == []
    tick(0, 0)  # idle after TRIM_PEAK + 4 ended: trimmed, the count starts again
    assert (trims, cluster._ended_since_trim) == ([1], 0)
    for _ in range(3):  # idle tick after tick: not trimmed again
        tick(0, 0)
    assert trims == [1]


@pytest.mark.parametrize(("started", "now", "recycled"), [(50.0, 110.0, True), (50.0, 73.0, False),
                                                           (None, 110.0, False)])
def test_a_drained_backlog_that_left_the_process_swollen_recycles_it(
        monkeypatch: pytest.MonkeyPatch, started: float | None, now: float, recycled: bool) -> None:
    """``RECYCLE_ABOVE_MB`` (24) above what it held once started: the service is asked to start afresh; less, or
    no baseline (the cluster was not started as the service starts it), it is not."""
    asked: list[str] = []
    monkeypatch.setattr(controller, "resident_mb", lambda: now)
    cluster = SimpleNamespace(recycle=asked.append, started_mb=started)
    LocalCluster._recycle_if_swollen(cluster)  # type: ignore[arg-type]
    assert len(asked) == int(recycled)
    if recycled:
        assert asked[0] == ("a drained backlog left the local cluster at 110 MB resident, 60 MB above its start; "
                            "nothing is held")


def test_resident_memory_is_this_processs_own() -> None:
    import psutil

    assert controller.resident_mb() == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.2)
    assert controller.resident_mb() > 10  # an interpreter with the local cluster's modules loaded
