"""`tau queue` on Kubernetes: kube-bridge turns Kueue's ClusterQueue/LocalQueue status and the pending-workloads
visibility API (served by the kmock emulator over real HTTP) into the KV snapshot the CLI reads, the same key
and shape the local cluster writes. The CLI runs as a real process with nothing but the NATS URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

import nats.js.errors
import pytest

from taugrid.bus import Bus, metrics
from taugrid.cli.queue_cmd import queue_view
from taugrid.core.ids import token
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.queues import quantity, snapshot
from taugrid_services.kube_bridge.bridge import BUCKET as BRIDGE_BUCKET
from taugrid_services.kube_bridge.bridge import QUEUES_BUCKET, QUEUES_KEY, Bridge
from taugrid_services.kube_bridge.lease import Checkpoints

CQS, LQS = ("kueue.x-k8s.io", "v1beta2", "clusterqueues"), ("kueue.x-k8s.io", "v1beta2", "localqueues")


def cluster_queue(name: str, *, gpus: str, used_gpus: str, borrowed_gpus: str, pending: int, admitted: int,
                  ) -> dict[str, Any]:
    """A ClusterQueue as `kubectl get clusterqueue -o json` shows it on Kueue v0.15 (v1beta2)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": name, "generation": 1, "creationTimestamp": "2026-11-30T09:00:00Z"},
        "spec": {
            "cohortName": "lab", "namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                {"name": "h200", "resources": [{"name": "cpu", "nominalQuota": "32"},
                                               {"name": "memory", "nominalQuota": "256Gi"},
                                               {"name": "nvidia.com/gpu", "nominalQuota": gpus}]},
                {"name": "spot", "resources": [{"name": "cpu", "nominalQuota": "500m"},
                                               {"name": "memory", "nominalQuota": "512Mi"},
                                               {"name": "nvidia.com/gpu", "nominalQuota": 0}]}]}],
        },
        "status": {
            "conditions": [{"type": "Active", "status": "True", "reason": "Ready", "message": "Can admit new workloads",
                            "lastTransitionTime": "2026-11-30T09:00:01Z", "observedGeneration": 1}],
            "flavorsReservation": [{"name": "h200", "resources": [
                {"name": "cpu", "total": "16", "borrowed": "0"},
                {"name": "memory", "total": "128Gi", "borrowed": "0"},
                {"name": "nvidia.com/gpu", "total": used_gpus, "borrowed": borrowed_gpus}]}],
            "flavorsUsage": [{"name": "h200", "resources": [
                {"name": "cpu", "total": "16", "borrowed": "0"},
                {"name": "memory", "total": "128Gi", "borrowed": "0"},
                {"name": "nvidia.com/gpu", "total": used_gpus, "borrowed": borrowed_gpus}]},
                {"name": "spot", "resources": [{"name": "cpu", "total": "0", "borrowed": "0"},
                                               {"name": "memory", "total": "0", "borrowed": "0"},
                                               {"name": "nvidia.com/gpu", "total": "0", "borrowed": "0"}]}],
            "pendingWorkloads": pending, "reservingWorkloads": admitted, "admittedWorkloads": admitted,
            "fairSharing": {"weightedShare": 0},
        },
    }


LOCAL_QUEUE = {
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
    "metadata": {"name": "default", "namespace": "team-vision"},
    "spec": {"clusterQueue": "vision"},
    "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Ready", "message": "Can submit new "
                               "workloads to localQueue", "lastTransitionTime": "2026-11-30T09:00:01Z"}],
               "pendingWorkloads": 2, "reservingWorkloads": 1, "admittedWorkloads": 1,
               "flavorsUsage": [{"name": "h200", "resources": [{"name": "nvidia.com/gpu", "total": "6"}]}]},
}


def pending_workload(run: str, position: int, priority: int) -> dict[str, Any]:
    """One item of a visibility PendingWorkloadsSummary (kubectl get --raw .../pendingworkloads)."""
    return {
        "metadata": {"name": f"job-{run}-a1-3f2c1", "namespace": "team-vision",
                     "creationTimestamp": "2026-11-30T10:00:00Z",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"{run}-a1",
                                          "uid": str(uuid.uuid4()), "controller": True}]},
        "priority": priority, "localQueueName": "default",
        "positionInClusterQueue": position, "positionInLocalQueue": position,
    }


async def _tau_queue_json(nats_url: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from taugrid.cli.main import main; main()", "queue", "--output", "json",
        env={**os.environ, "TAU_NATS_URL": nats_url}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


async def _snapshot_written(bus: Bus, since: float, timeout: float = 15.0, *,
                            queues: frozenset[str] = frozenset(), local_queues: int = 0) -> dict[str, Any]:
    """The first snapshot written since ``since`` that holds ``queues`` and ``local_queues`` LocalQueues (the
    bridge writes one every ``queue_every_s`` from what its watches delivered so far: its first may precede the
    rest of its initial list, docs §16)."""
    kv = await bus.kv(QUEUES_BUCKET)
    async with asyncio.timeout(timeout):
        while True:
            try:
                entry = await kv.get(QUEUES_KEY)
                snap: dict[str, Any] = json.loads(entry.value or b"{}")
                if snap.get("backend") == "kubernetes" and snap["time"] >= since and \
                        queues <= {q["cluster_queue"] for q in snap["queues"]} and \
                        len(snap["local_queues"]) >= local_queues:
                    return snap
            except nats.js.errors.KeyNotFoundError:
                pass
            await asyncio.sleep(0.1)


def _lab_queues(fake: Any) -> None:
    """Two ClusterQueues of cohort ``lab`` (vision holds 6 of its 8 GPUs, language 6 of 4, 2 borrowed) and the
    LocalQueue ``team-vision/default``."""
    fake.put(CQS, cluster_queue("vision", gpus="8", used_gpus="6", borrowed_gpus="0", pending=2, admitted=1))
    fake.put(CQS, cluster_queue("language", gpus="4", used_gpus="6", borrowed_gpus="2", pending=0, admitted=2))
    fake.put(LQS, LOCAL_QUEUE)


def _queue_bridge(bus: Bus, api_client: Any, cluster: str, holder: str) -> Bridge:
    return Bridge(bus, KubeApi(api_client, retries=0), cluster=cluster, holder=holder,
                  resources=[(resource_for("ClusterQueue"), None), (resource_for("LocalQueue"), None)],
                  lease_ttl_s=1.0, checkpoint_every_s=0.1, backoff_max_s=0.1, queue_every_s=0.2)


@pytest.mark.parametrize("served", [True, False])
async def test_clusterqueue_status_becomes_the_exact_tau_queue_json(
        bus: Bus, bootstrapped: str, fake_kube: Any, served: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, api_client = fake_kube
    monkeypatch.setattr(metrics, "SERVED", True)  # the chart serves /metrics: the bridge's queue gauges are kept
    _lab_queues(fake)
    if served:
        fake.pending_workloads = {"vision": [pending_workload("big-9f1e", 1, 100),
                                             pending_workload("eval-77a0", 0, 500)]}
    cluster = f"c{uuid.uuid4().hex[:8]}"
    bridge = _queue_bridge(bus, api_client, cluster, "q")
    stop = asyncio.Event()
    started = time.time()
    task = asyncio.create_task(bridge.run(stop))
    try:
        written = await _snapshot_written(bus, started, queues=frozenset({"vision", "language"}), local_queues=1)
        out = await _tau_queue_json(bootstrapped)
        from prometheus_client import REGISTRY  # the bridge's queue gauges follow the snapshot it wrote

        gauge = REGISTRY.get_sample_value
        assert (gauge("taugrid_queue_pending", {"cluster_queue": "vision"}),
                gauge("taugrid_queue_admitted", {"cluster_queue": "language"}),
                gauge("taugrid_queue_quota", {"cluster_queue": "language", "resource": "nvidia.com/gpu",
                                              "kind": "borrowed"})) == (2.0, 2.0, 2.0)
    finally:
        stop.set()
        await task
    gib = float(2**30)
    assert started <= written["time"] <= out["time"] <= time.time()  # rewritten every queue_every_s
    assert {**out, "time": 0} == {**written, "time": 0}
    assert out == {
        "time": out["time"], "node": cluster, "backend": "kubernetes", "cluster": cluster, "visibility": served,
        "queues": [
            {"cluster_queue": "language", "cohort": "lab",
             "nominal": {"cpu": 32.5, "memory": 256 * gib + 512 * 2.0**20, "nvidia.com/gpu": 4.0},
             "used": {"cpu": 16.0, "memory": 128 * gib, "nvidia.com/gpu": 6.0},
             "borrowed": {"nvidia.com/gpu": 2.0},
             "reserved": {"cpu": 16.0, "memory": 128 * gib, "nvidia.com/gpu": 6.0},
             "admitted": 2, "reserving": 2, "pending": [], "pending_count": 0, "active": True, "message": "",
             "lent": {}},
            {"cluster_queue": "vision", "cohort": "lab",
             "nominal": {"cpu": 32.5, "memory": 256 * gib + 512 * 2.0**20, "nvidia.com/gpu": 8.0},
             "used": {"cpu": 16.0, "memory": 128 * gib, "nvidia.com/gpu": 6.0},
             "borrowed": {},
             "reserved": {"cpu": 16.0, "memory": 128 * gib, "nvidia.com/gpu": 6.0},
             "admitted": 1, "reserving": 1,
             "pending": [{"run_id": "eval-77a0", "workload": "job-eval-77a0-a1-3f2c1", "position": 0,
                          "local_queue": "default", "priority": 500},
                         {"run_id": "big-9f1e", "workload": "job-big-9f1e-a1-3f2c1", "position": 1,
                          "local_queue": "default", "priority": 100}] if served else [],
             "pending_count": 2, "active": True, "message": "",
             "lent": {"nvidia.com/gpu": 2.0}},  # language borrows 2 GPUs out of vision's 2 unused ones
        ],
        "local_queues": [{"namespace": "team-vision", "name": "default", "cluster_queue": "vision", "pending": 2,
                          "reserving": 1, "admitted": 1, "used": {"nvidia.com/gpu": 6.0}}],
    }
    asked = {r["version"] for r in fake.visibility_requests}
    assert asked == ({"v1beta2", "v1beta1"})  # the newest version first, then the one Kueue serves
    if not served:  # not served: asked once, then not again within VISIBILITY_RETRY_S
        assert len(fake.visibility_requests) == 2


def test_quantities_read_as_kubernetes_writes_them() -> None:
    assert [quantity(v) for v in ("500m", "16Gi", "1e3", 4, "2k", "1.5", "x", "3Qi")] == [
        0.5, 16 * 2.0**30, 1000.0, 4.0, 2000.0, 1.5, 0.0, 0.0]


def test_a_stopped_clusterqueue_says_why_and_v1beta1_cohort_is_read() -> None:
    cq = cluster_queue("vision", gpus="8", used_gpus="0", borrowed_gpus="0", pending=0, admitted=0)
    cq["spec"]["cohort"] = cq["spec"].pop("cohortName")
    cq["status"]["conditions"] = [{"type": "Active", "status": "False", "reason": "Stopped",
                                   "message": "Can't admit new workloads: is stopped"}]
    q = snapshot([cq], [], pending=None, cluster="prod", now=5.0)["queues"][0]
    assert (q["cohort"], q["active"], q["message"]) == ("lab", False, "Can't admit new workloads: is stopped")


def test_human_tau_queue_of_a_kubernetes_snapshot_without_visibility() -> None:
    cqs = [cluster_queue("vision", gpus="8", used_gpus="6", borrowed_gpus="0", pending=2, admitted=1),
           cluster_queue("language", gpus="4", used_gpus="6", borrowed_gpus="2", pending=0, admitted=2)]
    snap = snapshot(cqs, [LOCAL_QUEUE], pending=None, cluster="prod", now=100.0)
    assert queue_view(snap, show_pending=5, now=102.5).splitlines() == [
        "CLUSTERQUEUE  COHORT  NOMINAL                        USED                         BORROWED  LENT   "
        "ADMITTED  PENDING",
        "language      lab     cpu=32.5 memory=256.5Gi gpu=4  cpu=16 memory=128.0Gi gpu=6  gpu=2     -      "
        "2         0",
        "vision        lab     cpu=32.5 memory=256.5Gi gpu=8  cpu=16 memory=128.0Gi gpu=6  -         gpu=2  "
        "1         2",
        "  localqueue team-vision/default → vision: 2 pending, 1 admitted",
        "(pending runs are listed only where Kueue's visibility API is served; counts shown)",
        "(snapshot 2.5s old from cluster prod)",
    ]


async def test_a_bridge_resuming_its_watches_from_checkpoints_still_snapshots_every_queue(
        bus: Bus, fake_kube: Any) -> None:
    """Restarted (or taking the lease over), the bridge resumes each watch from its checkpoint, which delivers
    only what changed since: queues that did not change are listed for the snapshot all the same."""
    fake, api_client = fake_kube
    _lab_queues(fake)
    cluster = f"c{uuid.uuid4().hex[:8]}"
    checkpoints = Checkpoints(bus, BRIDGE_BUCKET, token(cluster))
    for plural in ("clusterqueues", "localqueues"):  # both watches were current when the last holder stopped
        await checkpoints.put(plural, str(fake.rv))
    bridge = _queue_bridge(bus, api_client, cluster, "r")
    stop = asyncio.Event()
    started = time.time()
    task = asyncio.create_task(bridge.run(stop))
    try:
        written = await _snapshot_written(bus, started)  # the first snapshot written: whole
    finally:
        stop.set()
        await task
    assert all(w.relists == 0 for w in bridge.watchers.values())  # resumed, not relisted
    assert [q["cluster_queue"] for q in written["queues"]] == ["language", "vision"]
    assert [(lq["namespace"], lq["name"]) for lq in written["local_queues"]] == [("team-vision", "default")]


async def test_a_new_lead_drops_a_queue_deleted_while_another_held_the_lease(bus: Bus, fake_kube: Any) -> None:
    """The lease comes back to a bridge that kept an earlier lead's view: the queues are listed again and taken
    as the view, so a ClusterQueue deleted meanwhile (its deletion before the resumed watch's checkpoint) is gone."""
    fake, api_client = fake_kube
    _lab_queues(fake)
    cluster = f"c{uuid.uuid4().hex[:8]}"
    bridge = _queue_bridge(bus, api_client, cluster, "s")
    for lead, want in enumerate((["language", "vision"], ["vision"])):
        if lead:
            fake.remove(CQS, None, "language")
            checkpoints = Checkpoints(bus, BRIDGE_BUCKET, token(cluster))
            for plural in ("clusterqueues", "localqueues"):  # the deletion is older than the checkpoint
                await checkpoints.put(plural, str(fake.rv))
        stop = asyncio.Event()
        started = time.time()
        task = asyncio.create_task(bridge.run(stop))
        try:
            written = await _snapshot_written(bus, started)
        finally:
            stop.set()
            await task
        assert [q["cluster_queue"] for q in written["queues"]] == want
