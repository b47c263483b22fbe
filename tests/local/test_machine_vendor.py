"""This machine's own GPUs where NVIDIA's library finds none (issue 26): AMD's as ``amd-smi`` lists them, Gaudi's as
``hl-smi`` does; the local cluster's machine node is then that vendor's, the default platform's quota is the vendor's
resource (no half-GPU profile for a vendor that cannot share), and a pod asking for the vendor's GPUs sees them
through its variables."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from taugrid.bus import platformstore
from taugrid.gpulib import vendor_tool_gpus
from taugrid.local import machine
from taugrid.local.controller import LocalCluster
from taugrid.settings import Settings
from taugrid.stack.machine_platform import machine_platform_yaml
from tests.inprocess import private_server
from tests.local.pools import settle
from tests.local.test_tas_pool import submit
from tests.local.test_vendor_pool import asking
from tests.platforms import CPU_MEMORY, lab_platform, workspace

DATA = Path(__file__).resolve().parents[1] / "health" / "data"
AMD = (DATA / "amd-smi-metric.json").read_text()  # 3 GPUs of 196592, 196592 and 196608 MB


def test_the_vendor_tools_give_a_count_and_the_smallest_memory() -> None:
    def amd(argv: list[str]) -> str:
        assert argv == ["amd-smi", "metric", "--json"]
        return AMD

    def gaudi(argv: list[str]) -> str:
        if argv[0] == "amd-smi":
            raise FileNotFoundError("amd-smi")
        assert argv == ["hl-smi", "-Q", "index,memory.total", "-f", "csv,noheader,nounits"]
        return "0, 131072\n1, 98304\n"

    def neither(argv: list[str]) -> str:
        raise subprocess.CalledProcessError(1, argv, stderr="no devices")

    assert vendor_tool_gpus(amd) == ("amd", 3, 196592)
    assert vendor_tool_gpus(gaudi) == ("intel-gaudi", 2, 98304)
    assert vendor_tool_gpus(neither) is None


@pytest.fixture
def amd_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``amd-smi`` on PATH printing the recorded output, and NVML finding no GPU (as on this machine)."""
    tool = tmp_path / "bin" / "amd-smi"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat '{DATA / 'amd-smi-metric.json'}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    monkeypatch.setattr(machine, "nvml_gpus", lambda: (0, 0))


def test_an_amd_machine_offers_amd_gpus_and_its_default_platform_quota_is_amds(amd_machine: None,
                                                                                  tmp_path: Path) -> None:
    got = machine.inventory(Settings.from_env({"TAU_NODE_NAME": "mi-box"}).local)
    assert (got.node, got.gpus, got.gpu_memory_mb, got.gpu_resource) == ("mi-box", 3, 196592, "amd.com/gpu")
    assert got.capacity["amd.com/gpu"] == 3.0 and "nvidia.com/gpu" not in got.capacity
    platform = yaml.safe_load(machine_platform_yaml(tmp_path))
    [group] = platform["cluster_queues"][0]["resource_groups"]
    assert group["covered_resources"] == ["cpu", "memory", "amd.com/gpu"]
    profiles = [p["name"] for p in platform["compute_profiles"]]
    assert "gpu-3" in profiles and "gpu-half" not in profiles  # AMD's device plugin gives whole GPUs only


async def test_a_pod_asking_for_amd_gpus_runs_on_an_amd_machine_and_sees_them(tmp_path: Path) -> None:
    text = lab_platform(quota={**CPU_MEMORY, "amd.com/gpu": "2"}, workspaces=[workspace(output_root="/tmp")])
    async with private_server(tmp_path, name="amd-machine") as (_url, bus):
        await platformstore.put_text(bus, text)
        cluster = LocalCluster(bus, data_dir=tmp_path, node="mi-box", gpu_count=2, gpu_memory_mb=196592,
                               capacity={"cpu": 4.0, "memory": float(8 << 30), "amd.com/gpu": 2.0},
                               gpu_resource="amd.com/gpu")
        await cluster.load()
        try:
            await submit(cluster, "rocm-a1", asking("rocm-a1", "amd.com/gpu", 2))
            await settle(cluster, lambda: not cluster.wls)
            said = json.loads(cluster.kubelet.read_log("rocm-a1-pod", "main", final=True)[0][-1].text)
        finally:
            await cluster.kubelet.close()
    assert said == {"TAU_NODE_NAME": "mi-box", "ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1",
                    "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
