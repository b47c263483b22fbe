"""The node agent's work per tick: sample the node, publish ``node.<node>.sample`` when the monitor can learn
from it (a change, a held node, else a heartbeat: ``health.change``), validate and repair when asked.

The monitor asks for validation by setting ``validation_wanted_since`` in the node's ``node_state`` record;
the agent answers once per request on ``node.<node>.validation``. Probe calls run in a worker thread with a
timeout (a degrading GPU can hang NVML, gpu-health.md §8); while one is still stuck, later ticks skip instead
of piling up threads. A probe that says it does not block (``blocks = False``: the declared stand-in) is sampled
inline.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping

import msgspec

from taugrid.bus.connection import Bus
from taugrid.core.contracts import NodeSample
from taugrid.core.events import node_subject
from taugrid.core.ids import token
from taugrid.gpulib import nvml_library_missing
from taugrid.health.change import Publisher, Thermal
from taugrid.health.ib import read_ports
from taugrid.health.kmsg import KmsgReader
from taugrid.health.monitor import read_state, state_key
from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import DeclaredProbe, HealthProbe, validate_node
from taugrid.health.smi import amd_probe, gaudi_probe
from taugrid.health.wire import NodeRepair, NodeState, NodeValidation
from taugrid.settings import LocalSettings

log = logging.getLogger("taugrid.health.agent")


def node_name(given: LocalSettings) -> str:
    """``TAU_NODE_NAME``, else the host name."""
    return given.node_name or socket.gethostname()


def probe(given: LocalSettings, *, kmsg_path: str = "/dev/kmsg") -> HealthProbe:
    """The GPUs ``TAU_DECLARED_GPUS`` declares; else NVML's where NVIDIA's library loads; else AMD's or Gaudi's
    where their tool is on the machine (``health.smi``); else NVML's, which reports "no GPUs: …". Chosen here,
    above the probes: ``nvml`` and ``smi`` build on ``probe``, so the choice cannot live in ``probe``."""
    if given.declared_gpus:
        return DeclaredProbe.from_spec(given.declared_gpus)
    if nvml_library_missing():
        vendor = next((p for p in (amd_probe(), gaudi_probe()) if p.available()), None)
        if vendor is not None:
            return vendor
    return NvmlProbe(kmsg=KmsgReader.open_if_readable(kmsg_path))


async def publish_sample(bus: Bus, sample: NodeSample) -> int:
    return await bus.publish(
        node_subject(sample.node, "sample"), sample, event_type="sample", family="node",
        ce_subject=sample.node,
        msg_id=f"{token(sample.node)}.sample.{int(sample.time * 1000)}")


class NodeAgent:
    def __init__(self, bus: Bus, probe: HealthProbe, node: str, *, probe_timeout_s: float = 30.0,
                 ib_root: str | None = None, repairs: dict[str, RepairStep] | None = None,
                 heartbeat_s: float = 0.0, thermal: Thermal | None = None) -> None:
        """``ib_root``: the sysfs tree of InfiniBand ports to read with each sample (``health.ib``); None: none.
        ``repairs``: step name → how this node carries it out (default ``REPAIRS``; add or replace steps).
        ``heartbeat_s``: publish only what changed, and a heartbeat this often (``health.change``); 0: publish
        every sample. ``thermal``: the monitor's thermal thresholds, which a temperature is judged against."""
        self.bus, self.probe, self.node = bus, probe, node
        self.publisher = Publisher(node, heartbeat_s=heartbeat_s, thermal=thermal)
        self.repairs = {**REPAIRS, **(repairs or {})}
        self.ib_root = ib_root
        self.probe_timeout_s = probe_timeout_s
        self._inflight: asyncio.Future[NodeSample] | None = None
        self._validated_for = 0.0
        self._repaired_for = 0.0

    async def tick(self, states: Mapping[str, NodeState] | None = None) -> NodeSample | None:
        """Sample the node, publish the sample if the monitor can learn from it, then carry out a validation or
        repair step the monitor asks for. ``states``: ``node_state``'s records by key where the caller keeps
        them current (the pool watches the bucket); else this node's record is read. Returns the sample
        published (None: none was, because nothing changed or the probe is stuck)."""
        state = states.get(state_key(self.node)) if states is not None else (
            await read_state(self.bus, self.node))[0]
        sample = await self.sample()
        published = None
        if sample is not None and self.publisher.why(sample, state):
            if self.publisher.heartbeat_s:
                sample = msgspec.structs.replace(sample, heartbeat_s=self.publisher.heartbeat_s)
            await publish_sample(self.bus, sample)
            self.publisher.published(sample)
            published = sample
        await self.validate_if_asked(state)
        await self.repair_if_asked(state)
        return published

    async def sample(self) -> NodeSample | None:
        if not getattr(self.probe, "blocks", True) and self.ib_root is None:
            # a probe that reads nothing cannot hang: handing it to a worker thread cost three times its sample
            # (the local pool's declared nodes, 640 of them in Kueue's TAS scenario)
            return self._take()
        if self._inflight is not None and not self._inflight.done():
            log.warning("previous GPU probe still running after %.0fs; skipping this sample",
                        self.probe_timeout_s)
            return None
        self._inflight = asyncio.ensure_future(asyncio.to_thread(self._take))
        try:
            return await asyncio.wait_for(asyncio.shield(self._inflight), timeout=self.probe_timeout_s)
        except TimeoutError:
            log.error("GPU probe did not answer within %.0fs", self.probe_timeout_s)
            return None

    def _take(self) -> NodeSample:
        sample = self.probe.sample(self.node)
        if self.ib_root is None:
            return sample
        return msgspec.structs.replace(sample, ib_ports=read_ports(self.ib_root))

    async def validate_if_asked(self, state: NodeState | None = None) -> NodeValidation | None:
        if state is None:
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

    async def repair_if_asked(self, state: NodeState | None) -> NodeRepair | None:
        """Carry out the repair step the monitor asked for (``health.repair``), once, and report its outcome."""
        if state is None or not state.repair_wanted or state.repair_wanted_since <= self._repaired_for:
            return None
        step, gpus = state.repair_wanted, list(state.repair_gpus)
        ok, outcome = await asyncio.to_thread(carry_out, self.probe, step, gpus, self.repairs)
        result = NodeRepair(node=self.node, step=step, ok=ok, outcome=outcome, attempt=state.repairs, gpus=gpus,
                            time=time.time())
        await self.bus.publish(
            node_subject(self.node, "repair"), result, event_type="repair", family="node", ce_subject=self.node,
            msg_id=f"{token(self.node)}.repair.{state.repairs}")
        self._repaired_for = state.repair_wanted_since
        log.warning("repair %s %s: %s", step, "done" if ok else "FAILED", outcome)
        return result


RepairStep = Callable[[HealthProbe, list[int]], tuple[bool, str]]


def gpu_reset(probe: HealthProbe, gpus: list[int]) -> tuple[bool, str]:
    """Through the probe (nvidia-smi, or the stand-in's reset), never under a running process."""
    reset = getattr(probe, "reset_gpu", None)
    if reset is None or not gpus:
        return False, "this probe cannot reset GPUs"
    results = [reset(g) for g in gpus]
    return all(ok for ok, _ in results), "; ".join(outcome for _, outcome in results)


def node_reboot(probe: HealthProbe, gpus: list[int]) -> tuple[bool, str]:
    """Only a probe that can reboot does (the stand-ins); a real machine's agent asks and never reboots its host
    behind its owner's back (on Kubernetes the actuator turns the request into kured's or medik8s's)."""
    reboot = getattr(probe, "reboot", None)
    if reboot is None:
        return False, "reboot requested: reboot this machine by hand (the node stays cordoned until it validates)"
    ok, outcome = reboot()
    return bool(ok), str(outcome)


REPAIRS: dict[str, RepairStep] = {"gpu-reset": gpu_reset, "node-reboot": node_reboot}


def carry_out(probe: HealthProbe, step: str, gpus: list[int],
              repairs: dict[str, RepairStep] | None = None) -> tuple[bool, str]:
    """One repair step on this node; a step this agent does not know is reported as not done."""
    run = (REPAIRS if repairs is None else repairs).get(step)
    if run is None:
        return False, f"unknown repair step {step!r} on this node"
    try:
        return run(probe, gpus)
    except Exception as exc:  # a failing step is an outcome to report, not a dead agent
        log.exception("repair step %s failed", step)
        return False, f"{step} raised {exc!r}"
