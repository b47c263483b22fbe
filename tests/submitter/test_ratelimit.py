"""Submission pacing on a real nats-server: a workspace's rate is a burst admitted at once, then one slot per
``60 / rate`` seconds, reserved in order; a paced submission reads back its own slot; the backlog is bounded."""

from __future__ import annotations

import uuid

import pytest

from taugrid.bus import Bus
from taugrid.core.limits import DEFAULT_SUBMISSIONS_PER_MINUTE
from taugrid_services.submitter.ratelimit import Backlogged, Pacer


def workspace() -> str:
    return f"ws-{uuid.uuid4().hex[:8]}"


async def test_the_rate_is_admitted_at_once_then_one_slot_per_interval(bus: Bus) -> None:
    pacer, ws, now = Pacer(bus), workspace(), 1_000_000.0
    waits = [await pacer.reserve(ws, f"s{i}", per_minute=3, now=now) for i in range(5)]
    assert waits == [0.0, 0.0, 0.0, 20.0, 40.0]
    assert await pacer.reserve(ws, "later", per_minute=3, now=now + 100) == 0.0  # slots freed as time passed


async def test_a_paced_submission_reads_back_its_own_slot(bus: Bus) -> None:
    pacer, ws, now = Pacer(bus), workspace(), 2_000_000.0
    for i in range(4):
        await pacer.reserve(ws, f"p{i}", per_minute=3, now=now)
    assert await pacer.due("p3", now=now + 5) == pytest.approx(15.0)
    assert await pacer.due("p3", now=now + 20) == 0.0  # its slot has come
    assert await pacer.due("p0", now=now) == 0.0  # never paced


async def test_a_workspace_waits_with_at_most_its_backlog(bus: Bus) -> None:
    pacer, ws, now = Pacer(bus, max_backlog=2), workspace(), 3_000_000.0
    assert [await pacer.reserve(ws, f"b{i}", per_minute=3, now=now) for i in range(5)] == [0, 0, 0, 20, 40]
    with pytest.raises(Backlogged) as full:
        await pacer.reserve(ws, "b5", per_minute=3, now=now)
    assert (full.value.ahead, full.value.wait_s) == (2, 60.0)
    assert await pacer.reserve(ws, "b6", per_minute=3, now=now + 20) == 40.0  # refused ones reserved nothing


async def test_unlimited_reserves_nothing(bus: Bus) -> None:
    pacer, ws = Pacer(bus), workspace()
    assert [await pacer.reserve(ws, f"u{i}", per_minute=0) for i in range(3)] == [0.0] * 3


async def test_the_default_rate_admits_a_2000_run_sweep_whole(bus: Bus) -> None:
    pacer, ws, now = Pacer(bus), workspace(), 4_000_000.0
    waits = [await pacer.reserve(ws, f"w{i}", per_minute=DEFAULT_SUBMISSIONS_PER_MINUTE, now=now)
             for i in range(2000)]
    assert set(waits) == {0.0}
    assert await pacer.reserve(ws, "w2000", per_minute=DEFAULT_SUBMISSIONS_PER_MINUTE, now=now) == pytest.approx(0.03)
