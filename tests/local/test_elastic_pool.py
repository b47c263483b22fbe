"""The local cluster, real bus, simulated pods: an elastic Job (``kueue.x-k8s.io/elastic-job`` with taugrid's
``taugrid.io/elastic`` range, as ``render`` writes them) starts at 2 pods and grows to its maximum of 3 in free
quota; a higher-priority Job needing 2 GPUs (one is free) shrinks it to 2 instead of evicting it (the removed pod is
deleted first, then the newcomer starts); when the newcomer ends the run grows back to 3, each new pod placed on a free
GPU."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus.replay import replay
from taugrid.core.contracts import BackendApply, ExecResized, WatchEvent
from taugrid.health.wire import NodeCordon, NodeUncordon
from taugrid.kube.translate import translate
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster, settle
from tests.local.test_pool import node_event

PLATFORM = """\
priority_classes:
  - {name: low, value: 10}
  - {name: high, value: 100}
resource_flavors:
  - {name: gpu}
cluster_queues:
  - name: team
    preemption: {within_cluster_queue: LowerPriority}
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: gpu
            resources:
              - {name: cpu, nominal_quota: 16}
              - {name: memory, nominal_quota: 64Gi}
              - {name: nvidia.com/gpu, nominal_quota: 4}
local_queues:
  - {name: default, namespace: default, cluster_queue: team}
workspaces:
  - {name: default, namespace: default, local_queue: default, output_root: /tmp}
local:
  nodes:
    - {name: g1, gpus: 4}
"""


@pytest.fixture
async def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalCluster]:
    async with simulated(tmp_path, monkeypatch, PLATFORM) as cluster:
        yield cluster


@pytest.fixture
async def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalCluster]:
    platform = PLATFORM.replace("    - {name: g1, gpus: 4}", "    - {name: g1, gpus: 2}\n    - {name: g2, gpus: 2}")
    async with simulated(tmp_path, monkeypatch, platform) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str) -> AsyncIterator[LocalCluster]:
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")
    async with pool_cluster(tmp_path, platform, name="elastic") as (_bus, cluster):
        yield cluster


def job(name: str, *, pods: int, priority: str, seconds: float, elastic: str = "", checkpoints: Path | None = None
        ) -> dict[str, Any]:
    ckpt = [{"name": "TAU_CHECKPOINT_DIR", "value": str(checkpoints)}] if checkpoints else []
    container = {"name": "main", "image": "python:3.11-slim", "command": ["true"],
                 "env": [{"name": "SIMULATED_DURATION", "value": str(seconds)}, *ckpt],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": "1"},
                               "limits": {"nvidia.com/gpu": "1"}}}
    annotations = {"kueue.x-k8s.io/elastic-job": "true", "taugrid.io/elastic": elastic} if elastic else {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations,
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "kueue.x-k8s.io/priority-class": priority,
                                    "taugrid.io/run-id": name[:-3], "taugrid.io/workspace": "default",
                                    "taugrid.io/attempt": "1"}},
            "spec": {"suspend": True, "backoffLimit": 0, "completions": 3 if elastic else pods, "parallelism": pods,
                     "completionMode": "Indexed",
                     "template": {"metadata": {"labels": {}, "annotations": {}},
                                  "spec": {"restartPolicy": "Never", "subdomain": f"{name}-headless",
                                           "containers": [container]}}}}


def sizes(c: LocalCluster) -> dict[str, Any]:
    return {n: (w.state, w.pods_wanted, [(p.index, p.phase, p.gpus) for p in w.pods]) for n, w in c.wls.items()}


async def until(c: LocalCluster, check: Callable[[], bool], timeout: float = 30) -> None:
    await settle(c, check, timeout, show=sizes)


def running(c: LocalCluster, name: str) -> list[int]:
    wl = c.wls.get(name)
    return sorted(p.index for p in wl.pods if p.phase == "Running") if wl else []


async def test_an_elastic_job_grows_shrinks_for_a_preemptor_and_grows_back(pool: LocalCluster, tmp_path: Path
                                                                         ) -> None:
    """And what the admission watcher reads on the bus: every resize once, as ``exec.resized`` with the old and
    new count, the cause (the preemptor named by its run) and the newest checkpoint's step in the run's
    checkpoint directory then, the Job's parallelism and the Workload's admitted count as they are now."""
    c = pool
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step-10.pt").write_text("")
    await c.apply(BackendApply(run_id="el", workspace="default", attempt=1, manifests=[
        job("el-a1", pods=2, priority="low", seconds=600, elastic="1:3:1:0", checkpoints=ckpt)]))
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2])  # grown into free quota, up to its maximum
    assert c.wls["el-a1"].pods_wanted == 3
    (ckpt / "step-20.pt").write_text("")
    (ckpt / ".step-30.pt").write_text("")  # still being written: not a checkpoint yet
    await c.apply(BackendApply(run_id="hi", workspace="default", attempt=1,
                               manifests=[job("hi-a1", pods=2, priority="high", seconds=1.5)]))
    await until(c, lambda: len(running(c, "hi-a1")) == 2)
    assert running(c, "el-a1") == [0, 1]  # one pod given up (one GPU was free), never evicted
    assert c.wls["el-a1"].state == "running" and c.wls["el-a1"].requeues == 0
    gpus = [g for w in c.wls.values() for p in w.pods if p.phase == "Running" for g in p.gpus]
    assert sorted(gpus) == [0, 1, 2, 3]
    assert c.wls["el-a1"].job["spec"]["parallelism"] == 2
    assert [a["count"] for a in c.wls["el-a1"].workload["status"]["admission"]["podSetAssignments"]] == [2]
    (ckpt / ".step-30.pt").rename(ckpt / "step-30.pt")
    await until(c, lambda: c.wls.get("hi-a1") is None or c.wls["hi-a1"].state != "running", timeout=30)
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2])  # grown back once the quota freed
    assert sorted(g for p in c.wls["el-a1"].pods for g in p.gpus) == [0, 1, 2]

    jobs = await replay(c.bus, stream="K8S", subject="k8s.local.job.default.el-a1.>")
    events = [out for m in jobs for out in translate(msgspec.json.decode(m.data, type=WatchEvent))
              if out.event_type == "exec.resized"]
    once = list({out.dedup: out for out in events}.values())  # a repeated change keeps its message id
    assert [(o.payload.old_count, o.payload.new_count, o.payload.cause, o.payload.preemptor,  # type: ignore[attr-defined]
             o.payload.checkpoint_step) for o in once] == [  # type: ignore[attr-defined]
        (2, 3, "Grown", "", 10), (3, 2, "ShrunkForPreemptor", "hi", 20), (2, 3, "Grown", "", 30)]
    assert {(o.run_id, o.attempt) for o in once} == {("el", 1)}
    workloads = await replay(c.bus, stream="K8S", subject="k8s.local.workload.default.job-el-a1.>")
    last = msgspec.json.decode(workloads[-1].data, type=WatchEvent).object
    assert [a["count"] for a in last["status"]["admission"]["podSetAssignments"]] == [3]


async def test_a_drain_under_an_elastic_run_shrinks_it_off_the_node_and_it_grows_back_there_once_healthy(
        two_nodes: LocalCluster) -> None:
    """Issue 25 item 4: the faulty node's pods (the highest indices) are given up, the run goes on at 2 and is not
    failed; once the node is uncordoned, the run grows back onto it."""
    c = two_nodes
    await c.apply(BackendApply(run_id="el", workspace="default", attempt=1,
                               manifests=[job("el-a1", pods=4, priority="low", seconds=600, elastic="1:4:1:0")]))
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2, 3])
    wl = c.wls["el-a1"]
    assert sorted((p.index, p.node) for p in wl.pods) == [(0, "g1"), (1, "g1"), (2, "g2"), (3, "g2")]
    await c.on_node(node_event("node.g2.cordon", NodeCordon(node="g2", reason="XID 79", drain=True)))
    assert (wl.state, running(c, "el-a1"), {p.node for p in wl.pods}) == ("running", [0, 1], {"g1"})
    assert (wl.job["spec"]["parallelism"], wl.requeues) == (2, 0)
    assert "Failed" not in [cond["type"] for cond in wl.job["status"].get("conditions", [])]
    [shrunk] = [o.payload for o in translate(WatchEvent(type="MODIFIED", object=wl.job))]
    assert shrunk == ExecResized(old_count=4, new_count=2, cause="Shrunk", pod_set=shrunk.pod_set,  # type: ignore[attr-defined]
                                 message="node g2 drained: XID 79")
    for _ in range(5):  # nothing lands on the cordoned node meanwhile
        await c.tick()
    assert running(c, "el-a1") == [0, 1]
    await c.on_node(node_event("node.g2.uncordon", NodeUncordon(node="g2", reason="validated")))
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2, 3])
    assert sorted((p.index, p.node) for p in wl.pods) == [(0, "g1"), (1, "g1"), (2, "g2"), (3, "g2")]


async def test_a_drain_of_the_rendezvous_pods_node_fails_the_elastic_run_as_before(two_nodes: LocalCluster) -> None:
    c = two_nodes
    await c.apply(BackendApply(run_id="el", workspace="default", attempt=1,
                               manifests=[job("el-a1", pods=4, priority="low", seconds=600, elastic="1:4:1:0")]))
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2, 3])
    wl = c.wls["el-a1"]
    await c.on_node(node_event("node.g1.cordon", NodeCordon(node="g1", reason="XID 79", drain=True)))
    await until(c, lambda: wl.state != "running")
    assert wl.job["status"]["conditions"][-1]["type"] == "Failed"  # recovery retries it elsewhere
    assert wl.job["spec"]["parallelism"] == 4 and "taugrid.io/resized" not in wl.job["metadata"]["annotations"]
