"""The blast-radius guard on the local pool: a storm faulting more nodes than the cordon budget cordons only as
many as the budget allows; the local cluster keeps admitting on the rest, and the withheld nodes say why."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from taugrid.bus import platformstore
from taugrid.bus.consumer import ConsumerLoop
from taugrid.health.agent import NodeAgent
from taugrid.health.monitor import HealthMonitor, read_state
from taugrid.health.probe import DeclaredProbe
from taugrid.health.rules import Policy
from taugrid.local.controller import LocalCluster
from tests.inprocess import private_server, service_bus
from tests.local.test_pool import POOL_PLATFORM

NODES = [f"gpu-{c}" for c in "abcdef"]


async def test_a_storm_over_four_of_six_nodes_cordons_only_the_budget(tmp_path: Path) -> None:
    pool = "".join(f"    - {{name: {n}, gpus: 1}}\n" for n in NODES)
    platform = POOL_PLATFORM[:POOL_PLATFORM.index("local:")] + "local:\n  nodes:\n" + pool
    async with private_server(tmp_path, name="storm") as (url, bus):
        await platformstore.put_text(bus, platform)
        monitor_bus, cluster_bus, agent_bus = [await service_bus(url, n)
                                               for n in ("health-monitor", "local-cluster", "node-agent")]
        cluster = LocalCluster(cluster_bus, data_dir=tmp_path, node="machine", capacity={"cpu": 4.0, "memory": 8e9},
                               gpu_count=0)
        await cluster.load()
        policy = Policy(max_cordoned=2, max_cordoned_fraction=0.5)  # budget min(2, floor(0.5 * 6)) = 2
        health = ConsumerLoop(monitor_bus, stream="NODES", durable="health-monitor",
                              handler=HealthMonitor(monitor_bus, policy=policy).handle, fetch_timeout=0.2)
        nodes = ConsumerLoop(cluster_bus, stream="NODES", durable="local-cluster-nodes", handler=cluster.on_node,
                             fetch_timeout=0.2)
        tasks = [asyncio.create_task(loop.run()) for loop in (health, nodes)]
        probes = {n: DeclaredProbe(1) for n in NODES}
        agents = {n: NodeAgent(agent_bus, probes[n], n) for n in NODES}

        async def sample(node: str) -> None:
            before = health.handled
            await agents[node].tick()
            deadline = time.monotonic() + 10
            while health.handled == before and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        try:
            for n in NODES:
                await sample(n)
            storm = NODES[:4]
            for n in storm:
                probes[n].inject_ecc(0, volatile=1)
                await sample(n)
            deadline = time.monotonic() + 10
            while len(cluster.admitter.cordoned) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # nothing more arrives
            assert sorted(cluster.admitter.cordoned) == storm[:2]
            for n in storm[2:]:
                state, _ = await read_state(bus, n)
                assert state is not None and not state.cordoned and state.verdict == "unhealthy"
                assert state.guard_blocked.startswith("blast-radius guard: 2 of 6 node(s) already cordoned, budget 2")
        finally:
            for loop in (health, nodes):
                loop.stopping.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await cluster.kubelet.close()
            for b in (monitor_bus, cluster_bus, agent_bus):
                await b.close()
