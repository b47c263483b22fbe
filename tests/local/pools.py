"""Shared set-up of the local node-pool tests: a ``LocalCluster`` on a private bus under a given platform (one
machine's worth of CPU and memory, its GPUs the platform's ``local.nodes``), and the tick-until-true loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.local.controller import LocalCluster
from tests.inprocess import private_server


@contextlib.asynccontextmanager
async def pool_cluster(tmp_path: Path, platform: str, *, name: str,
                       drain_grace_s: float = 30.0) -> AsyncIterator[tuple[Bus, LocalCluster]]:
    """The platform stored, the cluster loaded from it; its kubelet closed afterwards. ``TAU_LOCAL_SIMULATE``,
    when a test sets it first, makes the pods simulated."""
    async with private_server(tmp_path, name=name) as (_url, bus):
        await platformstore.put_text(bus, platform)
        cluster = LocalCluster(bus, data_dir=tmp_path, node="machine", capacity={"cpu": 4.0, "memory": float(8 << 30)},
                               gpu_count=0, drain_grace_s=drain_grace_s)
        await cluster.load()
        try:
            yield bus, cluster
        finally:
            await cluster.kubelet.close()


def where(c: LocalCluster) -> dict[str, Any]:
    """Each workload's state and its pods' nodes and phases (what a failed ``settle`` shows)."""
    return {n: (w.state, [(p.node, p.phase) for p in w.pods]) for n, w in c.wls.items()}


async def settle(c: LocalCluster, until: Callable[[], Any], timeout: float = 30, *,
                 show: Callable[[LocalCluster], Any] = where) -> None:
    """Tick the cluster until ``until()`` holds; after ``timeout`` seconds fail showing ``show(c)``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await c.tick()
        if until():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(show(c))
