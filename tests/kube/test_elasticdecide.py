"""The decisions Kueue leaves to an elastic Job's owner (``kube/elasticdecide.py``), on Kueue's and the Job
controller's objects as the API returns them: grow into free nominal quota when nothing waits, shrink lower-priority
elastic Jobs for a pending workload only when that makes room, never twice for a resize in flight."""

from __future__ import annotations

import json
from typing import Any

from taugrid.kube.elasticdecide import Decision, decide
from taugrid.kube.resize import ANNOTATION_RESIZE_REQUESTED, SLICE_REPLACEMENT_FOR
from taugrid.kube.translate import ANNOTATION_RESIZED
from taugrid.render import validate

NS = "team-a"
NOW = 1_800_000_000.0
LONG_AGO = "2026-01-01T00:00:00Z"
GPU_POD = {"spec": {"restartPolicy": "Never", "containers": [
    {"name": "main", "image": "train:1", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}


def condition(kind: str, status: str, reason: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": "", "lastTransitionTime": LONG_AGO}


def cluster_queue(*, gpus: int = 4, reserved: int = 0, pending: int = 0) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "team-a-cq"},
            "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]},
            "status": {"pendingWorkloads": pending, "flavorsReservation": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": str(reserved)}]}]}}


LOCAL_QUEUE = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "team-a-lq", "namespace": NS}, "spec": {"clusterQueue": "team-a-cq"}}


def job(name: str, *, parallelism: int, elastic: str = "1:4:1:60", annotations: dict[str, str] | None = None,
        started: str = LONG_AGO) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"taugrid.io/run-id": name[:-3]},
                         "annotations": {"kueue.x-k8s.io/elastic-job": "true", "taugrid.io/elastic": elastic,
                                         **(annotations or {})}},
            "spec": {"suspend": False, "parallelism": parallelism, "completions": 4, "completionMode": "Indexed"},
            "status": {"active": parallelism, "startTime": started}}


def admitted(job_name: str, count: int, *, priority: int = 10) -> dict[str, Any]:
    """Kueue's admitted Workload of a Job: ``count`` pods of one GPU each."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{job_name}-a9f0", "namespace": NS,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                              "controller": True}]},
            "spec": {"queueName": "team-a-lq", "priority": priority,
                     "podSets": [{"name": "main", "count": count, "template": GPU_POD}]},
            "status": {"admission": {"clusterQueue": "team-a-cq", "podSetAssignments": [
                {"name": "main", "count": count, "flavors": {"nvidia.com/gpu": "h100"},
                 "resourceUsage": {"nvidia.com/gpu": str(count)}}]},
                "conditions": [condition("QuotaReserved", "True", "QuotaReserved"),
                               condition("Admitted", "True", "Admitted")]}}


def waiting(name: str, *, gpus: int, priority: int = 100, run: str = "hi-1") -> dict[str, Any]:
    """A pending Workload: ``gpus`` pods of one GPU each, the run's labels on its pod template."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"queueName": "team-a-lq", "priority": priority, "podSets": [
                {"name": "main", "count": gpus,
                 "template": {"metadata": {"labels": {"taugrid.io/run-id": run}}, **GPU_POD}}]},
            "status": {"conditions": [condition("QuotaReserved", "False", "Pending")]}}


def run(cq: dict[str, Any], workloads: list[dict[str, Any]], jobs: list[dict[str, Any]],
        now: float = NOW) -> list[Decision]:
    return decide(cluster_queues=[cq], local_queues=[LOCAL_QUEUE], workloads=workloads,
                  jobs={(NS, j["metadata"]["name"]): j for j in jobs}, now=now)


def test_an_elastic_job_grows_by_its_step_into_free_nominal_quota() -> None:
    assert run(cluster_queue(reserved=2), [admitted("el-a1", 2)], [job("el-a1", parallelism=2)]) == [
        Decision(NS, "el-a1", 3, "Grown")]
    # a step of 2 capped at the maximum of 4, from 3
    assert run(cluster_queue(reserved=3), [admitted("el-a1", 3)], [job("el-a1", parallelism=3,
                                                                        elastic="1:4:2:60")]) == [
        Decision(NS, "el-a1", 4, "Grown")]


def test_growth_waits_for_the_cooldown_and_for_room_and_stops_at_the_maximum() -> None:
    recent = json.dumps({"old_count": 3, "new_count": 2, "cause": "Shrunk", "at": "2027-01-15T07:59:30Z"})
    cooling = job("el-a1", parallelism=2, annotations={ANNOTATION_RESIZED: recent})  # 30 s ago, cooldown 60 s
    assert run(cluster_queue(reserved=2), [admitted("el-a1", 2)], [cooling], now=1_800_000_000.0) == []
    assert run(cluster_queue(reserved=2), [admitted("el-a1", 2)], [cooling], now=1_800_000_031.0) == [
        Decision(NS, "el-a1", 3, "Grown")]
    assert run(cluster_queue(gpus=2, reserved=2), [admitted("el-a1", 2)], [job("el-a1", parallelism=2)]) == []
    assert run(cluster_queue(reserved=4), [admitted("el-a1", 4)], [job("el-a1", parallelism=4)]) == []
    unreported = {**cluster_queue(), "status": {}}  # Kueue has not said what is reserved: no room is assumed
    assert run(unreported, [admitted("el-a1", 2)], [job("el-a1", parallelism=2)]) == []


def test_growth_takes_nothing_a_waiting_workload_could_use() -> None:
    """The waiting workload fits the free quota as it is: Kueue admits it, nothing grows or shrinks."""
    assert run(cluster_queue(reserved=2), [admitted("el-a1", 2), waiting("hi", gpus=1)],
               [job("el-a1", parallelism=2)]) == []


def test_the_highest_priority_grows_first_and_each_growth_is_charged() -> None:
    jobs = [job("lo-a1", parallelism=1), job("hi-a1", parallelism=1)]
    wls = [admitted("lo-a1", 1, priority=10), admitted("hi-a1", 1, priority=50)]
    assert run(cluster_queue(reserved=3, gpus=4), wls, jobs) == [Decision(NS, "hi-a1", 2, "Grown")]


def test_a_resize_in_flight_is_never_decided_twice() -> None:
    asked = json.dumps({"old_count": 2, "new_count": 3, "cause": "Grown", "at": LONG_AGO})
    growing = job("el-a1", parallelism=3, annotations={ANNOTATION_RESIZE_REQUESTED: asked})
    assert run(cluster_queue(reserved=2), [admitted("el-a1", 2)], [growing]) == []
    shrinking = job("el-a1", parallelism=2)  # patched; Kueue has not recorded the new count yet
    assert run(cluster_queue(reserved=4), [admitted("el-a1", 4), waiting("hi", gpus=2)], [shrinking]) == []
    slice_ = waiting("job-el-a1-b7c1", gpus=3, priority=10)
    slice_["metadata"]["annotations"] = {SLICE_REPLACEMENT_FOR: f"{NS}/job-el-a1-a9f0"}
    assert run(cluster_queue(reserved=2, gpus=3), [admitted("el-a1", 2), slice_], [job("el-a1", parallelism=2)]) == []


def test_a_higher_priority_workload_takes_pods_from_an_elastic_job_instead_of_evicting_it() -> None:
    # 4 GPUs, all held by the elastic Job (1..4); the newcomer asks for 2: the Job gives 2 up, not all 4
    assert run(cluster_queue(reserved=4), [admitted("el-a1", 4), waiting("hi", gpus=2)],
               [job("el-a1", parallelism=4)]) == [Decision(NS, "el-a1", 2, "ShrunkForPreemptor", "hi-1")]
    # one GPU free: one pod is enough
    assert run(cluster_queue(gpus=5, reserved=4), [admitted("el-a1", 4), waiting("hi", gpus=2)],
               [job("el-a1", parallelism=4)]) == [Decision(NS, "el-a1", 3, "ShrunkForPreemptor", "hi-1")]


def test_no_shrink_that_would_not_make_room_nor_for_a_lower_priority_workload() -> None:
    at_min_2 = job("el-a1", parallelism=4, elastic="2:4:1:60")
    assert run(cluster_queue(reserved=4), [admitted("el-a1", 4), waiting("hi", gpus=3)], [at_min_2]) == []
    assert run(cluster_queue(reserved=4), [admitted("el-a1", 4, priority=200), waiting("hi", gpus=2)],
               [job("el-a1", parallelism=4)]) == []


def test_the_lowest_priority_elastic_job_gives_pods_up_first() -> None:
    jobs = [job("mid-a1", parallelism=2), job("lo-a1", parallelism=2)]
    wls = [admitted("mid-a1", 2, priority=50), admitted("lo-a1", 2, priority=10), waiting("hi", gpus=2)]
    assert run(cluster_queue(reserved=4), wls, jobs) == [Decision(NS, "lo-a1", 1, "ShrunkForPreemptor", "hi-1"),
                                                         Decision(NS, "mid-a1", 1, "ShrunkForPreemptor", "hi-1")]
    wls[2] = waiting("hi", gpus=1)
    assert run(cluster_queue(reserved=4), wls, jobs) == [Decision(NS, "lo-a1", 1, "ShrunkForPreemptor", "hi-1")]


def test_the_kueue_objects_here_are_valid_against_kueues_crds() -> None:
    """What the decisions above read is what Kueue v0.19.2 writes (``/work/shared/crds`` via ``render.crds``)."""
    slice_ = admitted("el-a1", 3)
    slice_["metadata"]["annotations"] = {SLICE_REPLACEMENT_FOR: f"{NS}/job-el-a1-a9f0"}
    for obj in (cluster_queue(reserved=3, pending=1), LOCAL_QUEUE, admitted("el-a1", 2), waiting("hi", gpus=2),
                slice_):
        validate(obj)
