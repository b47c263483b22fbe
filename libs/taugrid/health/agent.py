"""The node agent's work per tick: sample the node, publish ``node.<node>.sample``, validate when asked.

The monitor asks for validation by setting ``validation_wanted_since`` in the node's ``node_state`` record;
the agent answers once per request on ``node.<node>.validation``. Probe calls run in a worker thread with a
timeout (a degrading GPU can hang NVML, gpu-health.md §8); while one is still stuck, later ticks skip instead
of piling up threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from taugrid.bus.connection import Bus
from taugrid.core.contracts import NodeSample
from taugrid.core.events import node_subject
from taugrid.core.ids import token
from taugrid.health.monitor import read_state
from taugrid.health.probe import HealthProbe, make_probe, validate_node
from taugrid.health.wire import NodeValidation

log = logging.getLogger("taugrid.health.agent")


def node_name(env: dict[str, str] | None = None) -> str:
    e = os.environ if env is None else env
    return e.get("TAU_NODE_NAME") or socket.gethostname()


def probe_from_env(env: dict[str, str] | None = None) -> HealthProbe:
    e = os.environ if env is None else env
    return make_probe(e.get("TAU_DECLARED_GPUS") or None)


async def publish_sample(bus: Bus, sample: NodeSample) -> int:
    return await bus.publish(
        node_subject(sample.node, "sample"), sample, event_type="sample", family="node",
        ce_subject=sample.node,
        msg_id=f"{token(sample.node)}.sample.{int(sample.time * 1000)}")


class NodeAgent:
    def __init__(self, bus: Bus, probe: HealthProbe, node: str, *, probe_timeout_s: float = 30.0) -> None:
        self.bus, self.probe, self.node = bus, probe, node
        self.probe_timeout_s = probe_timeout_s
        self._inflight: asyncio.Future[NodeSample] | None = None
        self._validated_for = 0.0

    async def tick(self) -> NodeSample | None:
        sample = await self.sample()
        if sample is not None:
            await publish_sample(self.bus, sample)
        await self.validate_if_asked()
        return sample

    async def sample(self) -> NodeSample | None:
        if self._inflight is not None and not self._inflight.done():
            log.warning("previous GPU probe still running after %.0fs; skipping this sample",
                        self.probe_timeout_s)
            return None
        self._inflight = asyncio.ensure_future(asyncio.to_thread(self.probe.sample, self.node))
        try:
            return await asyncio.wait_for(asyncio.shield(self._inflight), timeout=self.probe_timeout_s)
        except TimeoutError:
            log.error("GPU probe did not answer within %.0fs", self.probe_timeout_s)
            return None

    async def validate_if_asked(self) -> NodeValidation | None:
        state, _ = await read_state(self.bus, self.node)
        wanted = state.validation_wanted_since if state is not None else 0.0
        if state is None or not wanted or wanted <= self._validated_for:
            return None
        ok, detail = await asyncio.to_thread(validate_node, self.probe, expected_gpus=state.expected_gpus)
        result = NodeValidation(node=self.node, ok=ok, detail=detail, time=time.time(),
                                gpus=state.expected_gpus)
        await self.bus.publish(
            node_subject(self.node, "validation"), result, event_type="validation", family="node",
            ce_subject=self.node, msg_id=f"{token(self.node)}.validation.{int(wanted * 1000)}")
        self._validated_for = wanted
        log.info("validation %s: %s", "passed" if ok else "FAILED", detail)
        return result
