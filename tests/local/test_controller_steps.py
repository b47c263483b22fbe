"""How many of the local cluster's per-workload steps (starts, ends) are under way at once: each holds its
workload's Job, Workload and pods as dicts from its first step to its last publish (issue 27's memory)."""

from __future__ import annotations

import asyncio

from taugrid.local.controller import LocalCluster


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
