"""An elastic RayJob on the local pool (real bus, simulated pods): a Ray cluster of a head pod and worker pods,
admitted as Kueue admits a RayJob (pod sets ``head`` and ``workers``), whose workers the engine grows into free quota,
shrinks for a higher-priority Job (the highest-index worker stopped, the head kept) and grows back, each change an
``exec.resized`` read off the RayJob's watch changes; the head's end ends the workers and decides the outcome. The
pods' commands (a Ray head that runs the entrypoint, workers that join it) are in ``test_raycluster.py``; a real Ray
cluster is ``tests/e2e/test_elastic_ray.py`` (slow)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus.replay import replay
from taugrid.core.contracts import BackendApply, WatchEvent
from taugrid.health.wire import NodeCordon
from taugrid.kube.translate import translate
from taugrid.local import raycluster
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster, settle
from tests.local.test_elastic_pool import PLATFORM, job
from tests.local.test_pool import node_event


@pytest.fixture
async def pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalCluster]:
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")
    async with pool_cluster(tmp_path, PLATFORM, name="elasticray") as (_bus, cluster):
        yield cluster


def rayjob(name: str, *, workers: int, seconds: float, elastic: str = "1:3:1:0") -> dict[str, Any]:
    """A RayJob shaped as ``render.rayjob`` writes an elastic one: a CPU-only head, GPU workers."""
    env = [{"name": "SIMULATED_DURATION", "value": str(seconds)}]

    def group(container: str, requests: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"labels": {}, "annotations": {}},
                "spec": {"containers": [{"name": container, "image": "rayproject/ray:2.46.0-py311", "env": env,
                                         "resources": {"requests": requests}}]}}

    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": "default",
                         "annotations": {"kueue.x-k8s.io/elastic-job": "true", "taugrid.io/elastic": elastic},
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "kueue.x-k8s.io/priority-class": "low",
                                    "taugrid.io/run-id": name[:-3], "taugrid.io/workspace": "default",
                                    "taugrid.io/attempt": "1"}},
            "spec": {"suspend": True, "shutdownAfterJobFinishes": True, "entrypoint": "python train.py",
                     "rayClusterSpec": {
                         "enableInTreeAutoscaling": True,
                         "headGroupSpec": {"rayStartParams": {"num-cpus": "0", "num-gpus": "0"},
                                           "template": group("ray-head", {"cpu": "1", "memory": "1Gi"})},
                         "workerGroupSpecs": [{
                             "groupName": "workers", "replicas": workers, "minReplicas": 1, "maxReplicas": 3,
                             "rayStartParams": {},
                             "template": group("ray-worker", {"cpu": "1", "memory": "512Mi",
                                                              "nvidia.com/gpu": "1"})}]}}}


def pods(c: LocalCluster, name: str) -> list[tuple[str, int, str, list[int]]]:
    wl = c.wls.get(name)
    return sorted((p.pod_set, p.index, p.phase, p.gpus) for p in wl.pods) if wl else []


def running(c: LocalCluster, name: str) -> list[tuple[str, int]]:
    return [(s, i) for s, i, phase, _ in pods(c, name) if phase == "Running"]


async def until(c: LocalCluster, check: Callable[[], bool], timeout: float = 30) -> None:
    await settle(c, check, timeout, show=lambda c: {n: (w.state, pods(c, n)) for n, w in c.wls.items()})


HEAD, W = "head", "workers"


async def test_an_elastic_rayjobs_workers_grow_shrink_for_a_preemptor_and_grow_back(pool: LocalCluster) -> None:
    c = pool
    await c.apply(BackendApply(run_id="ray", workspace="default", attempt=1,
                               manifests=[rayjob("ray-a1", workers=2, seconds=600)]))
    await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1), (W, 2)])  # grown to its maximum
    wl = c.wls["ray-a1"]
    assert [(s, i, g) for s, i, _, g in pods(c, "ray-a1")] == [(HEAD, 0, []), (W, 0, [0]), (W, 1, [1]), (W, 2, [2])]
    assert {p.pod_set: p.obj["metadata"]["labels"]["ray.io/node-type"] for p in wl.pods} == {HEAD: "head",
                                                                                           W: "worker"}
    # workers are named as an Indexed Job's pods (a grown one with a stamp), so a shrink's record drops the right one
    assert sorted(p.name.split("-")[2] for p in wl.pods) == ["0", "1", "2", "head"]
    await c.apply(BackendApply(run_id="hi", workspace="default", attempt=1,
                               manifests=[job("hi-a1", pods=2, priority="high", seconds=1.5)]))
    await until(c, lambda: len([p for p in c.wls["hi-a1"].pods if p.phase == "Running"]) == 2)
    assert running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1)]  # the highest-index worker gave its GPU up
    assert wl.state == "running" and wl.requeues == 0  # shrunk, never evicted
    assert [(a["name"], a["count"]) for a in wl.workload["status"]["admission"]["podSetAssignments"]] == [
        (HEAD, 1), (W, 2)]
    assert wl.job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    await until(c, lambda: "hi-a1" not in c.wls or c.wls["hi-a1"].state != "running")
    await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1), (W, 2)])  # grown back
    assert sorted(g for p in wl.pods for g in p.gpus) == [0, 1, 2]

    changes = await replay(c.bus, stream="K8S", subject="k8s.local.rayjob.default.ray-a1.>")
    resized = [out for m in changes for out in translate(msgspec.json.decode(m.data, type=WatchEvent))
               if out.event_type == "exec.resized"]
    once = list({out.dedup: out.payload for out in resized}.values())
    assert [(r.old_count, r.new_count, r.cause, r.preemptor, r.pod_set) for r in once] == [  # type: ignore[attr-defined]
        (2, 3, "Grown", "", W), (3, 2, "ShrunkForPreemptor", "hi", W), (2, 3, "Grown", "", W)]


async def test_a_ray_clusters_head_ends_its_workers_and_decides_the_outcome(pool: LocalCluster) -> None:
    """The simulated head ends first (its entrypoint is done); the workers, which would run on, end with it, and the
    RayJob succeeds as KubeRay reports it, its quota freed."""
    c = pool
    job_ = rayjob("end-a1", workers=2, seconds=1.0, elastic="2:2:1:0")  # a range that cannot grow
    for g in job_["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        g["template"]["spec"]["containers"][0]["env"] = [{"name": "SIMULATED_DURATION", "value": "600"}]
    await c.apply(BackendApply(run_id="end", workspace="default", attempt=1, manifests=[job_]))
    await until(c, lambda: running(c, "end-a1") == [(HEAD, 0), (W, 0), (W, 1)])
    await until(c, lambda: "end-a1" not in c.wls, timeout=20)
    changes = await replay(c.bus, stream="K8S", subject="k8s.local.rayjob.default.end-a1.>")
    outs = [out.event_type for m in changes for out in translate(msgspec.json.decode(m.data, type=WatchEvent))]
    assert outs[-1] == "exec.succeeded"
    assert c.admitter.engine is not None and "end-a1" not in c.admitter.engine.states


async def test_a_fixed_size_rayjob_is_still_one_pod(pool: LocalCluster) -> None:
    c = pool
    fixed = rayjob("one-a1", workers=2, seconds=600)
    fixed["metadata"]["annotations"] = {}
    await c.apply(BackendApply(run_id="one", workspace="default", attempt=1, manifests=[fixed]))
    await until(c, lambda: running(c, "one-a1") == [("", 0)])
    wl = c.wls["one-a1"]
    assert (wl.pods_wanted, wl.per_pod["nvidia.com/gpu"], wl.per_pod["cpu"]) == (1, 2.0, 3.0)  # head + 2 workers
    assert [p.name for p in wl.pods] == ["one-a1-pod"]


async def test_a_restarted_cluster_adopts_the_ray_cluster_as_two_pod_sets(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a restart reads back (the workload record, its pods' pod sets and GPUs) gives the engine the same two
    pod sets on the same devices, and the cluster the same pods, nothing started twice."""
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")
    async with pool_cluster(tmp_path, PLATFORM, name="rayrestart") as (bus, c):
        await c.apply(BackendApply(run_id="ray", workspace="default", attempt=1,
                                   manifests=[rayjob("ray-a1", workers=2, seconds=600, elastic="1:2:1:0")]))
        await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1)])
        again = LocalCluster(bus, data_dir=tmp_path / "again", node="machine",
                             capacity={"cpu": 4.0, "memory": float(8 << 30)}, gpu_count=0)
        await again.load()
        try:
            assert pods(again, "ray-a1") == pods(c, "ray-a1") == [(HEAD, 0, "Running", []), (W, 0, "Running", [0]),
                                                                  (W, 1, "Running", [1])]
            assert again.admitter.engine is not None
            state = again.admitter.engine.states["ray-a1"]
            assert [(ps.name, ps.count) for ps in state.workload.pod_sets] == [(HEAD, 1), (W, 2)]
            assert sorted((pl.pod_set, pl.index, pl.gpus) for pl in state.placements) == [
                (HEAD, 0, ()), (W, 0, (0,)), (W, 1, (1,))]
        finally:
            await again.kubelet.close()


async def test_a_drain_under_a_ray_cluster_gives_up_its_workers_there_but_never_its_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 4 for Ray: the drained node's workers (the highest indices) go, the run goes on; a drain of
    the head's node fails it (the entrypoint runs there), as a drain of torchrun's pod 0 does."""
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")
    platform = PLATFORM.replace("    - {name: g1, gpus: 4}", "    - {name: g1, gpus: 2}\n    - {name: g2, gpus: 2}")
    async with pool_cluster(tmp_path, platform, name="raydrain") as (_bus, c):
        await c.apply(BackendApply(run_id="ray", workspace="default", attempt=1,
                                   manifests=[rayjob("ray-a1", workers=3, seconds=600, elastic="1:3:1:0")]))
        await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1), (W, 2)])
        wl = c.wls["ray-a1"]
        assert sorted((p.pod_set, p.index, p.node) for p in wl.pods) == [
            (HEAD, 0, "g1"), (W, 0, "g1"), (W, 1, "g1"), (W, 2, "g2")]
        await c.on_node(node_event("node.g2.cordon", NodeCordon(node="g2", reason="XID 79", drain=True)))
        assert (wl.state, running(c, "ray-a1"), wl.requeues) == ("running", [(HEAD, 0), (W, 0), (W, 1)], 0)
        [shrunk] = [o.payload for o in translate(WatchEvent(type="MODIFIED", object=wl.job))]
        assert (shrunk.old_count, shrunk.new_count, shrunk.cause, shrunk.message) == (  # type: ignore[attr-defined]
            3, 2, "Shrunk", "node g2 drained: XID 79")
        await c.on_node(node_event("node.g1.cordon", NodeCordon(node="g1", reason="XID 79", drain=True)))
        await until(c, lambda: "ray-a1" not in c.wls)
        changes = await replay(c.bus, stream="K8S", subject="k8s.local.rayjob.default.ray-a1.>")
        outs = [out.event_type for m in changes for out in translate(msgspec.json.decode(m.data, type=WatchEvent))]
        assert outs[-1] == "exec.failed"


async def test_a_ray_cluster_evicted_whole_comes_back_on_a_new_port_its_old_files_gone(pool: LocalCluster) -> None:
    """Shrinking to its minimum does not make room (the preemptor needs 3 of the 4 GPUs, the run holds 3 and keeps
    at least 2): it is evicted as Kueue would, and once the preemptor ends it starts again, its head on a new port
    (the dying head may hold the old one a while), its old port's Ray files removed."""
    c = pool
    await c.apply(BackendApply(run_id="ray", workspace="default", attempt=1,
                               manifests=[rayjob("ray-a1", workers=3, seconds=600, elastic="2:3:1:0")]))
    await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1), (W, 2)])
    wl = c.wls["ray-a1"]
    old_port = wl.rdzv_port
    files = [Path(raycluster.temp_dir(old_port)), Path(raycluster.temp_dir(old_port, 1))]
    for d in files:
        d.mkdir()
    try:
        await c.apply(BackendApply(run_id="hi", workspace="default", attempt=1,
                                   manifests=[job("hi-a1", pods=3, priority="high", seconds=1.5)]))
        await until(c, lambda: wl.requeues == 1)
        assert not any(d.exists() for d in files)
        await until(c, lambda: running(c, "ray-a1") == [(HEAD, 0), (W, 0), (W, 1), (W, 2)])
        assert wl.rdzv_port not in (0, old_port)
    finally:
        for d in files:
            shutil.rmtree(d, ignore_errors=True)
