"""How many of the local cluster's per-workload steps (starts, ends) are under way at once: each holds its
workload's Job, Workload and pods as dicts from its first step to its last publish (issue 27's memory)."""

from __future__ import annotations

import asyncio
import time

import msgspec

from taugrid.local.controller import LocalCluster, _simulated_end_due, _simulated_until_later, pending_pass_period
from taugrid.local.lanelock import LaneLock
from taugrid.local.state import LocalPod, LocalWorkload


async def test_steps_run_at_most_at_once_in_order_and_one_failure_stops_none() -> None:
    under_way, most, began = 0, 0, []

    async def step(i: int) -> None:
        nonlocal under_way, most
        began.append(i)
        under_way += 1
        most = max(most, under_way)
        await asyncio.sleep(0)
        under_way -= 1
        if i == 4:
            raise RuntimeError("a publish timed out")

    await LocalCluster._each((step(i) for i in range(10)), at_once=3)
    assert (most, began) == (3, list(range(10)))
    most, began = 0, []
    await LocalCluster._each(step(i) for i in range(10))
    assert (most, began) == (10, list(range(10)))  # unbounded: every step at once, as before


async def test_ends_due_while_the_lock_is_held_wait_in_one_pass_that_takes_them_all() -> None:
    """Simulated pods' ends come due one timer after another while the lock is held (an admission, a pass): one
    pass waits for the lock and takes them all, in order, once it has it, where a pass each piled up behind the lock
    (a task and a lock waiter each, 2,000 at once through the stack in Kueue's large-scale: issue 27's memory)."""
    c = LocalCluster.__new__(LocalCluster)  # the simulated ends' timer alone: no bus
    c.lock, c.wls = LaneLock(), {n: n for n in "abcd"}  # type: ignore[misc]
    c._sim_ends, c._sim_timer, c._sim_armed, c._sim_passes, c._sim_due, c._sim_queued = [], None, 0.0, set(), [], False
    passes: list[list[str]] = []

    async def supervise_many(wls: list[str]) -> None:
        passes.append(wls)

    c._supervise_many = supervise_many  # type: ignore[assignment,method-assign]
    async with c.lock:
        for name in ("a", "b", "a", "c"):
            c._sim_ends.append((time.time() - 1.0, name))  # due (as ``_supervise_at`` files it)
            c._sim_pass()  # its timer
        assert len(c._sim_passes) == 1
    await asyncio.gather(*c._sim_passes)
    assert passes == [["a", "b", "c"]]
    c._sim_ends.append((time.time() - 1.0, "d"))
    c._sim_pass()  # a later end: a pass of its own
    await asyncio.gather(*c._sim_passes)
    assert passes == [["a", "b", "c"], ["d"]]


def _running(*pods: LocalPod, state: str = "running") -> LocalWorkload:
    return LocalWorkload(name="j-a1", namespace="default", uid="r-a1", run_id="r", workspace="default", attempt=1,
                         job_json=msgspec.Raw(b"{}"), workload_json=msgspec.Raw(b"{}"), cluster_queue="cq", priority=0,
                         created=1.0, pods_wanted=len(pods), per_pod={"cpu": 1.0}, state=state, pods=list(pods))


def _pod(index: int, *, sim_end: float, added: bool = True, phase: str = "Running") -> LocalPod:
    return LocalPod(name=f"j-a1-{index}", index=index, obj_json=msgspec.Raw(b"{}"), phase=phase, added=added,
                    sim_end=sim_end)


def test_housekeeping_leaves_only_a_run_whose_simulated_pods_all_run_announced_until_later() -> None:
    """Housekeeping supervises every held run each pass but one whose simulated pods all run, announced (their ends'
    timer armed), until later: ``_supervise`` would find nothing to do for it. A pod due, unannounced, ended or
    real (logs to ship), or the run deleted, and it is supervised."""
    now = 1_000.0
    later, due = now + 5.0, now - 0.1
    assert _simulated_until_later(_running(_pod(0, sim_end=later), _pod(1, sim_end=later)), now) is True
    assert _simulated_until_later(_running(_pod(0, sim_end=later), _pod(1, sim_end=due)), now) is False
    assert _simulated_until_later(_running(_pod(0, sim_end=later, added=False)), now) is False
    assert _simulated_until_later(_running(_pod(0, sim_end=later), _pod(1, sim_end=due, phase="Succeeded")),
                                  now) is False
    assert _simulated_until_later(_running(_pod(0, sim_end=0.0)), now) is False  # a real process: its logs
    assert _simulated_until_later(_running(_pod(0, sim_end=later), state="deleted"), now) is False
    assert _simulated_until_later(_running(), now) is False
    # the end ``_supervise`` takes is the same rule: due once announced and its time is up, or deleted at once
    assert [_simulated_end_due(_running(), _pod(0, sim_end=t, added=a), now)
            for t, a in ((due, True), (due, False), (later, True))] == [True, False, False]
    assert _simulated_end_due(_running(state="deleted"), _pod(0, sim_end=later), now) is True


def test_the_pending_pass_costs_a_tenth_of_the_process_within_half_a_second_and_the_refresh_period() -> None:
    """Reasons and positions of every waiting run: a quick pass every 0.5 s, a long one (a deep backlog) ten times
    its duration later, yet never later than a waiting run's refresh period (3 s), so a new run's reason is late
    by at most that however long the pass."""
    assert [pending_pass_period(t) for t in (0.001, 0.1, 0.2, 0.66, 5.0)] == [0.5, 1.0, 2.0, 3.0, 3.0]
