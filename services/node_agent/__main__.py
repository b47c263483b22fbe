"""``python -m taugrid_services.node_agent``.

Environment: ``TAU_NODE_NAME`` (default: hostname), ``TAU_NODE_SAMPLE_INTERVAL`` seconds (default 5),
``TAU_NODE_HEARTBEAT_INTERVAL`` seconds (default 60: a sample nothing judged changed in is published only this
often, ``health.change``),
``TAU_DECLARED_GPUS`` ("2" or "2x80000": declared GPUs instead of NVML, for simulation), ``TAU_IB_SYSFS``
(the InfiniBand ports' sysfs tree, default ``/sys/class/infiniband``; empty: none). When the platform
declares ``local.nodes`` (the local backend's pool), one agent samples each of them under its own name
(``health.pool``).
"""

from __future__ import annotations

import logging

from taugrid.health.agent import NodeAgent, node_name, probe
from taugrid.health.change import Thermal
from taugrid.health.pool import AgentPool
from taugrid.service import Service, main

log = logging.getLogger("taugrid.node_agent")


async def start(svc: Service) -> None:
    local, health = svc.settings.local, svc.settings.health
    thermal = Thermal(health.thermal_c, health.thermal_clear_c)
    agent = NodeAgent(svc.bus, probe(local), node_name(local), ib_root=health.ib_sysfs or None,
                      heartbeat_s=health.heartbeat_interval_s, thermal=thermal)
    interval = health.sample_interval_s
    first = await agent.sample()
    if first is not None:
        log.info("node %s: %d GPU(s) via %s %s", agent.node, len(first.gpus), first.gpu_source, first.message)

    pool = AgentPool(svc.bus, machine=agent.node, machine_probe=lambda: agent.probe,
                     heartbeat_s=health.heartbeat_interval_s, thermal=thermal, watch_states=True)

    async def close_at_stop() -> None:
        await svc.stopping.wait()
        await pool.close()

    svc.background(close_at_stop())
    pool.agents[agent.node] = agent

    async def tick() -> None:
        await pool.tick()

    svc.every(interval, tick)


if __name__ == "__main__":
    main("node-agent", start)
