"""The local cluster's lock: a high-lane request is handed the lock before ordinary ones already waiting, each
lane keeps its arrival order, and a waiter cancelled at any point never leaves the lock held by nobody."""

from __future__ import annotations

import asyncio

import pytest

from taugrid.local.lanelock import LaneLock


async def _hold(lock: LaneLock, order: list[str], name: str, *, high: bool = False) -> None:
    async with lock.first(high):
        order.append(name)
        await asyncio.sleep(0)


async def test_a_high_lane_waiter_goes_before_ordinary_ones_that_came_first() -> None:
    lock, order = LaneLock(), []
    await lock.acquire()  # the control loop holds it
    tasks = [asyncio.create_task(_hold(lock, order, f"n{i}")) for i in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(_hold(lock, order, f"h{i}", high=True)) for i in range(2)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(_hold(lock, order, "n3")))
    await asyncio.sleep(0)
    lock.release()
    await asyncio.gather(*tasks)
    assert order == ["h0", "h1", "n0", "n1", "n2", "n3"]
    assert not lock.locked()


async def test_an_ordinary_newcomer_never_takes_a_lock_being_handed_over() -> None:
    lock, order = LaneLock(), []
    async with lock:
        waiting = asyncio.create_task(_hold(lock, order, "waiting"))
        await asyncio.sleep(0)
    late = asyncio.create_task(_hold(lock, order, "late"))  # arrives after the release, before the waiter runs
    await asyncio.gather(waiting, late)
    assert order == ["waiting", "late"]


async def test_a_cancelled_waiter_leaves_the_lock_to_the_next_or_free() -> None:
    lock, order = LaneLock(), []
    await lock.acquire()
    gone = asyncio.create_task(_hold(lock, order, "gone", high=True))
    kept = asyncio.create_task(_hold(lock, order, "kept"))
    await asyncio.sleep(0)
    gone.cancel()  # cancelled while waiting
    await asyncio.sleep(0)
    lock.release()
    await kept
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order == ["kept"] and not lock.locked()

    await lock.acquire()
    handed = asyncio.create_task(lock.acquire(high=True))
    await asyncio.sleep(0)
    lock.release()  # handed to `handed`...
    handed.cancel()  # ...which is cancelled before it runs: it passes the lock on (here: free)
    with pytest.raises(asyncio.CancelledError):
        await handed
    assert not lock.locked()
    await asyncio.wait_for(lock.acquire(), timeout=1)  # free for the next one
    lock.release()


def test_releasing_a_lock_not_held_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not held"):
        LaneLock().release()
