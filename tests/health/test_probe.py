"""Probes: NVML on this GPU-less machine, the NVML code path against a scripted stand-in, DeclaredProbe."""

from __future__ import annotations

import types
from typing import Any

import pytest

from taugrid.health import agent
from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import DeclaredProbe, validate_node
from taugrid.settings import Settings


def test_nvml_probe_without_gpus_says_so_and_never_raises() -> None:
    probe = NvmlProbe()
    try:
        s = probe.sample("laptop")
        s2 = probe.sample("laptop")  # a second call (init not retried yet) is just as quiet
    finally:
        probe.close()
    for x in (s, s2):
        assert x.gpu_source in {"none", "nvml"}
    if s.gpu_source == "none":  # the normal case on this machine
        assert s.gpus == [] and s.message.startswith("no GPUs: ")
        assert len(s.message) > len("no GPUs: ")
        assert validate_node(probe) == (True, "no GPUs on this node: nothing to validate")
    assert s.cpus >= 1 and s.memory_bytes > 0 and s.memory_available_bytes > 0


class _Err(Exception):
    pass


def fake_nvml(*, count: int = 2, lost: set[int] | None = None, events: list[tuple[int, int]] | None = None,
              init_error: Exception | None = None) -> Any:
    """A stand-in for ``pynvml`` with just the names NvmlProbe uses (the idea of DCGM's NVML injection)."""
    m = types.SimpleNamespace()
    m.NVMLError = _Err
    m.NVMLError_NotSupported = type("NotSupported", (_Err,), {})
    m.NVMLError_GpuIsLost = type("GpuIsLost", (_Err,), {})
    m.NVMLError_Timeout = type("Timeout", (_Err,), {})
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC, m.NVML_AGGREGATE_ECC = 1, 0, 1
    m.NVML_TEMPERATURE_GPU = 0
    m.nvmlEventTypeXidCriticalError = 8
    m.nvmlClocksEventReasonGpuIdle, m.nvmlClocksEventReasonHwThermalSlowdown = 1, 0x40
    lost = lost or set()
    pending = list(events or [])

    def init() -> None:
        if init_error is not None:
            raise init_error

    def handle(i: int) -> int:
        return i

    def meminfo(h: int) -> Any:
        if h in lost:
            raise m.NVMLError_GpuIsLost("GPU is lost")
        return types.SimpleNamespace(total=80 << 30, used=1 << 30)

    def not_supported(*a: Any) -> Any:
        raise m.NVMLError_NotSupported("Not Supported")

    def wait(es: Any, timeout: int) -> Any:
        if not pending:
            raise m.NVMLError_Timeout("Timeout")
        dev, xid = pending.pop(0)
        return types.SimpleNamespace(device=dev, eventType=8, eventData=xid)

    m.registered = []
    m.nvmlInit, m.nvmlShutdown = init, lambda: None
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = handle
    m.nvmlDeviceGetMemoryInfo = meminfo
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}".encode()
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{0x3b + h:02X}:00.0".encode())
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=55, memory=10)
    m.nvmlDeviceGetTemperature = lambda h, s: 61
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0 if counter == 0 else 3
    m.nvmlDeviceGetRemappedRows = lambda h: (0, 0, h == 1, False)
    m.nvmlDeviceGetPcieReplayCounter = not_supported  # e.g. a consumer card
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x41
    m.nvmlEventSetCreate = lambda: "es"
    m.nvmlDeviceGetSupportedEventTypes = lambda h: 0xFF
    m.nvmlDeviceRegisterEvents = lambda h, mask, es: m.registered.append((h, mask))
    m.nvmlEventSetWait_v2 = wait
    m.nvmlEventSetFree = lambda es: None
    return m


def test_nvml_path_reads_every_field_and_unsupported_is_unknown() -> None:
    nvml = fake_nvml(events=[(1, 79), (1, 79), (0, 13)])
    probe = NvmlProbe(nvml=nvml)
    s = probe.sample("h200")
    assert s.gpu_source == "nvml" and s.message == ""
    assert nvml.registered == [(0, 8), (1, 8)]  # XID events registered on every GPU
    g0, g1 = s.gpus
    assert (g0.uuid, g0.name, g0.memory_total_mb, g0.memory_used_mb) == ("GPU-0", "NVIDIA H200", 81920, 1024)
    assert (g0.utilization_pct, g0.temperature_c, g0.power_w) == (55, 61, 312.5)
    assert (g0.ecc_volatile_uncorrected, g0.ecc_aggregate_uncorrected) == (0, 3)
    assert g0.pcie_replay_count is None  # NotSupported → unknown, never 0
    assert g0.throttle_reasons == ["GpuIdle", "HwThermalSlowdown"]
    assert (g1.remapped_rows_pending, g1.remapped_rows_failure) == (True, False)
    assert g0.xid_events == [13] and g1.xid_events == [79]
    assert probe.sample("h200").gpus[1].xid_events == []  # events are drained once
    assert validate_node(probe, expected_gpus=2) == (False, "GPU 1 has remapped rows pending a reset")
    probe.close()


def test_a_lost_gpu_is_left_out_and_named() -> None:
    probe = NvmlProbe(nvml=fake_nvml(count=2, lost={1}))
    s = probe.sample("n")
    assert [g.index for g in s.gpus] == [0] and "GPU 1 not answering" in s.message
    ok, detail = validate_node(probe, expected_gpus=2)
    assert not ok and "1 of 2 GPUs answer" in detail


@pytest.mark.parametrize("nvml, why", [
    (fake_nvml(init_error=_Err("Driver Not Loaded")), "no GPUs: NVML did not initialise: Driver Not Loaded"),
    (fake_nvml(count=0), "no GPUs: NVML found 0 devices"),
])
def test_nvml_failure_modes_report_none(nvml: Any, why: str) -> None:
    s = NvmlProbe(nvml=nvml).sample("n")
    assert (s.gpu_source, s.gpus, s.message) == ("none", [], why)


def test_declared_probe_spec_and_fault_injection() -> None:
    probe = DeclaredProbe.from_spec("2x40000")
    assert [g.memory_total_mb for g in probe.sample("sim").gpus] == [40000, 40000]
    assert len(DeclaredProbe.from_spec("4").gpus) == 4
    with pytest.raises(ValueError, match="TAU_DECLARED_GPUS"):
        DeclaredProbe.from_spec("two")
    probe.inject_xid(1, 79)
    probe.inject_ecc(0, volatile=2)
    probe.inject_temperature(0, 95)
    s = probe.sample("sim")
    assert s.gpu_source == "declared"
    assert s.gpus[1].xid_events == [79] and s.gpus[0].ecc_volatile_uncorrected == 2
    assert s.gpus[0].temperature_c == 95
    assert validate_node(probe, expected_gpus=2) == (False, "GPU 0 has 2 uncorrected ECC error(s)")
    probe.reset_gpu(0)
    assert validate_node(probe, expected_gpus=2)[0]
    probe.hide_gpu(1)
    assert len(probe.sample("sim").gpus) == 1


def test_env_selects_declared_or_nvml() -> None:
    assert isinstance(agent.probe(Settings.from_env({"TAU_DECLARED_GPUS": "2x80000"}).local), DeclaredProbe)
    nvml = agent.probe(Settings.from_env({}).local)
    assert isinstance(nvml, NvmlProbe)
    nvml.close()
