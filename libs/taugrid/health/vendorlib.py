"""AMD's and Intel Gaudi's health events through their vendors' Python libraries, beside the tools' metrics.

``health.smi`` reads the metrics NVML would give (ECC totals, temperature, memory …) from ``amd-smi`` and
``hl-smi``; what only the libraries say is read here, per device, and turned into ``GpuEvent`` by the data table of
``health.vendorcodes``:

* AMD (``amdsmi``, ROCm's amd_smi_lib bindings): uncorrectable and deferred ECC counts per block
  (``amdsmi_get_gpu_ecc_count(handle, AmdSmiGpuBlock.X)``) rising; bad pages
  (``amdsmi_get_gpu_bad_page_info``: a page pending retirement is ``remapped_rows_pending``, one the driver could
  not reserve is an RMA, as is the count reaching ``amdsmi_get_gpu_bad_page_threshold``); RAS records
  (``amdsmi_get_gpu_cper_entries`` from a cursor kept per device, their AFIDs from
  ``amdsmi_get_afids_from_cper``).
* Gaudi (``pyhlml``, the HLML bindings): events registered on every device (``hlmlDeviceRegisterEvents`` with
  every ``HLML_EVENT_*`` bit, drained by ``hlmlEventSetWait(set, 0)`` until ``HLML_ERROR_TIMEOUT``: ECC, DRAM
  ECC, critical errors); replaced HBM rows (``hlmlDeviceGetReplacedRowsCount`` per cause, rising) and rows
  pending a reset (``hlmlDeviceGetReplacedRowsPendingStatus``).

Invariants: ``read`` never raises. A library that does not import or initialise is said once in the log and gives
no devices (the tool's metrics still stand). A call the device does not support (``AMDSMI_STATUS_NOT_SUPPORTED``,
``HLML_ERROR_NOT_SUPPORTED``) is unknown, never healthy. What the first read finds (RAS records since boot, ECC
counts, replaced rows) is history: only what grows while the agent watches is an event, as with NVML's aggregate
ECC count.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Protocol

from taugrid.core.contracts import GpuEvent
from taugrid.health.vendorcodes import event

log = logging.getLogger("taugrid.health.vendorlib")

# amdsmi_wrapper's AMDSMI_MEM_PAGE_STATUS_* values (a bad page record's ``status``) and AMDSMI_CPER_SEV_* bits.
PAGE_STATUS = {0: "AMDSMI_MEM_PAGE_STATUS_RESERVED", 1: "AMDSMI_MEM_PAGE_STATUS_PENDING",
               2: "AMDSMI_MEM_PAGE_STATUS_UNRESERVABLE"}
CPER_ALL_SEVERITIES = (1 << 0) | (1 << 1) | (1 << 2)  # non-fatal uncorrected, fatal, non-fatal corrected
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_MORE_DATA = 39
HLML_EVENTS = ("HLML_EVENT_ECC_DERR", "HLML_EVENT_CRITICAL_ERR", "HLML_EVENT_CLOCK_RATE", "HLML_EVENT_DRAM_DERR",
               "HLML_EVENT_ECC_SERR", "HLML_EVENT_DRAM_SERR")
ROW_CAUSES = ("HLML_ROW_REPLACEMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
              "HLML_ROW_REPLACEMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")
_CPER_PAGES = 8  # a read follows MORE_DATA at most this often (20 records each)


class DeviceHealth(NamedTuple):
    gpu: int
    pci: str
    events: list[GpuEvent]
    rows_pending: bool | None  # memory waiting for a reset to retire/replace it; None: unknown


class VendorEvents(Protocol):
    """Port: a vendor library's per-device health, merged into the tool's metrics by ``health.smi.SmiProbe``."""

    vendor: str

    def read(self) -> list[DeviceHealth]: ...


class _Library(ABC):
    """Opens a vendor library once; a library that cannot open is said once and stays closed."""

    def __init__(self, lib: Any, module: str) -> None:
        self._lib, self._module = lib, module
        self._state = "" if lib is None else "given"
        self._said: set[str] = set()

    def say(self, why: str) -> None:
        if why not in self._said:  # once per cause, not every sample
            log.warning("%s: %s", self._module, why)
            self._said.add(why)

    def open(self) -> Any | None:
        if self._state == "open":
            return self._lib
        if self._state == "failed":
            return None
        try:
            if self._lib is None:
                # The bindings load their C library at import (amdsmi raises KeyError when libamd_smi.so is
                # absent) or at init (pyhlml): any exception means "not here".
                self._lib = __import__(self._module)
            self._init(self._lib)
        except Exception as exc:  # a missing library or driver is a fact about the machine, not a bug
            self._state = "failed"
            self.say(f"no health events: {self._module} unavailable ({exc!r})")
            return None
        self._state = "open"
        return self._lib

    @abstractmethod
    def _init(self, lib: Any) -> None:
        """Initialise the vendor's library (each vendor's own call)."""

    @abstractmethod
    def _unsupported(self, exc: Exception) -> bool:
        """Whether ``exc`` is the library's "not supported on this device" (answered None, not said)."""

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)``; None where the device does not support it or the library refused (said once)."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not self._unsupported(exc):
                self.say(f"{getattr(fn, '__name__', fn)} failed: {exc!r}")
            return None


class AmdLibEvents(_Library):
    """AMD GPUs' ECC per block, bad pages and RAS records through ``amdsmi``; ``lib`` replaces the module."""

    vendor = "amd"

    def __init__(self, lib: Any = None) -> None:
        super().__init__(lib, "amdsmi")
        self._ecc: dict[tuple[int, str, str], int] = {}
        self._cursor: dict[int, int] = {}
        self._rma: set[tuple[int, str]] = set()

    def _init(self, lib: Any) -> None:
        lib.amdsmi_init()

    def _unsupported(self, exc: Exception) -> bool:
        get_code = getattr(exc, "get_error_code", None)
        return get_code is not None and get_code() == AMDSMI_STATUS_NOT_SUPPORTED

    def read(self) -> list[DeviceHealth]:
        lib = self.open()
        if lib is None:
            return []
        handles = self._call(lib.amdsmi_get_processor_handles) or []
        out = []
        for index, handle in enumerate(handles):
            pci = str(self._call(lib.amdsmi_get_gpu_device_bdf, handle) or "")
            events = self._ecc_events(lib, handle, index, pci)
            pending, page_events = self._pages(lib, handle, index, pci)
            out.append(DeviceHealth(index, pci, events + page_events + self._cper(lib, handle, index, pci), pending))
        return out

    def _ecc_events(self, lib: Any, handle: Any, index: int, pci: str) -> list[GpuEvent]:
        out = []
        for block in lib.AmdSmiGpuBlock:
            if block.name in ("INVALID", "RESERVED"):
                continue
            counts = self._call(lib.amdsmi_get_gpu_ecc_count, handle, block)
            if not isinstance(counts, dict):
                continue
            for kind in ("uncorrectable", "deferred"):
                now = counts.get(f"{kind}_count")
                if not isinstance(now, int):
                    continue
                before = self._ecc.get((index, block.name, kind))
                self._ecc[(index, block.name, kind)] = now
                if before is not None and now > before:
                    out.append(event("amd", f"AMDSMI_GPU_BLOCK_{block.name} {kind}_count", gpu=index, pci=pci,
                                     detail=f"{kind} count {before} → {now}"))
        return out

    def _pages(self, lib: Any, handle: Any, index: int, pci: str) -> tuple[bool | None, list[GpuEvent]]:
        pages = self._call(lib.amdsmi_get_gpu_bad_page_info, handle)
        if not isinstance(pages, list):
            return None, []
        status = [PAGE_STATUS.get(int(p.get("status", -1)), "") for p in pages if isinstance(p, dict)]
        out = []
        unreservable = [p for p, s in zip(pages, status, strict=True) if s == "AMDSMI_MEM_PAGE_STATUS_UNRESERVABLE"]
        if unreservable and (index, "unreservable") not in self._rma:
            self._rma.add((index, "unreservable"))
            out.append(event("amd", "AMDSMI_MEM_PAGE_STATUS_UNRESERVABLE", gpu=index, pci=pci,
                             detail=f"{len(unreservable)} bad page(s) the driver could not reserve, e.g. "
                                    f"{hex(int(unreservable[0].get('page_address', 0)))}"))
        threshold = self._call(lib.amdsmi_get_gpu_bad_page_threshold, handle)
        retired = status.count("AMDSMI_MEM_PAGE_STATUS_RESERVED")
        if isinstance(threshold, int) and threshold > 0 and retired >= threshold \
                and (index, "threshold") not in self._rma:
            self._rma.add((index, "threshold"))
            out.append(event("amd", "bad-page-threshold", gpu=index, pci=pci,
                             detail=f"{retired} retired page(s), threshold {threshold}"))
        return "AMDSMI_MEM_PAGE_STATUS_PENDING" in status, out

    def _cper(self, lib: Any, handle: Any, index: int, pci: str) -> list[GpuEvent]:
        first = index not in self._cursor
        cursor, out = self._cursor.get(index, 0), []
        afids_of = getattr(lib, "amdsmi_get_afids_from_cper", None) or getattr(
            getattr(lib, "amdsmi_interface", None), "amdsmi_get_afids_from_cper", None)
        for _ in range(_CPER_PAGES):
            got = self._call(lib.amdsmi_get_gpu_cper_entries, handle, CPER_ALL_SEVERITIES, cursor=cursor)
            if not isinstance(got, tuple) or len(got) != 4:
                break
            entries, cursor, blobs, status = got
            for i, entry in sorted(entries.items()):
                if first:
                    continue  # records from before the agent watched: history
                afids = self._call(afids_of, blobs[i]) if afids_of is not None and i < len(blobs) else None
                ids = list(afids[0]) if isinstance(afids, tuple) else []
                code = "AMDSMI_CPER_SEV_" + str(entry.get("error_severity", "unused")).upper()
                raw = f"{code} AFID {','.join(str(a) for a in ids)}" if ids else code
                out.append(event("amd", code, gpu=index, pci=pci, raw=raw,
                                 detail=f"RAS record {entry.get('record_id', '?')} at {entry.get('timestamp', '?')}"))
            if status != AMDSMI_STATUS_MORE_DATA:
                break
        self._cursor[index] = cursor
        return out


def _types(lib: Any) -> Any:
    """pyhlml's enums and defines (``pyhlml.pyhlml_types_generated``; ``hlml_types`` is deprecated)."""
    return lib.pyhlml_types_generated


class GaudiLibEvents(_Library):
    """Gaudi devices' events and replaced rows through ``pyhlml``; ``lib`` replaces the module."""

    vendor = "intel-gaudi"

    def __init__(self, lib: Any = None) -> None:
        super().__init__(lib, "pyhlml")
        self._devices: list[Any] = []
        self._set: Any = None
        self._rows: dict[tuple[int, str], int] = {}

    def _init(self, lib: Any) -> None:
        lib.hlmlInit()
        self._devices = [lib.hlmlDeviceGetHandleByIndex(i) for i in range(lib.hlmlDeviceGetCount())]
        self._set = lib.hlmlEventSetCreate()
        mask = 0
        for name in HLML_EVENTS:
            mask |= getattr(_types(lib).HLML_DEFINES, name)
        for device in self._devices:
            lib.hlmlDeviceRegisterEvents(device, mask, self._set)

    def _unsupported(self, exc: Exception) -> bool:
        return getattr(exc, "value", None) == _types(self._lib).HLML_RETURN.HLML_ERROR_NOT_SUPPORTED

    def read(self) -> list[DeviceHealth]:
        lib = self.open()
        if lib is None:
            return []
        pcis = []
        for device in self._devices:
            info = self._call(lib.hlmlDeviceGetPCIInfo, device)
            bus = getattr(info, "bus_id", b"")
            pcis.append(bus.decode(errors="replace").strip("\0") if isinstance(bus, bytes) else str(bus))
        events: dict[int, list[GpuEvent]] = {i: [] for i in range(len(self._devices))}
        for index, bits in self._drain(lib):
            for name in HLML_EVENTS:  # one bit each; the same event twice in one sample is one event
                if bits & getattr(_types(lib).HLML_DEFINES, name) and all(e.code != name for e in events[index]):
                    events[index].append(event("intel-gaudi", name, gpu=index, pci=pcis[index],
                                               detail=f"event_type {bits:#x}"))
        out = []
        for index, device in enumerate(self._devices):
            events[index] += self._rows_replaced(lib, device, index, pcis[index])
            pending = self._call(lib.hlmlDeviceGetReplacedRowsPendingStatus, device)
            out.append(DeviceHealth(index, pcis[index], events[index], None if pending is None else bool(pending)))
        return out

    def _drain(self, lib: Any) -> list[tuple[int, int]]:
        """Every pending event as (device index, event_type bits), without waiting."""
        got: list[tuple[int, int]] = []
        handles = [getattr(d, "value", d) for d in self._devices]
        for _ in range(64):  # a storm of events is read over several samples, not in one
            try:
                data = lib.hlmlEventSetWait(self._set, 0)
            except Exception as exc:
                if getattr(exc, "value", None) != _types(lib).HLML_RETURN.HLML_ERROR_TIMEOUT:
                    self.say(f"hlmlEventSetWait failed: {exc!r}")
                break
            device = getattr(data.device, "value", data.device)
            if device in handles:
                got.append((handles.index(device), int(data.event_type)))
        return got

    def _rows_replaced(self, lib: Any, device: Any, index: int, pci: str) -> list[GpuEvent]:
        out = []
        for cause in ROW_CAUSES:
            count = self._call(lib.hlmlDeviceGetReplacedRowsCount, device,
                               getattr(_types(lib).HLML_ROW_REPLACEMENT_CAUSE, cause))
            if not isinstance(count, int):
                continue
            before = self._rows.get((index, cause))
            self._rows[(index, cause)] = count
            if before is not None and count > before:
                out.append(event("intel-gaudi", cause, gpu=index, pci=pci,
                                 detail=f"replaced rows {before} → {count}"))
        return out
