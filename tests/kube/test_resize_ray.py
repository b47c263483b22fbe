"""Resizing an elastic RayJob on Kubernetes (``kube/resize.py``, ``kube/elasticdecide.py``) over real HTTP (kmock).

KubeRay (v1.7.0-rc.0) never carries a change of a RayJob's ``rayClusterSpec`` to the RayCluster it made, and Kueue
(v0.19.2 and v0.20.0-devel, ``raycluster.UpdatePodSets``) counts an elastic RayJob's workers from that RayCluster;
so taugrid resizes the RayCluster's worker group (``replicas``, and for a shrink ``scaleStrategy.workersToDelete``
naming the youngest workers, since with in-tree autoscaling KubeRay deletes only those) and records the resize on
the RayJob, where it reads back as ``exec.resized``. The RayJob is the one taugrid renders for an elastic Ray run;
the RayCluster, pods and Workload are KubeRay's and Kueue's, each validated against the CRDs or Kubernetes' schema.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.core import contracts as c
from taugrid.core.errors import PermanentError
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.elasticdecide import RAY_FOLLOW_S, Decision, decide
from taugrid.kube.resize import ANNOTATION_RESIZE_REQUESTED, SLICE_REPLACEMENT_FOR, JobScaler
from taugrid.kube.translate import ANNOTATION_RESIZED
from taugrid.render import render, validate
from taugrid_services.kube_bridge.bridge import Bridge
from tests.kube.test_elasticdecide import LONG_AGO, NOW, condition
from tests.kube.test_resize import resized_events, until
from tests.render.render_runs import build_run

RAYJOBS, RAYCLUSTERS, PODS = ("ray.io", "v1", "rayjobs"), ("ray.io", "v1", "rayclusters"), ("", "v1", "pods")
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
CQS, LQS = ("kueue.x-k8s.io", "v1beta2", "clusterqueues"), ("kueue.x-k8s.io", "v1beta2", "localqueues")
NS, NAME, CLUSTER = "team-a", "ray-el-a1", "ray-el-a1-raycluster-x7k2p"
WORKER_POD = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}  # what render asks for each worker
HEAD_POD = {"cpu": "1", "memory": "4Gi"}


def rayjob(*, workers: int = 3, desired: int | None = None, elastic: tuple[int, int, int, float] = (1, 4, 1, 0),
           annotations: dict[str, str] | None = None, deployment: str = "Running") -> dict[str, Any]:
    """The RayJob taugrid renders for an elastic Ray run, running (status as KubeRay writes it: its Ray cluster's
    name, and that cluster's status copied in)."""
    low, high, step, cooldown = elastic
    run = build_run(run_id="ray-el", engine="ray", launcher="ray-train", command=[], workers=workers,
                    gpus_per_worker=1, elastic_min=low, elastic_max=high, elastic_step=step,
                    elastic_cooldown_s=cooldown)
    (obj,) = render(run, attempt=1)
    obj["metadata"]["annotations"].update(annotations or {})
    obj["spec"]["suspend"] = False
    obj["status"] = {"jobDeploymentStatus": deployment, "jobStatus": "RUNNING", "rayClusterName": CLUSTER,
                     "startTime": LONG_AGO,
                     "rayClusterStatus": {"desiredWorkerReplicas": workers if desired is None else desired,
                                          "state": "ready"}}
    return obj


def raycluster(job: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The RayCluster KubeRay made from ``job``'s ``rayClusterSpec`` (it keeps its own replicas from then on)."""
    spec = copy.deepcopy(job["spec"]["rayClusterSpec"])
    spec["workerGroupSpecs"][0]["replicas"] = replicas
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": CLUSTER, "namespace": NS, "labels": dict(job["metadata"]["labels"]),
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": NAME,
                                              "uid": "rj-1", "controller": True}]},
            "spec": spec}


def worker_pod(suffix: str, created: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{CLUSTER}-workers-worker-{suffix}", "namespace": NS, "creationTimestamp": created,
                         "labels": {"ray.io/cluster": CLUSTER, "ray.io/group": "workers",
                                    "ray.io/node-type": "worker"}},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]}}


PODS_3 = [worker_pod("a1b2c", "2026-01-01T00:00:00Z"), worker_pod("d3e4f", "2026-01-01T00:05:00Z"),
          worker_pod("g5h6i", "2026-01-01T00:02:00Z")]


def usage(pod: dict[str, str], count: int) -> dict[str, str]:
    per = {"cpu": 1, "memory": int(pod["memory"].removesuffix("Gi")), "nvidia.com/gpu": int(pod.get(
        "nvidia.com/gpu", "0"))}
    return {r: f"{v * count}Gi" if r == "memory" else str(v * count) for r, v in per.items() if v}


def ray_workload(workers: int, *, priority: int = 10, slice_of: str = "") -> dict[str, Any]:
    """Kueue's admitted Workload of the RayJob: a head pod set and the worker group's (named as the group)."""
    def template(requests: dict[str, str]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "ray", "image": "rayproject/ray:2.60.0",
                                         "resources": {"requests": requests}}]}}
    meta: dict[str, Any] = {"name": f"rayjob-{NAME}-{'b7c1' if slice_of else 'a9f0'}", "namespace": NS,
                            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": NAME,
                                                 "uid": "rj-1", "controller": True}]}
    if slice_of:
        meta["annotations"] = {SLICE_REPLACEMENT_FOR: slice_of}
    flavors = {"cpu": "default", "memory": "default", "nvidia.com/gpu": "default"}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
            "spec": {"queueName": "team-a-lq", "priority": priority, "podSets": [
                {"name": "head", "count": 1, "template": template(HEAD_POD)},
                {"name": "workers", "count": workers, "template": template(WORKER_POD)}]},
            "status": {"admission": {"clusterQueue": "team-a-cq", "podSetAssignments": [
                {"name": "head", "count": 1, "flavors": {"cpu": "default", "memory": "default"},
                 "resourceUsage": usage(HEAD_POD, 1)},
                {"name": "workers", "count": workers, "flavors": flavors,
                 "resourceUsage": usage(WORKER_POD, workers)}]},
                "conditions": [condition("QuotaReserved", "True", "QuotaReserved"),
                               condition("Admitted", "True", "Admitted")]}}


def gpu_waiting(gpus: int) -> dict[str, Any]:
    """A pending higher-priority workload (run hi-1): ``gpus`` pods of one GPU and one CPU each."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "hi-1-a1-w",
                                                                                   "namespace": NS},
            "spec": {"queueName": "team-a-lq", "priority": 100, "podSets": [
                {"name": "main", "count": gpus, "template": {
                    "metadata": {"labels": {"taugrid.io/run-id": "hi-1"}},
                    "spec": {"containers": [{"name": "main", "image": "train:1", "resources": {"requests": {
                        "cpu": "1", "nvidia.com/gpu": "1"}}}]}}}]},
            "status": {"conditions": [condition("QuotaReserved", "False", "Pending")]}}


def cluster_queue(*, gpus: int = 4, cpus: int = 16, reserved_gpus: int = 3,
                  workers: int | None = None) -> dict[str, Any]:
    """A queue covering CPU, memory and GPUs (Kueue admits nothing that asks for an uncovered resource)."""
    held = reserved_gpus if workers is None else workers
    reserved = {"cpu": 1 + held, "memory": 4 + held, "nvidia.com/gpu": held}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "team-a-cq"},
            "spec": {"resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                {"name": "default", "resources": [{"name": "cpu", "nominalQuota": cpus},
                                                  {"name": "memory", "nominalQuota": "64Gi"},
                                                  {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]},
            "status": {"pendingWorkloads": 0, "flavorsReservation": [{"name": "default", "resources": [
                {"name": r, "total": f"{v}Gi" if r == "memory" else str(v)} for r, v in reserved.items()]}]}}


LOCAL_QUEUE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "team-a-lq", "namespace": NS}, "spec": {"clusterQueue": "team-a-cq"}}


def test_the_objects_here_are_what_render_kuberay_and_kueue_write() -> None:
    job = rayjob()
    for obj in (job, raycluster(job, 3), *PODS_3, ray_workload(3), ray_workload(4, slice_of=f"{NS}/x"),
                gpu_waiting(2), cluster_queue(), LOCAL_QUEUE):
        validate(obj)
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True  # Kueue's condition for slices
    assert (group["groupName"], group["minReplicas"], group["maxReplicas"]) == ("workers", 1, 4)


async def test_a_shrink_patches_the_ray_cluster_naming_the_youngest_workers_and_records_it(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    job = fake.put(RAYJOBS, rayjob())
    cluster = fake.put(RAYCLUSTERS, raycluster(job, 3))
    for pod in PODS_3:
        fake.put(PODS, pod)
    group = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][0])
    scaler = JobScaler(KubeApi(api_client, retry_cap_s=0.05))

    stored = await scaler.resize_rayjob(NS, NAME, 2, cause="ShrunkForPreemptor", preemptor="hi-1")
    cluster_patch, rayjob_patch = [a["body"] for a in fake.applies[-2:]]
    assert cluster_patch == {"metadata": {"resourceVersion": cluster["metadata"]["resourceVersion"]},
                             "spec": {"workerGroupSpecs": [{**group, "replicas": 2, "scaleStrategy": {
                                 "workersToDelete": [f"{CLUSTER}-workers-worker-d3e4f"]}}]}}
    record = json.loads(rayjob_patch["metadata"]["annotations"][ANNOTATION_RESIZED])
    assert rayjob_patch == {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"], "annotations": {
        ANNOTATION_RESIZED: rayjob_patch["metadata"]["annotations"][ANNOTATION_RESIZED],
        ANNOTATION_RESIZE_REQUESTED: None}}}
    assert {k: v for k, v in record.items() if k != "at"} == {
        "old_count": 3, "new_count": 2, "cause": "ShrunkForPreemptor", "preemptor": "hi-1", "pod_set": "workers"}
    assert all(a["content_type"].startswith("application/merge-patch+json") for a in fake.applies[-2:])
    validate(fake.objects[(RAYCLUSTERS, NS, CLUSTER)])  # KubeRay's CRD takes the patched cluster
    validate(stored)
    assert stored["spec"]["rayClusterSpec"] == job["spec"]["rayClusterSpec"]  # KubeRay would disregard a change
    [event] = resized_events(stored)
    assert event.payload == c.ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1",
                                          pod_set="workers")
    assert (event.run_id, event.attempt) == ("ray-el", 1)

    # KubeRay deletes the named worker and clears the list; a growth asks for 4 and waits for Kueue's slice
    fake.objects.pop((PODS, NS, f"{CLUSTER}-workers-worker-d3e4f"))
    fake.modify(RAYCLUSTERS, NS, CLUSTER, lambda o: o["spec"]["workerGroupSpecs"][0].update(
        scaleStrategy={"workersToDelete": []}))
    asked = await scaler.resize_rayjob(NS, NAME, 4)
    assert fake.applies[-2]["body"]["spec"]["workerGroupSpecs"] == [
        {**group, "replicas": 4, "scaleStrategy": {"workersToDelete": []}}]
    assert json.loads(asked["metadata"]["annotations"][ANNOTATION_RESIZE_REQUESTED])["new_count"] == 4
    assert [e.dedup for e in resized_events(asked)] == [event.dedup]  # only the shrink, already sent

    slice_of = f"{NS}/rayjob-{NAME}-a9f0"
    pending = {**ray_workload(4, slice_of=slice_of), "status": {"conditions": [
        condition("QuotaReserved", "False", "Pending")]}}
    assert not await scaler.confirm_slice(pending)
    assert not await scaler.confirm_slice(ray_workload(3, slice_of=slice_of))  # 3 workers (4 pods): not asked
    assert await scaler.confirm_slice(ray_workload(4, slice_of=slice_of))  # 4 workers and the head
    [after] = resized_events(fake.objects[(RAYJOBS, NS, NAME)])
    assert after.payload == c.ExecResized(old_count=2, new_count=4, cause="Grown", pod_set="workers")

    before = len(fake.applies)
    fake.modify(RAYCLUSTERS, NS, CLUSTER, lambda o: None)
    await scaler.resize_rayjob(NS, NAME, 4)  # its cluster already has 4: nothing patched
    assert len(fake.applies) == before


@pytest.mark.parametrize(("job", "count", "message"), [
    (rayjob(elastic=(1, 4, 1, 0), annotations={"kueue.x-k8s.io/elastic-job": "false"}), 2,
     f"RayJob {NS}/{NAME} is not elastic (no kueue.x-k8s.io/elastic-job: \"true\" with a taugrid.io/elastic "
     "range): submit it with policy.mode: elastic to let it resize"),
    (rayjob(deployment="Complete"), 2, f"RayJob {NS}/{NAME} has finished: there is nothing to resize"),
    (rayjob(), 5, f"RayJob {NS}/{NAME}: 5 workers is outside its range 1..4 (policy.elastic.min/max)"),
    ({**rayjob(), "status": {"jobDeploymentStatus": "Initializing"}}, 2,
     f"RayJob {NS}/{NAME} has no Ray cluster yet (status.rayClusterName): resize it once KubeRay has created it"),
])
async def test_what_cannot_be_resized_is_refused_with_the_fix_and_left_alone(
        fake_kube: Any, job: dict[str, Any], count: int, message: str) -> None:
    fake, api_client = fake_kube
    stored = copy.deepcopy(fake.put(RAYJOBS, job))
    fake.put(RAYCLUSTERS, raycluster(job, 3))
    before = len(fake.applies)
    with pytest.raises(PermanentError) as err:
        await JobScaler(KubeApi(api_client, retry_cap_s=0.05)).resize_rayjob(NS, NAME, count)
    assert str(err.value) == message
    assert fake.objects[(RAYJOBS, NS, NAME)] == stored and len(fake.applies) == before


def decide_ray(cq: dict[str, Any], workloads: list[dict[str, Any]], job: dict[str, Any],
               now: float = NOW) -> list[Decision]:
    return decide(cluster_queues=[cq], local_queues=[LOCAL_QUEUE], workloads=workloads, jobs={(NS, NAME): job},
                  now=now)


def test_the_decider_weighs_a_rayjob_by_its_worker_pod_set() -> None:
    # 4 GPUs, 3 held by the workers: one more worker (1 GPU, 1 CPU, 1Gi) fits; the head is never resized
    assert decide_ray(cluster_queue(), [ray_workload(3)], rayjob()) == [Decision(NS, NAME, 4, "Grown", kind="RayJob")]
    assert decide_ray(cluster_queue(gpus=3), [ray_workload(3)], rayjob()) == []  # no room
    # one CPU left (the head's and 3 workers' 4 of 5): enough for a worker's one, the head's is not counted per pod
    assert decide_ray(cluster_queue(cpus=5), [ray_workload(3)], rayjob()) == [
        Decision(NS, NAME, 4, "Grown", kind="RayJob")]
    assert decide_ray(cluster_queue(cpus=4), [ray_workload(3)], rayjob()) == []
    assert decide_ray(cluster_queue(workers=4), [ray_workload(4)], rayjob(workers=4)) == []  # at its maximum
    # a 2-GPU workload of higher priority takes one worker (one GPU was free), not the whole Ray cluster
    assert decide_ray(cluster_queue(), [ray_workload(3), gpu_waiting(2)], rayjob()) == [
        Decision(NS, NAME, 2, "ShrunkForPreemptor", "hi-1", "RayJob")]


def test_a_rayjob_resize_in_flight_is_never_decided_twice() -> None:
    # KubeRay's cluster already wants 2 (the RayJob's copy of its status), Kueue still admits 3
    assert decide_ray(cluster_queue(), [ray_workload(3), gpu_waiting(2)], rayjob(desired=2)) == []
    asked = json.dumps({"old_count": 3, "new_count": 4, "cause": "Grown", "pod_set": "workers", "at": LONG_AGO})
    assert decide_ray(cluster_queue(), [ray_workload(3)], rayjob(annotations={ANNOTATION_RESIZE_REQUESTED: asked})) \
        == []
    # taugrid's shrink recorded 10 s ago, KubeRay's status not yet updated: held; after RAY_FOLLOW_S it is not
    shrunk = json.dumps({"old_count": 3, "new_count": 2, "cause": "ShrunkForPreemptor", "pod_set": "workers",
                         "at": "2027-01-15T07:59:50Z"})  # NOW - 10 s
    held = rayjob(annotations={ANNOTATION_RESIZED: shrunk})
    assert decide_ray(cluster_queue(), [ray_workload(3), gpu_waiting(2)], held) == []
    assert decide_ray(cluster_queue(), [ray_workload(3), gpu_waiting(2)], held, now=NOW + RAY_FOLLOW_S) == [
        Decision(NS, NAME, 2, "ShrunkForPreemptor", "hi-1", "RayJob")]


async def test_the_bridge_grows_an_elastic_rayjob_and_shrinks_it_for_a_higher_priority_workload(
        bus: Bus, fake_kube: Any) -> None:
    """Quota 4 GPUs, the Ray run at 2 workers of 1..4: the leading bridge grows its Ray cluster to 3 (Kueue's slice,
    emulated, admits it and the growth is recorded), then a pending 2-GPU workload of higher priority takes one
    worker (3 -> 2), named in the RayCluster's workersToDelete."""
    fake, api_client = fake_kube
    job = rayjob(workers=2)
    job["metadata"]["annotations"]["taugrid.io/elastic"] = "1:3:1:0"
    fake.put(RAYJOBS, job)
    fake.put(RAYCLUSTERS, raycluster(job, 2))
    for pod in PODS_3[:2]:
        fake.put(PODS, pod)
    fake.put(CQS, cluster_queue(workers=2))
    fake.put(LQS, LOCAL_QUEUE)
    first = fake.put(WORKLOADS, ray_workload(2))
    bridge = Bridge(bus, KubeApi(api_client, retries=0), cluster=f"c{uuid.uuid4().hex[:8]}", holder="a",
                    resources=[(resource_for(k), None) for k in ("Workload", "RayJob", "ClusterQueue", "LocalQueue")],
                    lease_ttl_s=1.0, checkpoint_every_s=0.1, backoff_max_s=0.1, queue_every_s=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    replicas = lambda: fake.objects[(RAYCLUSTERS, NS, CLUSTER)]["spec"]["workerGroupSpecs"][0]["replicas"]  # noqa: E731
    stored = lambda: fake.objects[(RAYJOBS, NS, NAME)]  # noqa: E731
    try:
        # the RayCluster is patched first, the RayJob's record right after: wait for both
        await until(lambda: replicas() == 3
                    and ANNOTATION_RESIZE_REQUESTED in (stored()["metadata"].get("annotations") or {}))
        asked = json.loads(stored()["metadata"]["annotations"][ANNOTATION_RESIZE_REQUESTED])
        assert (asked["old_count"], asked["new_count"], asked["cause"]) == (2, 3, "Grown")
        # KubeRay starts the third worker; Kueue admits the slice, finishes the old one and charges the worker
        fake.put(PODS, worker_pod("j7k8l", "2026-01-01T00:10:00Z"))
        fake.modify(RAYJOBS, NS, NAME, lambda o: o["status"]["rayClusterStatus"].update(desiredWorkerReplicas=3))
        fake.put(WORKLOADS, ray_workload(3, slice_of=f"{NS}/{first['metadata']['name']}"))
        fake.modify(WORKLOADS, NS, first["metadata"]["name"], lambda o: o["status"]["conditions"].append(
            condition("Finished", "True", "WorkloadSliceReplaced")))
        fake.modify(CQS, None, "team-a-cq", lambda o: o.update(status=cluster_queue(workers=3)["status"]))
        await until(lambda: ANNOTATION_RESIZED in stored()["metadata"]["annotations"])
        [grown] = resized_events(stored())
        assert grown.payload == c.ExecResized(old_count=2, new_count=3, cause="Grown", pod_set="workers")

        fake.put(WORKLOADS, gpu_waiting(2))  # priority 100 over the run's 10; one GPU is free
        await until(lambda: replicas() == 2)
        await until(lambda: [e.payload.new_count for e in resized_events(stored())] == [2])  # recorded right after
        for _ in range(5):  # and no more: neither KubeRay nor Kueue has followed yet, nothing is decided twice
            await asyncio.sleep(0.1)
        assert replicas() == 2
    finally:
        stop.set()
        await task
    assert fake.objects[(RAYCLUSTERS, NS, CLUSTER)]["spec"]["workerGroupSpecs"][0]["scaleStrategy"] == {
        "workersToDelete": [f"{CLUSTER}-workers-worker-j7k8l"]}  # the youngest of the three
    [shrunk] = resized_events(stored())
    assert shrunk.payload == c.ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1",
                                           pod_set="workers")
