"""Probes that read a node's GPUs and machine facts into a ``NodeSample``.

``NvmlProbe`` (``health.nvml``) reads NVML (nvidia-ml-py) plus, when readable, the kernel log for XIDs;
``DeclaredProbe`` reports declared GPUs for tests and simulation and lets them inject faults. ``validate_node`` is
the active check the health-monitor requires before it lets a cordoned node back.

Invariants: ``sample`` never raises. NVML missing, failing to initialise or finding no devices gives
``gpu_source="none"`` and the message ``"no GPUs: <why>"``. A counter NVML does not support on this GPU is
None (unknown), never 0 (healthy). A GPU that stops answering (GPU_IS_LOST) is left out of ``gpus`` and
named in ``message``, so the rules see the count drop.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Protocol

import msgspec
import psutil

from taugrid.core.contracts import GpuSample, NodeSample

log = logging.getLogger("taugrid.health.probe")



class GpuReading(msgspec.Struct, kw_only=True):
    source: str  # nvml | amd-smi | hl-smi | declared | none
    gpus: list[GpuSample] = msgspec.field(default_factory=list)
    message: str = ""
    vendor: str = ""  # whose GPUs (core.devices.VENDORS); "" with none
    model: str = ""  # core.devices.MODELS name where the probe knows it (declared nodes); else the GPUs' own name


class HealthProbe(Protocol):
    """Port: something that can read this node's GPUs."""

    def read_gpus(self, *, with_events: bool = True) -> GpuReading:
        """Current GPU readings; ``with_events`` also drains pending XID events into ``xid_events``."""
        ...

    def sample(self, node: str) -> NodeSample:
        """Machine facts plus ``read_gpus``; never raises."""
        ...

    def close(self) -> None: ...


class ActiveProbe(Protocol):
    """What a probe that can act on its GPUs adds (both built-in probes do)."""

    def exercise(self, indices: list[int]) -> tuple[bool | None, str]:
        """A short active check of these GPUs; ``None`` when none can run here."""
        ...

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        """Reset one GPU where no process holds it; (ok, outcome)."""
        ...


# A reading of this machine younger than this is reused: the local pool's declared nodes (640 in Kueue's TAS
# scenario) all stand on this machine, and reading /proc/meminfo once for each of them every tick was most of
# their sampling's CPU. A real node's agent samples every few seconds, so it reads afresh each time.
FACTS_REUSE_S = 1.0
_facts: tuple[float, int, int, int, float] | None = None  # (monotonic time read, cpus, memory, available, load)


def _machine() -> tuple[float, int, int, int, float]:
    global _facts
    now = time.monotonic()
    facts = _facts
    if facts is None or now - facts[0] >= FACTS_REUSE_S:
        mem = psutil.virtual_memory()
        try:
            load = os.getloadavg()[0]
        except OSError:  # not available on this platform
            load = 0.0
        facts = _facts = (now, psutil.cpu_count() or 1, int(mem.total), int(mem.available), load)
    return facts


def machine_facts(node: str, now: float | None = None) -> NodeSample:
    _, cpus, memory, available, load = _machine()
    return NodeSample(node=node, time=time.time() if now is None else now, cpus=cpus, memory_bytes=memory,
                      memory_available_bytes=available, load_1m=load)


def take_sample(probe: HealthProbe, node: str) -> NodeSample:
    """Machine facts plus the probe's GPU reading. Never raises."""
    base = machine_facts(node)
    try:
        reading = probe.read_gpus(with_events=True)
    except Exception as exc:  # a probe bug must not stop the node from reporting
        log.exception("GPU probe failed")
        reading = GpuReading(source="none", message=f"no GPUs: probe failed: {exc!r}")
    vendor = reading.vendor if reading.gpus else ""
    model = (reading.model or reading.gpus[0].name) if reading.gpus else ""
    return msgspec.structs.replace(base, gpus=reading.gpus, gpu_source=reading.source, message=reading.message,
                                   gpu_vendor=vendor, gpu_model=model)


def validate_node(probe: HealthProbe, *, expected_gpus: int = 0) -> tuple[bool, str]:
    """Active check before uncordon: every expected GPU answers and its ECC and row-remap state are clean."""
    try:
        reading = probe.read_gpus(with_events=False)
    except Exception as exc:
        return False, f"probe failed: {exc!r}"
    if reading.source == "none":
        if expected_gpus:
            return False, f"expected {expected_gpus} GPU(s), none readable ({reading.message})"
        return True, "no GPUs on this node: nothing to validate"
    problems: list[str] = []
    if len(reading.gpus) < expected_gpus:
        problems.append(f"{len(reading.gpus)} of {expected_gpus} GPUs answer")
    for g in reading.gpus:
        if g.memory_total_mb <= 0:
            problems.append(f"GPU {g.index} reports no memory")
        if g.ecc_volatile_uncorrected:
            problems.append(f"GPU {g.index} has {g.ecc_volatile_uncorrected} uncorrected ECC error(s)")
        if g.remapped_rows_failure:
            problems.append(f"GPU {g.index} row remapping failed")
        if g.remapped_rows_pending:
            problems.append(f"GPU {g.index} has remapped rows pending a reset")
        if g.nvlink_links and g.nvlink_down:
            problems.append(f"GPU {g.index} NVLink link(s) {g.nvlink_down} not active")
    if problems:
        return False, "; ".join(problems)
    passive = f"{len(reading.gpus)} GPU(s) answer; ECC and row remapping clean"
    exercise = getattr(probe, "exercise", None)
    if exercise is None:
        return True, passive
    ok, detail = exercise([g.index for g in reading.gpus])
    if ok is False:
        return False, f"active check failed: {detail}"
    return True, f"{passive}; {'active check: ' if ok else 'passive only: '}{detail}"


# ---------------------------------------------------------------- declared GPUs (tests, simulation)


class DeclaredProbe:
    """Reports ``count`` healthy GPUs of ``memory_mb`` each; tests inject faults with ``inject_*``."""

    blocks = False  # it reads nothing: the agent samples it in its own thread, no worker thread needed

    def __init__(self, count: int, memory_mb: int = 81920, *, name: str = "Declared GPU", vendor: str = "nvidia",
                 model: str = "") -> None:
        """``vendor`` and ``model``: whose GPUs these stand for (a pool node's ``gpu_model``; NVIDIA's unsaid)."""
        self.vendor, self.model = vendor, model
        self.gpus = [GpuSample(index=i, uuid=f"GPU-declared-{i:04d}", name=name, memory_total_mb=memory_mb,
                               utilization_pct=0, temperature_c=40, power_w=60.0, ecc_volatile_uncorrected=0,
                               ecc_aggregate_uncorrected=0, remapped_rows_pending=False,
                               remapped_rows_failure=False, pcie_replay_count=0) for i in range(count)]
        self.hidden: set[int] = set()
        self._xids: dict[int, list[int]] = {}
        self.broken: set[int] = set()  # GPUs whose active check fails (inject_burn_failure)
        self.busy: set[int] = set()  # GPUs a process holds: a reset is refused
        self.resets: list[int] = []

    @classmethod
    def from_spec(cls, spec: str) -> DeclaredProbe:
        """``"2"`` or ``"2x80000"`` (count x memory MB), as in ``TAU_DECLARED_GPUS``."""
        m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", spec)
        if m is None:
            raise ValueError(f"TAU_DECLARED_GPUS={spec!r}: expected a GPU count like '2' or count x "
                             "memory MB like '2x80000'")
        return cls(int(m.group(1)), int(m.group(2) or 81920))

    def _set(self, gpu: int, **fields: Any) -> None:
        self.gpus[gpu] = msgspec.structs.replace(self.gpus[gpu], **fields)

    def inject_xid(self, gpu: int, code: int) -> None:
        self._xids.setdefault(gpu, []).append(code)

    def inject_ecc(self, gpu: int, *, volatile: int = 1, aggregate: int | None = None) -> None:
        before = self.gpus[gpu].ecc_aggregate_uncorrected or 0
        agg = aggregate if aggregate is not None else before + volatile
        self._set(gpu, ecc_volatile_uncorrected=volatile, ecc_aggregate_uncorrected=agg)

    def inject_temperature(self, gpu: int, celsius: int) -> None:
        self._set(gpu, temperature_c=celsius)

    def inject_remapped_rows(self, gpu: int, *, pending: bool = False, failure: bool = False) -> None:
        self._set(gpu, remapped_rows_pending=pending, remapped_rows_failure=failure)

    def inject_pcie_replays(self, gpu: int, count: int) -> None:
        self._set(gpu, pcie_replay_count=count)

    def inject_nvlink(self, gpu: int, *, links: int = 18, down: list[int] | None = None, replay: int = 0,
                      recovery: int = 0) -> None:
        """Give the GPU NVLink (``links`` links), some of them down, and error counters (replay, recovery)."""
        self._set(gpu, nvlink_links=links, nvlink_down=sorted(down or []),
                  nvlink_errors={"replay": replay, "recovery": recovery, "crc_flit": 0, "crc_data": 0})

    def inject_burn_failure(self, gpu: int, failing: bool = True) -> None:
        (self.broken.add if failing else self.broken.discard)(gpu)

    def exercise(self, indices: list[int]) -> tuple[bool | None, str]:
        """The stand-in's active check: a declared GPU passes its burn and memory check unless made to fail."""
        bad = sorted(set(indices) & self.broken)
        if bad:
            return False, f"declared GPU(s) {bad} failed the burn/memory check"
        return True, f"{len(indices)} declared GPU(s) passed the stand-in burn and memory check"

    def hide_gpu(self, gpu: int, hidden: bool = True) -> None:
        (self.hidden.add if hidden else self.hidden.discard)(gpu)

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        """What a GPU reset does: volatile ECC and pending remaps cleared, temperature back to normal, a GPU that
        fell off the bus back. Refused while a process holds it."""
        if gpu in self.busy:
            return False, f"GPU {gpu} is in use by a process: not reset"
        self._set(gpu, ecc_volatile_uncorrected=0, remapped_rows_pending=False, temperature_c=40)
        self.hidden.discard(gpu)
        self.resets.append(gpu)
        return True, f"declared GPU {gpu} reset"

    def reboot(self) -> tuple[bool, str]:
        """A simulated reboot: every GPU reset and back on the bus."""
        for g in range(len(self.gpus)):
            self.busy.discard(g)
            self.reset_gpu(g)
        return True, f"declared node rebooted ({len(self.gpus)} GPU(s) reset)"

    def read_gpus(self, *, with_events: bool = True) -> GpuReading:
        gpus = []
        for g in self.gpus:
            if g.index in self.hidden:
                continue
            xids = self._xids.pop(g.index, []) if with_events else []
            gpus.append(msgspec.structs.replace(g, xid_events=xids))
        return GpuReading(source="declared", gpus=gpus, message=f"{len(self.gpus)} declared GPU(s)",
                          vendor=self.vendor, model=self.model)

    def sample(self, node: str) -> NodeSample:
        return take_sample(self, node)

    def close(self) -> None:
        pass
