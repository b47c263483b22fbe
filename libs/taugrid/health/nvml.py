"""The NVML probe: a node's GPUs through nvidia-ml-py (``pynvml``), plus the kernel log's XIDs when readable.

Invariants (``probe``'s): ``sample`` never raises; NVML missing or failing gives ``gpu_source="none"`` and
``"no GPUs: <why>"``; a counter NVML does not support is None (unknown), never 0; a GPU that stops answering is
left out of ``gpus`` and named in ``message``. Every call goes through ``_q`` (NotSupported → None) except the
memory read that decides whether a GPU answers at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.gpulib import nvml_library_missing
from taugrid.health.kmsg import KmsgReader, pci_key
from taugrid.health.probe import GpuReading, take_sample

log = logging.getLogger("taugrid.health.nvml")

T = TypeVar("T")


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
                missing = nvml_library_missing()
                if missing:
                    self._why = f"NVML did not initialise: {missing}"
                    return False
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
        return GpuReading(source="nvml", gpus=gpus, message="; ".join(notes), vendor="nvidia")

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


