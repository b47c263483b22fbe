"""Print a JSON report of what NVML tells taugrid's node agent on this machine.

Run on a GPU machine: ``python bench/gpu_check.py [--samples N]``. Reports the device count, per-GPU name,
memory, temperature, ECC mode, remapped rows and XID event-set support, plus the timing of full
``NvmlProbe`` samples and of ``validate_node``. On a machine without GPUs it reports that plainly (exit 0);
it exits 1 only if the probe itself raised, which it must never do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import msgspec

from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import validate_node


def _raw(nvml: Any, fn: str, *args: Any) -> Any:
    """One NVML call for the report; failures become their message instead of an exception."""
    try:
        value = getattr(nvml, fn)(*args)
    except Exception as exc:
        return f"error: {exc}"
    return value.decode() if isinstance(value, bytes) else value


def nvml_details() -> dict[str, Any]:
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception as exc:
        return {"nvml": False, "error": str(exc)}
    out: dict[str, Any] = {
        "nvml": True,
        "driver": _raw(nvml, "nvmlSystemGetDriverVersion"),
        "nvml_version": _raw(nvml, "nvmlSystemGetNVMLVersion"),
        "cuda_driver": _raw(nvml, "nvmlSystemGetCudaDriverVersion_v2"),
        "count": _raw(nvml, "nvmlDeviceGetCount"),
        "devices": [],
    }
    try:
        event_set = nvml.nvmlEventSetCreate()
        out["event_set"] = True
    except Exception as exc:
        event_set, out["event_set"] = None, f"error: {exc}"
    for i in range(out["count"] if isinstance(out["count"], int) else 0):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        ecc = _raw(nvml, "nvmlDeviceGetEccMode", h)
        rows = _raw(nvml, "nvmlDeviceGetRemappedRows", h)
        supported = _raw(nvml, "nvmlDeviceGetSupportedEventTypes", h)
        pci = _raw(nvml, "nvmlDeviceGetPciInfo", h)
        bus_id = getattr(pci, "busId", pci)
        dev: dict[str, Any] = {
            "index": i,
            "name": _raw(nvml, "nvmlDeviceGetName", h),
            "uuid": _raw(nvml, "nvmlDeviceGetUUID", h),
            "pci": bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id),
            "ecc_mode_current_pending": list(ecc) if isinstance(ecc, (list, tuple)) else ecc,
            "remapped_rows_corr_unc_pending_failure": list(rows) if isinstance(rows, (list, tuple)) else rows,
            "temperature_c": _raw(nvml, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
            "slowdown_temp_c": _raw(nvml, "nvmlDeviceGetTemperatureThreshold", h,
                                    nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            "pcie_gen_curr_max": [_raw(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", h),
                                  _raw(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", h)],
            "pcie_width_curr_max": [_raw(nvml, "nvmlDeviceGetCurrPcieLinkWidth", h),
                                    _raw(nvml, "nvmlDeviceGetMaxPcieLinkWidth", h)],
            "mig_mode": _raw(nvml, "nvmlDeviceGetMigMode", h),
            "supported_event_types": supported,
            "xid_events_supported": (bool(supported & nvml.nvmlEventTypeXidCriticalError)
                                     if isinstance(supported, int) else False),
        }
        if event_set is not None and dev["xid_events_supported"]:
            xid_mask = nvml.nvmlEventTypeXidCriticalError
            registered = _raw(nvml, "nvmlDeviceRegisterEvents", h, xid_mask, event_set)
            dev["xid_events_registered"] = registered is None
        out["devices"].append(dev)
    if event_set is not None:
        try:
            nvml.nvmlEventSetWait_v2(event_set, 0)
            out["event_wait_0ms"] = "an event was pending"
        except nvml.NVMLError_Timeout:
            out["event_wait_0ms"] = "timeout (no pending events), as expected"
        except Exception as exc:
            out["event_wait_0ms"] = f"error: {exc}"
        _raw(nvml, "nvmlEventSetFree", event_set)
    _raw(nvml, "nvmlShutdown")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    report: dict[str, Any] = {"details": nvml_details()}
    probe = NvmlProbe()
    timings = []
    try:
        sample = None
        for _ in range(max(1, args.samples)):
            t0 = time.perf_counter()
            sample = probe.sample("gpu-check")
            timings.append(time.perf_counter() - t0)
        assert sample is not None
        t0 = time.perf_counter()
        ok, detail = validate_node(probe, expected_gpus=len(sample.gpus))
        validate_s = time.perf_counter() - t0
    except Exception as exc:  # the probe promises never to raise; say so loudly if it did
        report["probe_raised"] = repr(exc)
        print(json.dumps(report, indent=2, default=str))
        return 1
    finally:
        probe.close()
    report["sample"] = msgspec.to_builtins(sample)
    report["timing_ms"] = {
        "first_sample_incl_init": round(timings[0] * 1000, 2),
        "sample_median": round(statistics.median(timings[1:] or timings) * 1000, 2),
        "validate_node": round(validate_s * 1000, 2),
    }
    report["validation"] = {"ok": ok, "detail": detail}
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
