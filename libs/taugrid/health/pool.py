"""One node agent per node of the local pool (the platform's ``local.nodes``), each under its node's name.

The local backend's declared nodes have no hardware of their own: each gets a ``DeclaredProbe`` with its GPU
count and memory, so faults can be injected per node (tests, benchmarks, drills). A declared node that bears
this machine's name gets the machine's real probe instead. With no ``local.nodes`` there is one agent, this
machine, as before. The set follows platform revisions: agents of removed nodes stop reporting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from taugrid.bus.connection import Bus
from taugrid.bus.platformread import PlatformReader
from taugrid.config.platform import LocalNode
from taugrid.core import devices
from taugrid.core.errors import TemporaryError
from taugrid.core.quantity import parse_memory
from taugrid.health.agent import NodeAgent
from taugrid.health.probe import DeclaredProbe, HealthProbe

log = logging.getLogger("taugrid.health.pool")


def declared_probe(node: LocalNode) -> DeclaredProbe:
    """The node's GPUs as declared: its ``gpu_model``'s vendor and memory (absent: NVIDIA's, 80 GiB)."""
    model = devices.model(node.gpu_model or "")
    memory_mb = (int(parse_memory(node.gpu_memory)) >> 20 if node.gpu_memory
                 else model.memory_gib << 10 if model is not None else 81920)
    return DeclaredProbe(node.gpus, memory_mb, name=f"Declared GPU ({node.name})",
                         vendor=model.vendor if model is not None else "nvidia", model=node.gpu_model or "")


class AgentPool:
    def __init__(self, bus: Bus, *, machine: str, machine_probe: Callable[[], HealthProbe],
                 probe_timeout_s: float = 30.0) -> None:
        self.bus, self.machine, self.machine_probe = bus, machine, machine_probe
        self.probe_timeout_s = probe_timeout_s
        self.platforms = PlatformReader(bus)
        self.agents: dict[str, NodeAgent] = {}
        self._revision = -1

    async def refresh(self) -> None:
        """Match the agents to the platform's ``local.nodes`` (this machine alone when there are none)."""
        try:
            got = await self.platforms.get()
        except TemporaryError:
            got = None
        if got is not None and got[1] == self._revision and self.agents:
            return
        declared = {n.name: n for n in got[0].local.nodes} if got is not None else {}
        if got is not None:
            self._revision = got[1]
        wanted = set(declared) or {self.machine}
        for name in sorted(set(self.agents) - wanted):
            self.agents.pop(name).probe.close()
            log.info("node %s left the pool: its agent stops", name)
        for name in sorted(wanted - set(self.agents)):
            probe = self.machine_probe() if name == self.machine or name not in declared else declared_probe(
                declared[name])
            self.agents[name] = NodeAgent(self.bus, probe, name, probe_timeout_s=self.probe_timeout_s)
            log.info("node %s: agent started", name)

    async def tick(self) -> None:
        await self.refresh()
        for agent in list(self.agents.values()):
            await agent.tick()
