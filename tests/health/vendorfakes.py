"""Stand-ins for AMD's ``amdsmi`` and Intel Gaudi's ``pyhlml`` with the real names, values and return codes.

Every name the readers call is one the installed packages define (``tests/health/test_vendorlib.py`` checks
that against amdsmi 7.0.2 and habana-pyhlml 1.24's sources); the values (``AmdSmiGpuBlock`` bits, page status,
``HLML_EVENT_*`` bits, status codes) are theirs. The real modules need their C libraries (libamd_smi.so,
libhlml.so), which no machine here has, so the tests drive these. A fault is injected by changing the state
the stand-in reports.
"""

from __future__ import annotations

import types
from enum import IntEnum
from typing import Any

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_MORE_DATA = 39


class AmdSmiGpuBlock(IntEnum):  # amdsmi_wrapper's AMDSMI_GPU_BLOCK_* bits (a few of them)
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    XGMI_WAFL = 128
    RESERVED = 9223372036854775808


class AmdSmiLibraryException(Exception):  # noqa: N818 - amdsmi's own name
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = abs(err_code)

    def get_error_code(self) -> int:
        return self.err_code


class FakeAmdSmi:
    """One node's AMD GPUs as ``amdsmi`` reports them. ``ecc[gpu][block]`` = (uncorrectable, deferred);
    ``pages[gpu]`` the bad-page records; ``cper[gpu]`` RAS records, each (severity, afids)."""

    AmdSmiGpuBlock = AmdSmiGpuBlock
    AmdSmiLibraryException = AmdSmiLibraryException

    def __init__(self, count: int = 1, *, bdfs: list[str] | None = None) -> None:
        self.handles = [object() for _ in range(count)]
        self.bdfs = bdfs or [f"0000:{0x0c + i:02x}:00.0" for i in range(count)]
        self.ecc: list[dict[str, tuple[int, int]]] = [{"UMC": (0, 0), "SDMA": (0, 0), "GFX": (0, 0)}
                                                        for _ in range(count)]
        self.pages: list[list[dict[str, int]]] = [[] for _ in range(count)]
        self.threshold = 8
        self.cper: list[list[tuple[str, list[int]]]] = [[] for _ in range(count)]
        self.inits = 0
        self.amdsmi_interface = types.SimpleNamespace(amdsmi_get_afids_from_cper=self._afids)

    def _gpu(self, handle: Any) -> int:
        return self.handles.index(handle)

    def amdsmi_init(self, flag: int = 2) -> None:  # AmdSmiInitFlags.INIT_AMD_GPUS
        self.inits += 1

    def amdsmi_get_processor_handles(self) -> list[Any]:
        return list(self.handles)

    def amdsmi_get_gpu_device_bdf(self, handle: Any) -> str:
        return self.bdfs[self._gpu(handle)]

    def amdsmi_get_gpu_ecc_count(self, handle: Any, block: AmdSmiGpuBlock) -> dict[str, int]:
        counts = self.ecc[self._gpu(handle)].get(block.name)
        if counts is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return {"correctable_count": 0, "uncorrectable_count": counts[0], "deferred_count": counts[1]}

    def amdsmi_get_gpu_bad_page_info(self, handle: Any) -> list[dict[str, int]]:
        return [{"value": i, **p} for i, p in enumerate(self.pages[self._gpu(handle)])]

    def amdsmi_get_gpu_bad_page_threshold(self, handle: Any) -> int:
        return self.threshold

    def amdsmi_get_gpu_cper_entries(self, handle: Any, severity_mask: int, buffer_size: int = 4 * 1048576,
                                    cursor: int = 0) -> tuple[dict[int, dict[str, Any]], int, list[dict[str, Any]],
                                                              int]:
        """Twenty records a call at most, as the real binding asks for; MORE_DATA while some are left."""
        records = self.cper[self._gpu(handle)][cursor:cursor + 20]
        entries = {i: {"error_severity": sev, "timestamp": "2026/12/01 21:40:00", "record_id": f"r{cursor + i}",
                       "notify_type": "", "record_length": 64} for i, (sev, _) in enumerate(records)}
        blobs = [{"bytes": list(range(8)), "size": 8, "afids": afids} for _, afids in records]
        left = len(self.cper[self._gpu(handle)]) > cursor + 20
        return entries, cursor + len(records), blobs, AMDSMI_STATUS_MORE_DATA if left else AMDSMI_STATUS_SUCCESS

    @staticmethod
    def _afids(record: dict[str, Any]) -> tuple[list[int], int]:
        return list(record["afids"]), len(record["afids"])

    # faults, as the hardware would show them
    def uncorrectable(self, gpu: int, block: str = "UMC", n: int = 1) -> None:
        ue, de = self.ecc[gpu][block]
        self.ecc[gpu][block] = (ue + n, de)

    def ras_record(self, gpu: int, severity: str, afids: list[int]) -> None:
        self.cper[gpu].append((severity, afids))


class HLMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


HLML_RETURN = types.SimpleNamespace(HLML_SUCCESS=0, HLML_ERROR_NOT_SUPPORTED=3, HLML_ERROR_TIMEOUT=10)
HLML_DEFINES = types.SimpleNamespace(HLML_EVENT_ECC_ERR=1, HLML_EVENT_ECC_DERR=1, HLML_EVENT_CRITICAL_ERR=2,
                                     HLML_EVENT_CLOCK_RATE=4, HLML_EVENT_DRAM_ERR=8, HLML_EVENT_DRAM_DERR=8,
                                     HLML_EVENT_ECC_SERR=16, HLML_EVENT_DRAM_SERR=32)
HLML_ROW_REPLACEMENT_CAUSE = types.SimpleNamespace(HLML_ROW_REPLACEMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
                                                   HLML_ROW_REPLACEMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1)


class FakePyhlml:
    """One node's Gaudi devices as ``pyhlml`` reports them; ``raise_event`` queues what hlmlEventSetWait returns."""

    HLMLError = HLMLError
    pyhlml_types_generated = types.SimpleNamespace(HLML_RETURN=HLML_RETURN, HLML_DEFINES=HLML_DEFINES,
                                                   HLML_ROW_REPLACEMENT_CAUSE=HLML_ROW_REPLACEMENT_CAUSE)

    def __init__(self, count: int = 1, *, bus_ids: list[str] | None = None) -> None:
        self.handles = [types.SimpleNamespace(value=0x5000 + i) for i in range(count)]  # c_void_p-like
        self.bus_ids = bus_ids or [f"0000:{0x19 + i:02x}:00.0" for i in range(count)]
        self.queue: list[tuple[int, int]] = []
        self.registered: dict[int, int] = {}
        self.rows: list[dict[int, int]] = [{0: 0, 1: 0} for _ in range(count)]
        self.pending = [0] * count

    def hlmlInit(self) -> None:  # noqa: N802 - pyhlml's names
        pass

    def hlmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.handles)

    def hlmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        return self.handles[index]

    def hlmlEventSetCreate(self) -> Any:  # noqa: N802
        return types.SimpleNamespace(value=0x9000)

    def hlmlDeviceRegisterEvents(self, device: Any, event_types: int, st: Any) -> None:  # noqa: N802
        self.registered[self.handles.index(device)] = event_types

    def hlmlEventSetWait(self, st: Any, timeout: int) -> Any:  # noqa: N802
        if not self.queue:
            raise HLMLError(HLML_RETURN.HLML_ERROR_TIMEOUT)
        gpu, bits = self.queue.pop(0)
        return types.SimpleNamespace(device=self.handles[gpu].value, event_type=bits)

    def hlmlDeviceGetPCIInfo(self, device: Any) -> Any:  # noqa: N802
        return types.SimpleNamespace(bus_id=self.bus_ids[self.handles.index(device)].encode(), domain=0)

    def hlmlDeviceGetReplacedRowsCount(self, device: Any, cause: int) -> int:  # noqa: N802
        return self.rows[self.handles.index(device)][cause]

    def hlmlDeviceGetReplacedRowsPendingStatus(self, device: Any) -> int:  # noqa: N802
        return self.pending[self.handles.index(device)]

    def raise_event(self, gpu: int, name: str) -> None:
        self.queue.append((gpu, getattr(HLML_DEFINES, name)))


# What the readers call, by module of the installed package, for test_vendorlib's check of the names.
AMDSMI_NAMES = ("amdsmi_init", "amdsmi_get_processor_handles", "amdsmi_get_gpu_device_bdf",
                "amdsmi_get_gpu_ecc_count", "amdsmi_get_gpu_bad_page_info", "amdsmi_get_gpu_bad_page_threshold",
                "amdsmi_get_gpu_cper_entries", "AmdSmiGpuBlock", "AmdSmiLibraryException")
AMDSMI_INTERFACE_NAMES = ("amdsmi_get_afids_from_cper",)
PYHLML_NAMES = ("hlmlInit", "hlmlDeviceGetCount", "hlmlDeviceGetHandleByIndex", "hlmlEventSetCreate",
                "hlmlDeviceRegisterEvents", "hlmlEventSetWait", "hlmlDeviceGetPCIInfo",
                "hlmlDeviceGetReplacedRowsCount", "hlmlDeviceGetReplacedRowsPendingStatus")
