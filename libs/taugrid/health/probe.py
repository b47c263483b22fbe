"""Probes that read a node's GPUs and machine facts into a ``NodeSample``.

``NvmlProbe`` reads NVML (nvidia-ml-py) plus, when readable, the kernel log for XIDs; ``DeclaredProbe``
reports declared GPUs for tests and simulation and lets them inject faults. ``validate_node`` is the active
check the health-monitor requires before it lets a cordoned node back.

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
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import msgspec
import psutil

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.health.kmsg import KmsgReader, pci_key

log = logging.getLogger("taugrid.health.probe")

T = TypeVar("T")


class GpuReading(msgspec.Struct, kw_only=True):
    source: str  # nvml | declared | none
    gpus: list[GpuSample] = msgspec.field(default_factory=list)
    message: str = ""


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


def machine_facts(node: str, now: float | None = None) -> NodeSample:
    mem = psutil.virtual_memory()
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        load = 0.0
    return NodeSample(node=node, time=time.time() if now is None else now, cpus=psutil.cpu_count() or 1,
                      memory_bytes=int(mem.total), memory_available_bytes=int(mem.available), load_1m=load)


def take_sample(probe: HealthProbe, node: str) -> NodeSample:
    """Machine facts plus the probe's GPU reading. Never raises."""
    base = machine_facts(node)
    try:
        reading = probe.read_gpus(with_events=True)
    except Exception as exc:  # a probe bug must not stop the node from reporting
        log.exception("GPU probe failed")
        reading = GpuReading(source="none", message=f"no GPUs: probe failed: {exc!r}")
    return msgspec.structs.replace(base, gpus=reading.gpus, gpu_source=reading.source,
                                   message=reading.message)


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

    def __init__(self, count: int, memory_mb: int = 81920, *, name: str = "Declared GPU") -> None:
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
        return GpuReading(source="declared", gpus=gpus, message=f"{len(self.gpus)} declared GPU(s)")

    def sample(self, node: str) -> NodeSample:
        return take_sample(self, node)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- NVML


_THROTTLE_BITS = {
    "GpuIdle": "nvmlClocksEventReasonGpuIdle",
    "SwPowerCap": "nvmlClocksEventReasonSwPowerCap",
    "HwSlowdown": "nvmlClocksEventReasonHwSlowdown",
    "HwThermalSlowdown": "nvmlClocksEventReasonHwThermalSlowdown",
    "HwPowerBrakeSlowdown": "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    "SwThermalSlowdown": "nvmlClocksEventReasonSwThermalSlowdown",
    "SyncBoost": "nvmlClocksEventReasonSyncBoost",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """NVML-backed probe. ``nvml`` is the ``pynvml`` module (tests pass a stand-in with the same names)."""

    def __init__(self, *, kmsg: KmsgReader | None = None, nvml: Any = None,
                 retry_init_s: float = 60.0, burn: Callable[[list[int]], tuple[bool | None, str]] | None = None,
                 reset: Callable[[int, bool], tuple[bool, str]] | None = None,
                 reboot: Callable[[], tuple[bool, str]] | None = None) -> None:
        """``burn`` and ``reset`` replace the active check (``active.burn_check``) and the GPU reset
        (``active.gpu_reset``), for a stand-in NVML in tests; ``reboot`` gives the probe a way to reboot (a real
        machine has none: a reboot is requested, not done)."""
        self._burn, self._reset = burn, reset
        if reboot is not None:
            self.reboot = reboot
        self._kmsg = kmsg
        self._nvml = nvml
        self._retry_init_s = retry_init_s
        self._ready = False
        self._why = ""
        self._next_init = 0.0
        self._events: Any = None

    def _init(self) -> bool:
        if self._ready:
            return True
        if time.monotonic() < self._next_init:
            return False
        self._next_init = time.monotonic() + self._retry_init_s
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except ImportError as exc:
            self._why = f"nvidia-ml-py is not installed ({exc})"
            return False
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission …
            self._why = f"NVML did not initialise: {exc}"
            return False
        self._ready = True
        self._register_events()
        return True

    def _register_events(self) -> None:
        n = self._nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except Exception as exc:  # event sets are Linux-only
            log.info("NVML event set unavailable (%s); XIDs come from the kernel log only", exc)
            self._events = None
            return
        for i in range(self._q(n.nvmlDeviceGetCount) or 0):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                mask = n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError
                if mask:
                    n.nvmlDeviceRegisterEvents(h, mask, self._events)
            except Exception as exc:
                log.info("GPU %d: XID events not available (%s)", i, exc)

    def _q(self, fn: Callable[..., T], *args: Any) -> T | None:
        """One guarded NVML query: unsupported, not permitted or otherwise failing → None (unknown)."""
        n = self._nvml
        try:
            return fn(*args)
        except n.NVMLError_GpuIsLost:
            raise
        except n.NVMLError_NotSupported:
            return None
        except n.NVMLError as exc:
            log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def _drain_events(self, index_of: dict[str, int]) -> dict[int, list[int]]:
        n, out = self._nvml, {}  # type: ignore[var-annotated]
        if self._events is None:
            return out
        for _ in range(256):
            try:
                ev = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError_Timeout:
                break
            except n.NVMLError as exc:  # never mark every GPU bad on a wait error (device-plugin pitfall)
                log.warning("NVML event wait failed: %s", exc)
                break
            if ev.eventType & n.nvmlEventTypeXidCriticalError:
                try:
                    uuid = _text(self._q(n.nvmlDeviceGetUUID, ev.device) or "")
                except n.NVMLError:  # the GPU that raised it is gone (XID 79); attribute to the first
                    uuid = ""
                index = index_of.get(uuid, min(index_of.values(), default=0))
                out.setdefault(index, []).append(int(ev.eventData))
        return out

    _NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
                        ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                        ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
                        ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3))

    def _nvlink(self, h: Any) -> tuple[int | None, list[int], dict[str, int] | None]:
        """(links, links not active, error counters summed over links); (None, [], None) for a GPU without NVLink
        (NotSupported on every link: a PCIe card), so it is never taken for one whose links are down."""
        n = self._nvml
        state_of = getattr(n, "nvmlDeviceGetNvLinkState", None)
        if state_of is None:
            return None, [], None
        links, down = 0, []
        errors = {name: 0 for name, _, _ in self._NVLINK_COUNTERS}
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self._q(state_of, h, link)
            if state is None:
                continue
            links += 1
            if state != getattr(n, "NVML_FEATURE_ENABLED", 1):
                down.append(link)
            for name, const, default in self._NVLINK_COUNTERS:
                value = self._q(n.nvmlDeviceGetNvLinkErrorCounter, h, link, getattr(n, const, default))
                errors[name] += int(value or 0)
        return (links, down, errors) if links else (None, [], None)

    def _gpu(self, i: int) -> tuple[GpuSample, str]:
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(i)
        mem = n.nvmlDeviceGetMemoryInfo(h)  # a GPU that cannot say this much is not answering
        util = self._q(n.nvmlDeviceGetUtilizationRates, h)
        power = self._q(n.nvmlDeviceGetPowerUsage, h)
        rows = self._q(n.nvmlDeviceGetRemappedRows, h)
        reasons = self._q(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        pci = self._q(n.nvmlDeviceGetPciInfo, h)
        unc = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        links, down, nvlink_errors = self._nvlink(h)
        sample = GpuSample(
            index=i,
            uuid=_text(self._q(n.nvmlDeviceGetUUID, h) or ""),
            name=_text(self._q(n.nvmlDeviceGetName, h) or ""),
            memory_total_mb=int(mem.total) // (1 << 20),
            memory_used_mb=int(mem.used) // (1 << 20),
            utilization_pct=int(util.gpu) if util is not None else None,
            temperature_c=self._q(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            power_w=power / 1000.0 if power is not None else None,
            ecc_volatile_uncorrected=self._q(n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_VOLATILE_ECC),
            ecc_aggregate_uncorrected=self._q(n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_AGGREGATE_ECC),
            remapped_rows_pending=bool(rows[2]) if rows is not None else None,
            remapped_rows_failure=bool(rows[3]) if rows is not None else None,
            pcie_replay_count=self._q(n.nvmlDeviceGetPcieReplayCounter, h),
            throttle_reasons=[name for name, attr in _THROTTLE_BITS.items()
                              if reasons is not None and reasons & getattr(n, attr, 0)],
            nvlink_links=links, nvlink_down=down, nvlink_errors=nvlink_errors,
        )
        return sample, pci_key(_text(pci.busId)) if pci is not None else ""

    def _kmsg_note(self, with_events: bool) -> str:
        """With no GPU to attach them to, kernel-log XIDs still reach a human through the message."""
        if not with_events or self._kmsg is None:
            return ""
        recs = self._kmsg.read_new()
        return "; kernel log: " + ", ".join(f"XID {r.xid} on {r.bdf}" for r in recs) if recs else ""

    def read_gpus(self, *, with_events: bool = True) -> GpuReading:
        try:
            return self._read(with_events)
        except Exception as exc:  # the invariant: never raise into the agent's timer
            log.exception("NVML read failed")
            return GpuReading(source="none", message=f"no GPUs: NVML read failed: {exc!r}")

    def _read(self, with_events: bool) -> GpuReading:
        if not self._init():
            return GpuReading(source="none", message=f"no GPUs: {self._why}{self._kmsg_note(with_events)}")
        n = self._nvml
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            return GpuReading(source="none", message=f"no GPUs: NVML cannot count devices: {exc}"
                                                     f"{self._kmsg_note(with_events)}")
        if count == 0:
            return GpuReading(source="none",
                              message=f"no GPUs: NVML found 0 devices{self._kmsg_note(with_events)}")
        gpus: list[GpuSample] = []
        by_pci: dict[str, int] = {}
        notes: list[str] = []
        for i in range(count):
            try:
                g, pci = self._gpu(i)
            except n.NVMLError as exc:  # GPU_IS_LOST and friends: leave it out so the count drops
                notes.append(f"GPU {i} not answering: {exc}")
                continue
            gpus.append(g)
            if pci:
                by_pci[pci] = i
        if with_events:
            xids = self._drain_events({g.uuid: g.index for g in gpus})
            for rec in self._kmsg.read_new() if self._kmsg is not None else []:
                # An address NVML does not list (the GPU fell off the bus) is pinned on the first GPU.
                index = by_pci.get(pci_key(rec.bdf), gpus[0].index if gpus else 0)
                xids.setdefault(index, []).append(rec.xid)
            gpus = [msgspec.structs.replace(g, xid_events=sorted(set(xids.get(g.index, []))))
                    if g.index in xids else g for g in gpus]
        return GpuReading(source="nvml", gpus=gpus, message="; ".join(notes))

    def sample(self, node: str) -> NodeSample:
        return take_sample(self, node)

    def exercise(self, indices: list[int]) -> tuple[bool | None, str]:
        if self._burn is not None:
            return self._burn(indices)
        from taugrid.health.active import burn_check

        return burn_check(indices)

    def _busy(self, gpu: int) -> bool:
        """Does a process hold the GPU? Unknown counts as busy: never reset under a process."""
        n = self._nvml
        if not self._init():
            return True
        try:
            h = n.nvmlDeviceGetHandleByIndex(gpu)
            procs = [*n.nvmlDeviceGetComputeRunningProcesses(h), *n.nvmlDeviceGetGraphicsRunningProcesses(h)]
        except Exception:
            return True
        return bool(procs)

    def reset_gpu(self, gpu: int) -> tuple[bool, str]:
        busy = self._busy(gpu)
        if self._reset is not None:
            return self._reset(gpu, busy)
        from taugrid.health.active import gpu_reset

        return gpu_reset(gpu, busy=busy)

    def close(self) -> None:
        if self._kmsg is not None:
            self._kmsg.close()
        if self._ready:
            try:
                if self._events is not None:
                    self._nvml.nvmlEventSetFree(self._events)
                self._nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("NVML shutdown: %s", exc)
            self._ready = False


def make_probe(declared: str | None = None, *, kmsg_path: str = "/dev/kmsg") -> HealthProbe:
    """``TAU_DECLARED_GPUS`` set → DeclaredProbe; otherwise NVML (which reports "no GPUs: …" if it cannot)."""
    if declared:
        return DeclaredProbe.from_spec(declared)
    return NvmlProbe(kmsg=KmsgReader.open_if_readable(kmsg_path))
