"""AMD (amd-smi) and Intel Gaudi (hl-smi) readings from recorded outputs (``tests/health/data``, sources in its
README): the same ``GpuSample`` fields as NVML's, so the same rules raise the same conditions and plan the same
drain for an AMD ECC fault or a Gaudi one; a missing or failing tool says "no GPUs: <why>" and never raises."""

from __future__ import annotations

import subprocess
from pathlib import Path

from taugrid.core.contracts import GpuSample, NodeSample
from taugrid.health import agent, smi
from taugrid.health.rules import Fleet, Policy, evaluate, plan
from taugrid.settings import Settings

DATA = Path(__file__).resolve().parent / "data"
AMD = (DATA / "amd-smi-metric.json").read_text()
GAUDI = (DATA / "hl-smi.csv").read_text()


def test_amd_smi_metric_reads_into_nvmls_fields() -> None:
    assert smi.parse_amd_smi_metric(AMD) == [
        GpuSample(index=0, name="AMD GPU", memory_total_mb=196592, memory_used_mb=150211, utilization_pct=97,
                  temperature_c=71, power_w=712.0, ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=0,
                  pcie_replay_count=0),
        # one uncorrectable and one deferred error: both are uncorrected data
        GpuSample(index=1, name="AMD GPU", memory_total_mb=196592, memory_used_mb=283, utilization_pct=0,
                  temperature_c=44, power_w=139.0, ecc_volatile_uncorrected=2, ecc_aggregate_uncorrected=2,
                  pcie_replay_count=12),
        # "N/A" and absent fields are unknown (None), never 0; the edge sensor stands in for a missing hotspot
        GpuSample(index=2, name="AMD GPU", memory_total_mb=196608, memory_used_mb=0, temperature_c=39),
    ]


def test_hl_smi_csv_reads_into_nvmls_fields() -> None:
    assert smi.parse_hl_smi_csv(GAUDI) == [
        GpuSample(index=0, uuid="01P4-HL3090A0-18-U4V193-22-04-00", name="HL-325L", pci_bus_id="0000:19:00.0",
                  memory_total_mb=131072, memory_used_mb=1024, utilization_pct=0, temperature_c=33, power_w=226.0,
                  ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=0),
        GpuSample(index=1, uuid="01P4-HL3090A0-18-U4V298-03-07-02", name="HL-325L", pci_bus_id="0000:1a:00.0",
                  memory_total_mb=131072, memory_used_mb=98304, utilization_pct=100, temperature_c=61, power_w=712.0,
                  ecc_volatile_uncorrected=2, ecc_aggregate_uncorrected=5),
        GpuSample(index=2, uuid="01P4-HL3090A0-18-U4V271-18-05-01", name="HL-325L", pci_bus_id="0000:43:00.0",
                  memory_total_mb=131072, memory_used_mb=0, temperature_c=96),
    ]


def _conditions(source: str, gpus: list[GpuSample]) -> tuple[list[tuple[str, int | None, str]], list[str]]:
    policy = Policy(clean_samples_to_release=2)
    sample = NodeSample(node="n1", time=10.0, cpus=8, memory_bytes=1 << 34, gpus=gpus, gpu_source=source)
    p = plan(evaluate(None, sample, policy=policy), policy=policy, fleet=Fleet(total=10))
    return (sorted((t.type, t.gpu, t.reason) for t in p.transitions if t.status == "True"),
            [a.kind for a in p.actions])


def test_an_amd_ecc_fault_and_a_gaudi_one_raise_what_an_nvidia_one_does() -> None:
    nvidia = [GpuSample(index=1, memory_total_mb=81920, temperature_c=40, ecc_volatile_uncorrected=2,
                        ecc_aggregate_uncorrected=2, pcie_replay_count=0)]
    amd = [g for g in smi.parse_amd_smi_metric(AMD) if g.index == 1]
    gaudi = [g for g in smi.parse_hl_smi_csv(GAUDI) if g.index == 1]
    expected = _conditions("nvml", nvidia)
    assert expected[0] == [("GpuEccUncorrectable", 1, "VolatileUncorrectedEcc")] and expected[1]
    assert _conditions("amd-smi", amd) == expected
    assert _conditions("hl-smi", gaudi) == expected


def test_a_gaudi_too_hot_raises_the_thermal_condition() -> None:
    hot = [g for g in smi.parse_hl_smi_csv(GAUDI) if g.index == 2]
    raised, _ = _conditions("hl-smi", hot)
    assert [(kind, gpu) for kind, gpu, _ in raised] == [("GpuThermal", 2)]


def test_the_probe_reports_its_tool_and_never_raises() -> None:
    calls: list[list[str]] = []

    def recorded(argv: list[str]) -> str:
        calls.append(argv)
        return GAUDI

    reading = smi.gaudi_probe(recorded).read_gpus()
    assert (reading.source, len(reading.gpus), reading.message) == ("hl-smi", 3, "3 GPU(s) via hl-smi")
    assert calls == [["hl-smi", "-Q", "index,uuid,name,bus_id,memory.total,memory.used,utilization.aip,"
                      "temperature.aip,power.draw,ecc.errors.uncorrected.volatile.total,"
                      "ecc.errors.uncorrected.aggregate.total", "-f", "csv,noheader,nounits"]]

    def missing(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    def failing(argv: list[str]) -> str:
        raise subprocess.CalledProcessError(1, argv, stderr="amdgpu driver not loaded\n")

    assert smi.amd_probe(missing).read_gpus() == smi.GpuReading(source="none", message="no GPUs: amd-smi not found")
    assert smi.amd_probe(failing).read_gpus() == smi.GpuReading(
        source="none", message="no GPUs: amd-smi exited 1: amdgpu driver not loaded")
    assert smi.amd_probe(lambda argv: '{"gpu_data": []}').read_gpus().message == "no GPUs: amd-smi lists no devices"
    assert smi.amd_probe(lambda argv: "not json").read_gpus().source == "none"


def test_the_agent_reads_gaudi_through_hl_smi_where_nvml_is_absent(tmp_path: Path, monkeypatch) -> None:
    """The node agent's choice, with a stand-in ``hl-smi`` on PATH that prints the recorded output; the real
    subprocess path runs it."""
    tool = tmp_path / "hl-smi"
    tool.write_text(f"#!/bin/sh\ncat '{DATA / 'hl-smi.csv'}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(agent, "nvml_library_missing", lambda: "NVML Shared Library Not Found (test)")
    chosen = agent.probe(Settings.from_env({}).local)
    assert isinstance(chosen, smi.SmiProbe) and chosen.source == "hl-smi"
    sample = chosen.sample("gaudi-node")
    assert (sample.gpu_source, [g.index for g in sample.gpus]) == ("hl-smi", [0, 1, 2])
