"""GPUs of two vendors on the local pool (issue 26): a node declared with an AMD model gives its GPUs only to pods
asking for ``amd.com/gpu``, which see them through ROCm's variables (``ROCR_VISIBLE_DEVICES`` host indices,
``HIP_VISIBLE_DEVICES`` from 0) and no NVIDIA GPU; an NVIDIA pod lands on the NVIDIA node as before. Real processes
on a real bus."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster, settle
from tests.local.test_controller import job, main
from tests.local.test_tas_pool import submit
from tests.platforms import CPU_MEMORY, lab_platform, workspace

PLATFORM = lab_platform(
    quota={**CPU_MEMORY, "nvidia.com/gpu": "2", "amd.com/gpu": "2"}, workspaces=[workspace(output_root="/tmp")],
    local={"nodes": [{"name": "nv-0", "gpus": 2, "cpus": 8, "memory": "16Gi"},
                     {"name": "mi-0", "gpus": 2, "gpu_model": "amd-mi300x", "cpus": 8, "memory": "16Gi"}]})
KEYS = ("TAU_NODE_NAME", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES")
SAY = ["python3", "-c", f"import json, os\nprint(json.dumps({{k: os.environ.get(k) for k in {KEYS!r}}}))"]


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with pool_cluster(tmp_path, PLATFORM, name="vendor-pool", drain_grace_s=1.0) as (_bus, cluster):
        yield cluster


def asking(name: str, resource: str, count: int) -> dict[str, Any]:
    container = main(SAY)
    container["resources"]["requests"][resource] = str(count)
    return job(name, container)


async def test_each_vendors_pod_runs_on_its_vendors_node_and_sees_only_its_gpus(pool: LocalCluster) -> None:
    await submit(pool, "rocm-a1", asking("rocm-a1", "amd.com/gpu", 2))
    await submit(pool, "cuda-a1", asking("cuda-a1", "nvidia.com/gpu", 1))
    await settle(pool, lambda: not pool.wls)  # both ran and finished (a finished workload leaves wls)
    said = {name: json.loads(pool.kubelet.read_log(f"{name}-pod", "main", final=True)[0][-1].text)
            for name in ("rocm-a1", "cuda-a1")}
    assert said == {
        "rocm-a1": {"TAU_NODE_NAME": "mi-0", "ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1",
                    "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"},
        "cuda-a1": {"TAU_NODE_NAME": "nv-0", "ROCR_VISIBLE_DEVICES": None, "HIP_VISIBLE_DEVICES": None,
                    "CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0"},
    }
