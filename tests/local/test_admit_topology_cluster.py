"""The local cluster, real bus, simulated pods: a two-pod Job whose pod template requires a rack
(``kueue.x-k8s.io/podset-required-topology``, as ``render`` writes it) gets both pods on one rack's nodes, and each
pod's ``spec.nodeName`` says so; the same Job without the annotation spans the racks. The controller reads the
request from the Job (``admit.job_topology``) and the platform's topologies reach the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.core.contracts import BackendApply
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster

RACK = "cloud.provider.com/topology-rack"
NODES = "".join(f"    - {{name: {n}, gpus: 1, labels: {{taugrid.io/pool: gpu, {RACK}: {r}}}}}\n"
                for n, r in (("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("b2", "r2")))
PLATFORM = f"""\
topologies:
  - {{name: racks, levels: [{RACK}, kubernetes.io/hostname]}}
resource_flavors:
  - {{name: gpu, topology_name: racks, node_labels: {{taugrid.io/pool: gpu}}}}
cluster_queues:
  - name: team
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: gpu
            resources:
              - {{name: cpu, nominal_quota: 16}}
              - {{name: memory, nominal_quota: 64Gi}}
              - {{name: nvidia.com/gpu, nominal_quota: 4}}
local_queues:
  - {{name: default, namespace: default, cluster_queue: team}}
workspaces:
  - {{name: default, namespace: default, local_queue: default, output_root: /tmp}}
local:
  nodes:
{NODES}"""


@pytest.fixture
async def racks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalCluster]:
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")  # no processes: placement is what is under test
    async with pool_cluster(tmp_path, PLATFORM, name="racks") as (_bus, cluster):
        yield cluster


def gpu_job(name: str, *, pods: int, annotations: dict[str, str]) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11-slim", "command": ["true"],
                 "env": [{"name": "SIMULATED_DURATION", "value": "600"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"},
                               "limits": {"nvidia.com/gpu": "1"}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": name[:-3],
                                    "taugrid.io/workspace": "default", "taugrid.io/attempt": "1"}},
            "spec": {"suspend": True, "backoffLimit": 0, "completions": pods, "parallelism": pods,
                     "completionMode": "Indexed",
                     "template": {"metadata": {"labels": {}, "annotations": annotations},
                                  "spec": {"restartPolicy": "Never", "subdomain": f"{name}-headless",
                                           "containers": [container]}}}}


async def placed(c: LocalCluster, name: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await c.tick()
        wl = c.wls[name]
        if wl.pods and all(p.phase == "Running" for p in wl.pods):
            return [p.obj["spec"]["nodeName"] for p in sorted(wl.pods, key=lambda p: p.index)]
        await asyncio.sleep(0.05)
    raise AssertionError({n: (w.state, [(p.node, p.phase) for p in w.pods]) for n, w in c.wls.items()})


async def apply(c: LocalCluster, name: str, *, pods: int, annotations: dict[str, str]) -> None:
    await c.apply(BackendApply(run_id=name[:-3], workspace="default", attempt=1,
                               manifests=[gpu_job(name, pods=pods, annotations=annotations)]))


async def test_a_job_requiring_a_rack_runs_on_one_racks_nodes(racks: LocalCluster) -> None:
    c = racks
    await apply(c, "first-a1", pods=1, annotations={})
    assert await placed(c, "first-a1") == ["a1"]
    await apply(c, "rack-a1", pods=2, annotations={"kueue.x-k8s.io/podset-required-topology": RACK})
    assert await placed(c, "rack-a1") == ["b1", "b2"]  # r1 has one free GPU left: the run goes whole to r2
    assert c.admitter.requests["rack-a1"].topology is not None


async def test_the_same_job_without_the_request_spans_the_racks(racks: LocalCluster) -> None:
    c = racks
    await apply(c, "first-a1", pods=1, annotations={})
    assert await placed(c, "first-a1") == ["a1"]
    await apply(c, "plain-a1", pods=2, annotations={})
    assert await placed(c, "plain-a1") == ["a2", "b1"]
