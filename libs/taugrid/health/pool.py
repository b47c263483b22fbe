"""One node agent per node of the local pool (the platform's ``local.nodes``), each under its node's name.

The local backend's declared nodes have no hardware of their own: each gets a ``DeclaredProbe`` with its GPU
count and memory, so faults can be injected per node (tests, benchmarks, drills). A declared node that bears
this machine's name gets the machine's real probe instead. With no ``local.nodes`` there is one agent, this
machine, as before. The set follows platform revisions: agents of removed nodes stop reporting.

Each agent needs its node's ``node_state`` record every tick (is the node held, is a validation or repair step
asked for): the pool keeps them all from one watch of the bucket (``StateWatch``), which the monitor writes only
when a sample was published, instead of reading one record per node per tick (640 reads every 5 s in Kueue's
TAS scenario); a pool of one agent watches its own record alone. Until the watch has caught up, and while it is
down, each agent reads its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.bus.platformread import PlatformReader
from taugrid.config.platform import LocalNode
from taugrid.core import devices
from taugrid.core.errors import TemporaryError
from taugrid.core.quantity import parse_memory
from taugrid.health.agent import NodeAgent
from taugrid.health.change import Thermal
from taugrid.health.monitor import BUCKET, state_key
from taugrid.health.probe import DeclaredProbe, HealthProbe
from taugrid.health.wire import NodeState

log = logging.getLogger("taugrid.health.pool")


def declared_probe(node: LocalNode) -> DeclaredProbe:
    """The node's GPUs as declared: its ``gpu_model``'s vendor and memory (absent: NVIDIA's, 80 GiB)."""
    model = devices.model(node.gpu_model or "")
    memory_mb = (int(parse_memory(node.gpu_memory)) >> 20 if node.gpu_memory
                 else model.memory_gib << 10 if model is not None else 81920)
    return DeclaredProbe(node.gpus, memory_mb, name=f"Declared GPU ({node.name})",
                         vendor=model.vendor if model is not None else "nvidia", model=node.gpu_model or "")


class StateWatch:
    """``node_state``'s records matching ``key_filter``, by key, as one watch of the bucket delivers them;
    ``current`` is None until the watch has handed out every stored record, and again while it is down (it
    restarts after a second)."""

    RETRY_S = 1.0

    def __init__(self, bus: Bus, key_filter: str = "node.>") -> None:
        self.bus, self.key_filter = bus, key_filter
        self.states: dict[str, NodeState] = {}
        self._caught_up = False
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> dict[str, NodeState] | None:
        return self.states if self._caught_up else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task, self._caught_up = None, False

    async def _follow(self) -> None:
        while True:
            try:
                async for key, value in kv.watch(self.bus, BUCKET, self.key_filter):
                    if (key, value) == kv.CAUGHT_UP:
                        self._caught_up = True
                    elif value is None:
                        self.states.pop(key, None)
                    else:
                        self._store(key, value)
            except TemporaryError as exc:
                log.warning("node_state watch stopped (%s): agents read their own records until it is back", exc)
            except Exception:  # the agents read their own records meanwhile: a watch's failure must not end them
                log.exception("node_state watch failed: agents read their own records until it is back")
            self._caught_up = False
            self.states.clear()
            await asyncio.sleep(self.RETRY_S)

    def _store(self, key: str, value: bytes) -> None:
        try:
            self.states[key] = msgspec.json.decode(value, type=NodeState)
        except msgspec.DecodeError as exc:
            log.warning("node_state %s undecodable, left out: %s", key, exc)
            self.states.pop(key, None)


class AgentPool:
    def __init__(self, bus: Bus, *, machine: str, machine_probe: Callable[[], HealthProbe],
                 probe_timeout_s: float = 30.0, heartbeat_s: float = 0.0, thermal: Thermal | None = None,
                 watch_states: bool = False) -> None:
        """``heartbeat_s``, ``thermal``: each agent's (``NodeAgent``). ``watch_states``: the agents' records come
        from one watch (``StateWatch``; ``close`` stops it); else each agent reads its own every tick."""
        self.bus, self.machine, self.machine_probe = bus, machine, machine_probe
        self.probe_timeout_s, self.heartbeat_s, self.thermal = probe_timeout_s, heartbeat_s, thermal
        self.watch_states = watch_states
        self.watch: StateWatch | None = None
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
            self.agents[name] = NodeAgent(self.bus, probe, name, probe_timeout_s=self.probe_timeout_s,
                                          heartbeat_s=self.heartbeat_s, thermal=self.thermal)
            log.info("node %s: agent started", name)
        if self.watch_states:
            await self._watch_for_agents()

    async def _watch_for_agents(self) -> None:
        """One agent (a machine's own, as on every node of a cluster) watches its own record alone: a watch of
        every record on each of a fleet's nodes would hand each of them every node's changes."""
        wanted = state_key(next(iter(self.agents))) if len(self.agents) == 1 else "node.>"
        if self.watch is not None and self.watch.key_filter == wanted:
            return
        if self.watch is not None:
            await self.watch.stop()
        self.watch = StateWatch(self.bus, wanted)
        self.watch.start()

    async def close(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
            self.watch = None

    async def tick(self) -> None:
        await self.refresh()
        for agent in list(self.agents.values()):
            await agent.tick(self.watch.current if self.watch is not None else None)
