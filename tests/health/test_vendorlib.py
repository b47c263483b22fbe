"""AMD's and Gaudi's health events (``health.vendorlib``) through stand-ins of ``amdsmi`` and ``pyhlml`` whose names
and codes are the real packages' (checked here against their installed sources), normalised by the data table
(``health.vendorcodes``) into the conditions, drains and repair ladders NVIDIA's faults get."""

from __future__ import annotations

import ast
import importlib.util
import logging
import uuid
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.core.contracts import GpuEvent, NodeRepair, NodeSample
from taugrid.health import repair, smi
from taugrid.health.monitor import HealthMonitor
from taugrid.health.rules import Fleet, Policy, evaluate, plan
from taugrid.health.vendorcodes import TABLE, meaning
from taugrid.health.vendorlib import (
    AMDSMI_STATUS_MORE_DATA,
    AMDSMI_STATUS_NOT_SUPPORTED,
    HLML_EVENTS,
    PAGE_STATUS,
    ROW_CAUSES,
    AmdLibEvents,
    GaudiLibEvents,
)
from taugrid.health.wire import NodeState
from tests.health import vendorfakes
from tests.health.vendorfakes import FakeAmdSmi, FakePyhlml

DATA = Path(__file__).resolve().parent / "data"


def _source(module: str, file: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is a test dependency (pyproject.toml [test])"
    return ast.parse((Path(spec.origin).parent / file).read_text())


def _defined(tree: ast.Module) -> set[str]:
    """Top-level functions, classes, assignments and imported names of a module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _int(node: ast.expr) -> int | None:
    """An integer literal, or a shift or or of them (``(1 << 3)``); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift | ast.BitOr):
        left, right = _int(node.left), _int(node.right)
        if left is not None and right is not None:
            return left << right if isinstance(node.op, ast.LShift) else left | right
    return None


def _constants(tree: ast.Module) -> dict[str, int]:
    """``NAME = <int>`` at any depth (module constants and IntEnum members)."""
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _int(node.value)
            if value is not None:
                out[node.targets[0].id] = value
    return out


def test_the_stand_ins_use_names_and_codes_the_installed_packages_have() -> None:
    """amdsmi's module cannot be imported without libamd_smi.so, so its source is read, as is pyhlml's."""
    exported = _defined(_source("amdsmi", "__init__.py"))
    assert set(vendorfakes.AMDSMI_NAMES) <= exported, set(vendorfakes.AMDSMI_NAMES) - exported
    interface = _defined(_source("amdsmi", "amdsmi_interface.py"))
    assert set(vendorfakes.AMDSMI_INTERFACE_NAMES) <= interface
    wrapper = _constants(_source("amdsmi", "amdsmi_wrapper.py"))
    assert {wrapper[name]: name for name in PAGE_STATUS.values()} == PAGE_STATUS
    assert (wrapper["AMDSMI_STATUS_NOT_SUPPORTED"], wrapper["AMDSMI_STATUS_MORE_DATA"]) == (
        AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_MORE_DATA)
    for block in vendorfakes.AmdSmiGpuBlock:
        assert wrapper[f"AMDSMI_GPU_BLOCK_{block.name}"] == block.value
    for key in TABLE:
        if key[0] == "amd" and key[1].startswith("AMDSMI_GPU_BLOCK_"):
            assert key[1].split()[0] in wrapper, key
    for sev in ("FATAL", "NON_FATAL_UNCORRECTED", "NON_FATAL_CORRECTED"):
        assert f"AMDSMI_CPER_SEV_{sev}" in wrapper and ("amd", f"AMDSMI_CPER_SEV_{sev}") in TABLE

    assert set(vendorfakes.PYHLML_NAMES) <= _defined(_source("pyhlml", "main.py"))
    generated = _constants(_source("pyhlml", "pyhlml_types_generated.py"))
    for name in HLML_EVENTS:
        assert generated[name] == getattr(vendorfakes.HLML_DEFINES, name)
        assert ("intel-gaudi", name) in TABLE
    for cause in ROW_CAUSES:
        assert generated[cause] == getattr(vendorfakes.HLML_ROW_REPLACEMENT_CAUSE, cause)
    for code in ("HLML_ERROR_NOT_SUPPORTED", "HLML_ERROR_TIMEOUT"):
        assert generated[code] == getattr(vendorfakes.HLML_RETURN, code)


def test_amd_ecc_per_block_bad_pages_and_ras_records_become_events() -> None:
    lib = FakeAmdSmi(2)
    lib.ras_record(0, "fatal", [30])  # before the agent watched: history
    lib.ecc[1]["UMC"] = (3, 0)
    del lib.ecc[1]["SDMA"]  # a block the device does not report: AMDSMI_STATUS_NOT_SUPPORTED
    reader = AmdLibEvents(lib)
    first = reader.read()
    assert [(d.gpu, d.pci, d.events, d.rows_pending) for d in first] == [
        (0, "0000:0c:00.0", [], False), (1, "0000:0d:00.0", [], False)]
    lib.uncorrectable(1, "UMC")
    lib.ecc[0]["GFX"] = (0, 1)  # a deferred error
    lib.ras_record(0, "non_fatal_uncorrected", [])
    lib.ras_record(0, "fatal", [30, 31])
    lib.pages[1] = [{"page_address": 0x7F000, "page_size": 4096, "status": 1}]
    got = {d.gpu: d for d in reader.read()}
    assert [(e.kind, e.component, e.action, e.condition, e.code, e.severity) for e in got[0].events] == [
        ("ecc-deferred", "gfx", "reset", "GpuEccUncorrectable", "AMDSMI_GPU_BLOCK_GFX deferred_count", 3),
        ("ras-uncorrected", "device", "reset", "GpuEccUncorrectable", "AMDSMI_CPER_SEV_NON_FATAL_UNCORRECTED", 3),
        ("ras-fatal", "device", "reset", "GpuFatalError", "AMDSMI_CPER_SEV_FATAL AFID 30,31", 3),
    ]
    assert got[0].events[2].message == ("amd GPU 0 (0000:0c:00.0): ras-fatal in device (AMDSMI_CPER_SEV_FATAL AFID "
                                        "30,31); RAS record r2 at 2026/12/01 21:40:00; action: reset")
    assert [(e.code, e.pci, e.vendor) for e in got[1].events] == [
        ("AMDSMI_GPU_BLOCK_UMC uncorrectable_count", "0000:0d:00.0", "amd")]
    assert got[1].rows_pending is True  # a page pending retirement waits for a reset
    assert all(not d.events for d in reader.read())  # each record and each rise is one event


def test_amd_bad_pages_past_the_threshold_or_unreservable_ask_for_replacement_once() -> None:
    lib = FakeAmdSmi(1)
    lib.threshold = 2
    reader = AmdLibEvents(lib)
    reader.read()
    lib.pages[0] = [{"page_address": 0x1000, "page_size": 4096, "status": 0},
                    {"page_address": 0x2000, "page_size": 4096, "status": 0},
                    {"page_address": 0x3000, "page_size": 4096, "status": 2}]
    (dev,) = reader.read()
    assert [(e.kind, e.action, e.condition, e.severity) for e in dev.events] == [
        ("page-unreservable", "rma", "GpuRmaRequired", 4), ("bad-page-threshold", "rma", "GpuRmaRequired", 4)]
    assert "2 retired page(s), threshold 2" in dev.events[1].message
    assert reader.read()[0].events == []


def test_many_ras_records_are_read_past_one_call() -> None:
    lib = FakeAmdSmi(1)
    reader = AmdLibEvents(lib)
    reader.read()
    for _ in range(45):
        lib.ras_record(0, "non_fatal_corrected", [])
    events = reader.read()[0].events
    assert len(events) == 45  # 20, 20 (MORE_DATA each), then 5
    assert {(e.kind, e.severity, e.condition) for e in events} == {("ras-corrected", 0, "")}  # corrected: no fault


def test_gaudi_events_and_replaced_rows_become_events() -> None:
    lib = FakePyhlml(2)
    reader = GaudiLibEvents(lib)
    assert [(d.gpu, d.pci, d.events, d.rows_pending) for d in reader.read()] == [
        (0, "0000:19:00.0", [], False), (1, "0000:1a:00.0", [], False)]
    assert set(lib.registered.values()) == {1 | 2 | 4 | 8 | 16 | 32}  # every HLML_EVENT_* bit on every device
    lib.raise_event(0, "HLML_EVENT_CRITICAL_ERR")
    lib.raise_event(0, "HLML_EVENT_CRITICAL_ERR")
    lib.raise_event(1, "HLML_EVENT_DRAM_DERR")
    lib.raise_event(1, "HLML_EVENT_ECC_SERR")
    lib.rows[1][1] = 2  # two rows replaced after double-bit errors
    lib.pending[1] = 1
    got = reader.read()
    assert [(e.kind, e.component, e.action, e.condition, e.code) for e in got[0].events] == [
        ("critical", "device", "reset", "GpuFatalError", "HLML_EVENT_CRITICAL_ERR")]
    assert [(e.kind, e.component, e.action, e.condition, e.code) for e in got[1].events] == [
        ("ecc-uncorrectable", "hbm", "reset", "GpuEccUncorrectable", "HLML_EVENT_DRAM_DERR"),
        ("ecc-corrected", "sram", "none", "", "HLML_EVENT_ECC_SERR"),
        ("row-replaced", "hbm", "alert", "GpuVendorEvent", "HLML_ROW_REPLACEMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
    ]
    assert got[1].rows_pending is True
    assert all(not d.events for d in reader.read())


def test_a_library_that_cannot_load_is_said_once_and_gives_no_devices(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(FakePyhlml):
        def hlmlInit(self) -> None:  # noqa: N802
            raise vendorfakes.HLMLError(9)  # HLML_ERROR_DRIVER_NOT_LOADED

    reader = GaudiLibEvents(Broken())
    with caplog.at_level(logging.WARNING, logger="taugrid.health.vendorlib"):
        assert reader.read() == [] and reader.read() == []
    assert [r.getMessage() for r in caplog.records] == [
        "pyhlml: no health events: pyhlml unavailable (HLMLError(9))"]


def test_an_unknown_code_is_an_alert_never_a_drain() -> None:
    m = meaning("amd", "AMDSMI_SOMETHING_NEW")
    assert (m.action, m.condition) == ("alert", "GpuVendorEvent")


def _amd_probe(lib: FakeAmdSmi, calls: list[list[str]]) -> smi.SmiProbe:
    text = (DATA / "amd-smi-metric.json").read_text()

    def runner(argv: list[str]) -> str:
        calls.append(argv)
        return text

    return smi.amd_probe(runner, events=AmdLibEvents(lib))


def _plan(sample: NodeSample, prev: NodeState | None = None) -> tuple[NodeState, list[tuple[str, int | None, str]]]:
    policy = Policy(clean_samples_to_release=2)
    p = plan(evaluate(prev, sample, policy=policy), policy=policy, fleet=Fleet(total=10))
    return p.state, sorted((t.type, t.gpu, t.reason) for t in p.transitions if t.status == "True")


def test_a_fatal_amd_ras_record_drains_the_node_and_its_ladder_resets_with_amd_smi() -> None:
    lib, calls = FakeAmdSmi(3), []
    probe = _amd_probe(lib, calls)
    st, raised = _plan(probe.sample("mi-0"))
    assert ("GpuEccUncorrectable", 1, "VolatileUncorrectedEcc") in raised  # the metric's own ECC total
    lib.ras_record(2, "fatal", [7])
    sample = probe.sample("mi-0")
    assert (sample.gpu_vendor, sample.gpu_model) == ("amd", "AMD GPU")
    assert [e for g in sample.gpus for e in g.events] == [GpuEvent(
        vendor="amd", gpu=2, pci="0000:0e:00.0", component="device", kind="ras-fatal", severity=3, action="reset",
        condition="GpuFatalError", code="AMDSMI_CPER_SEV_FATAL AFID 7",
        message="amd GPU 2 (0000:0e:00.0): ras-fatal in device (AMDSMI_CPER_SEV_FATAL AFID 7); RAS record r0 at "
                "2026/12/01 21:40:00; action: reset")]
    st, raised = _plan(sample, st)
    assert raised == [("GpuFatalError", 2, "AMDSMI_CPER_SEV_FATAL AFID 7")]
    assert st.cordoned and st.drained
    assert repair.next_step(st, now=1.0, budget=3, retry_s=0) == ("gpu-reset", [1, 2])
    calls.clear()
    assert probe.reset_gpu(2) == (True, "GPU 2 reset (amd-smi reset --gpureset --gpu 2)")
    assert calls == [["amd-smi", "reset", "--gpureset", "--gpu", "2"]]


def test_an_amd_gpu_past_its_bad_page_threshold_goes_straight_to_replacement() -> None:
    lib, calls = FakeAmdSmi(3), []
    lib.threshold = 1
    probe = _amd_probe(lib, calls)
    st, _ = _plan(probe.sample("mi-0"))
    lib.pages[0] = [{"page_address": 0x1000, "page_size": 4096, "status": 0}]
    st, raised = _plan(probe.sample("mi-0"), st)
    assert raised == [("GpuRmaRequired", 0, "bad-page-threshold")]
    assert repair.next_step(st, now=1.0, budget=3, retry_s=0) == ("replace-node", [0, 1])


def test_a_gaudi_critical_event_drains_and_its_reset_names_the_device_by_pci_address() -> None:
    lib, calls = FakePyhlml(3, bus_ids=["0000:19:00.0", "0000:1a:00.0", "0000:43:00.0"]), []
    text = (DATA / "hl-smi.csv").read_text()

    def runner(argv: list[str]) -> str:
        calls.append(argv)
        return text

    probe = smi.gaudi_probe(runner, events=GaudiLibEvents(lib))
    st, _ = _plan(probe.sample("gaudi-0"))
    lib.raise_event(0, "HLML_EVENT_CRITICAL_ERR")
    lib.pending[0] = 1
    sample = probe.sample("gaudi-0")
    assert (sample.gpu_vendor, sample.gpu_model) == ("intel-gaudi", "HL-325L")
    st, raised = _plan(sample, st)
    assert ("GpuFatalError", 0, "HLML_EVENT_CRITICAL_ERR") in raised
    assert ("GpuRemappedRowsPending", 0, "RowRemapPending") in raised
    assert st.cordoned and st.drained
    step, gpus = repair.next_step(st, now=1.0, budget=3, retry_s=0)
    assert step == "gpu-reset" and 0 in gpus
    calls.clear()
    assert probe.reset_gpu(0) == (True, "GPU 0 reset (hl-smi -i 0000:19:00.0 -r)")
    assert calls == [["hl-smi", "-i", "0000:19:00.0", "-r"]]
    assert probe.reset_gpu(7)[0] is False and calls == [["hl-smi", "-i", "0000:19:00.0", "-r"]]


def test_a_validation_read_leaves_pending_events_for_the_next_sample() -> None:
    lib = FakePyhlml(3, bus_ids=["0000:19:00.0", "0000:1a:00.0", "0000:43:00.0"])
    probe = smi.gaudi_probe(lambda argv: (DATA / "hl-smi.csv").read_text(), events=GaudiLibEvents(lib))
    probe.read_gpus()
    lib.raise_event(1, "HLML_EVENT_CRITICAL_ERR")
    assert all(not g.events for g in probe.read_gpus(with_events=False).gpus)
    assert [e.code for g in probe.read_gpus().gpus for e in g.events] == ["HLML_EVENT_CRITICAL_ERR"]


def test_a_declared_pool_node_reports_its_models_vendor_and_the_node_keeps_it_while_unreadable() -> None:
    from taugrid.config.platform import LocalNode
    from taugrid.health.pool import declared_probe

    probe = declared_probe(LocalNode(name="mi-0", gpus=2, gpu_model="amd-mi300x"))
    sample = probe.sample("mi-0")
    assert (sample.gpu_vendor, sample.gpu_model, [g.memory_total_mb for g in sample.gpus]) == (
        "amd", "amd-mi300x", [192 << 10, 192 << 10])
    st, _ = _plan(sample)
    st, _ = _plan(NodeSample(node="mi-0", time=2.0, cpus=8, memory_bytes=1 << 34, gpu_source="none"), st)
    assert (st.gpu_source, st.gpu_vendor, st.gpu_model) == ("none", "amd", "amd-mi300x")


async def test_the_monitor_asks_for_replacement_at_once_for_an_rma_and_says_why(bus: Bus) -> None:
    """Over a real nats-server: the RMA's ladder starts at replace-node, with its own reason (no budget spent)."""
    node = f"mi-{uuid.uuid4().hex[:6]}"
    lib = FakeAmdSmi(1)
    lib.threshold = 1
    clean = ('{"gpu_data": [{"gpu": 0, "ecc": {"total_uncorrectable_count": 0, "total_deferred_count": 0}, '
             '"mem_usage": {"total_vram": {"value": 196592, "unit": "MB"}}}]}')
    probe = smi.amd_probe(lambda argv: clean, events=AmdLibEvents(lib))
    monitor = HealthMonitor(bus, policy=Policy(clean_samples_to_release=2, max_cordoned=10_000,
                                               max_cordoned_fraction=1.0))
    await monitor.process(probe.sample(node))
    lib.pages[0] = [{"page_address": 0x1000, "page_size": 4096, "status": 0}]
    plan = await monitor.process(probe.sample(node))
    assert plan is not None and [(a.kind, a.drain) for a in plan.actions] == [("cordon", True)]
    msg = await bus.js.get_last_msg("NODES", f"node.{node}.repair")
    done = msgspec.json.decode(msg.data, type=NodeRepair)
    assert (done.step, done.ok, done.attempt, done.gpus) == ("replace-node", False, 1, [0])
    assert done.outcome == (
        "the fault needs the GPU replaced: amd GPU 0 (0000:0c:00.0): bad-page-threshold in memory "
        "(bad-page-threshold); 1 retired page(s), threshold 1; action: rma; the node stays cordoned until it is "
        "replaced or repaired by hand")
