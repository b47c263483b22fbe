"""Resizing an elastic Job on Kubernetes (``kube/resize.py``) over real HTTP (kmock): a shrink is a merge patch of
``spec.parallelism`` that records the resize at once; a growth is only asked for until Kueue admits its workload
slice; every resize reads back as exactly one ``exec.resized``; what cannot be resized is refused with the fix; the
leading kube-bridge decides the resizes itself (``kube/elasticdecide.py``) and carries them out."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.core import contracts as c
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.watched import slim
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.resize import ANNOTATION_RESIZE_REQUESTED, SLICE_REPLACEMENT_FOR, JobScaler
from taugrid.kube.translate import ANNOTATION_RESIZED, translate
from taugrid_services.kube_bridge.bridge import Bridge
from tests.kube.test_elasticdecide import LOCAL_QUEUE, admitted, cluster_queue, condition, waiting

JOBS, WORKLOADS = ("batch", "v1", "jobs"), ("kueue.x-k8s.io", "v1beta2", "workloads")
NS, NAME = "team-a", "train-3f2a1b-a1"


def elastic_job(*, parallelism: int = 3, suspend: bool = False, elastic: str = "1:4:1:60") -> dict[str, Any]:
    """As ``render`` writes an elastic torchrun Job (Kueue's opt-in, taugrid's range), running."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": NAME, "namespace": NS,
                         "labels": {"taugrid.io/run-id": "train-3f2a1b", "taugrid.io/workspace": "team-a",
                                    "taugrid.io/attempt": "1"},
                         "annotations": {"kueue.x-k8s.io/elastic-job": "true", "taugrid.io/elastic": elastic}},
            "spec": {"suspend": suspend, "parallelism": parallelism, "completions": 4,
                     "completionMode": "Indexed", "template": {}},
            "status": {"active": parallelism}}


def slice_workload(count: int, *, admitted: bool) -> dict[str, Any]:
    """Kueue's scale-up slice of the Job (owned by it, naming the slice it replaces)."""
    status: dict[str, Any] = {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending"}]}
    if admitted:
        status = {"admission": {"clusterQueue": "team-a-cq",
                                "podSetAssignments": [{"name": "main", "count": count,
                                                       "flavors": {"nvidia.com/gpu": "h100"}}]},
                  "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                                 {"type": "Admitted", "status": "True", "reason": "Admitted"}]}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{NAME}-b7c1", "namespace": NS,
                         "annotations": {SLICE_REPLACEMENT_FOR: f"{NS}/job-{NAME}-a9f0"},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": NAME,
                                              "uid": "u1", "controller": True}]},
            "spec": {"queueName": "team-a-lq", "podSets": [{"name": "main", "count": count}]},
            "status": status}


def resized_events(job: dict[str, Any]) -> list[Any]:
    return [o for o in translate(c.WatchEvent(type="MODIFIED", object=slim(job))) if o.event_type == "exec.resized"]


async def test_a_shrink_is_recorded_at_once_and_a_growth_when_kueue_admits_its_slice(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, elastic_job())
    scaler = JobScaler(KubeApi(api_client, retry_cap_s=0.05))

    shrunk = await scaler.resize(NS, NAME, 2, cause="ShrunkForPreemptor", preemptor="hi-1")
    assert fake.applies[-1]["content_type"].startswith("application/merge-patch+json")
    assert shrunk["spec"]["parallelism"] == 2 and ANNOTATION_RESIZE_REQUESTED not in shrunk["metadata"]["annotations"]
    [event] = resized_events(shrunk)
    assert event.payload == c.ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1",
                                          pod_set="main")
    assert (event.run_id, event.attempt) == ("train-3f2a1b", 1)

    asked = await scaler.resize(NS, NAME, 4)  # Kueue now creates a slice; the run is still at 2
    assert asked["spec"]["parallelism"] == 4
    assert json.loads(asked["metadata"]["annotations"][ANNOTATION_RESIZE_REQUESTED])["new_count"] == 4
    assert [e.dedup for e in resized_events(asked)] == [event.dedup]  # only the shrink, already sent

    assert not await scaler.confirm_slice(slice_workload(4, admitted=False))  # pending: nothing happened yet
    assert not await scaler.confirm_slice(slice_workload(3, admitted=True))  # not the size asked for
    assert await scaler.confirm_slice(slice_workload(4, admitted=True))
    grown = fake.objects[(JOBS, NS, NAME)]
    assert ANNOTATION_RESIZE_REQUESTED not in grown["metadata"]["annotations"]
    [after] = resized_events(grown)
    assert after.payload == c.ExecResized(old_count=2, new_count=4, cause="Grown", pod_set="main")
    assert after.dedup != event.dedup
    assert not await scaler.confirm_slice(slice_workload(4, admitted=True))  # a redelivered watch change

    before = fake.objects[(JOBS, NS, NAME)]["metadata"]["resourceVersion"]
    assert (await scaler.resize(NS, NAME, 4))["metadata"]["resourceVersion"] == before  # already 4: no patch


@pytest.mark.parametrize(("job", "count", "message"), [
    (elastic_job(elastic=""), 2, f"Job {NS}/{NAME} is not elastic (no kueue.x-k8s.io/elastic-job: \"true\" with a "
     "taugrid.io/elastic range): submit it with policy.mode: elastic to let it resize"),
    (elastic_job(suspend=True), 2, f"Job {NS}/{NAME} is suspended: Kueue admits it whole at its written size; "
     "resize it once it runs"),
    (elastic_job(), 5, f"Job {NS}/{NAME}: 5 pods is outside its range 1..4 (policy.elastic.min/max)"),
    (elastic_job(), 0, f"Job {NS}/{NAME}: 0 pods is outside its range 1..4 (policy.elastic.min/max)"),
])
async def test_what_cannot_be_resized_is_refused_with_the_fix_and_left_alone(
        fake_kube: Any, job: dict[str, Any], count: int, message: str) -> None:
    fake, api_client = fake_kube
    stored = copy.deepcopy(fake.put(JOBS, job))
    with pytest.raises(PermanentError) as err:
        await JobScaler(KubeApi(api_client, retry_cap_s=0.05)).resize(NS, NAME, count)
    assert str(err.value) == message
    assert fake.objects[(JOBS, NS, NAME)] == stored


async def test_a_job_changed_since_it_was_read_is_a_conflict_not_overwritten(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.put(JOBS, elastic_job())
    scaler = JobScaler(KubeApi(api_client, retries=0))
    job = await scaler._get(NS, NAME)
    fake.modify(JOBS, NS, NAME, lambda o: o["status"].update(ready=3))  # the Job controller moved on
    with pytest.raises(TemporaryError):
        await scaler._patch(NS, NAME, {"spec": {"parallelism": 2}}, str(job["metadata"]["resourceVersion"]))
    assert fake.objects[(JOBS, NS, NAME)]["spec"]["parallelism"] == 3
    assert ANNOTATION_RESIZED not in fake.objects[(JOBS, NS, NAME)]["metadata"]["annotations"]


async def test_the_bridge_records_a_growth_when_it_sees_kueue_admit_the_slice(bus: Bus, fake_kube: Any) -> None:
    """The leader's Workload watch: the admitted slice is published, then its Job's asked-for growth recorded."""
    fake, api_client = fake_kube
    fake.put(JOBS, elastic_job(parallelism=2))
    await JobScaler(KubeApi(api_client)).resize(NS, NAME, 3)
    cluster = f"c{uuid.uuid4().hex[:8]}"
    bridge = Bridge(bus, KubeApi(api_client, retries=0), cluster=cluster, holder="a",
                    resources=[(resource_for("Workload"), None)], lease_ttl_s=1.0, checkpoint_every_s=0.1,
                    backoff_max_s=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    try:
        fake.put(WORKLOADS, slice_workload(3, admitted=False))
        await until(lambda: bridge.published >= 1)
        assert ANNOTATION_RESIZE_REQUESTED in fake.objects[(JOBS, NS, NAME)]["metadata"]["annotations"]
        fake.modify(WORKLOADS, NS, f"job-{NAME}-b7c1", lambda o: o.update(status=slice_workload(3, admitted=True)
                                                                           ["status"]))
        await until(lambda: ANNOTATION_RESIZED in fake.objects[(JOBS, NS, NAME)]["metadata"]["annotations"])
    finally:
        stop.set()
        await task
    [event] = resized_events(fake.objects[(JOBS, NS, NAME)])
    assert event.payload == c.ExecResized(old_count=2, new_count=3, cause="Grown", pod_set="main")


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


async def test_the_bridge_grows_an_elastic_job_into_free_quota_and_shrinks_it_for_a_higher_priority_workload(
        bus: Bus, fake_kube: Any) -> None:
    """Kueue never resizes a Job itself: the leading bridge decides (``kube/elasticdecide.py``) and patches. Quota
    4 GPUs, the run at 2 of 1..3: it asks to grow to 3 (Kueue's slice, emulated here, admits it and the growth is
    recorded), then a pending 2-GPU workload of higher priority takes one pod from it (3 -> 2), not the whole run."""
    fake, api_client = fake_kube
    cqs, lqs = ("kueue.x-k8s.io", "v1beta2", "clusterqueues"), ("kueue.x-k8s.io", "v1beta2", "localqueues")
    job = elastic_job(parallelism=2, elastic="1:3:1:0")
    job["metadata"]["labels"]["taugrid.io/managed-by"] = "taugrid"
    job["status"]["startTime"] = "2026-01-01T00:00:00Z"
    fake.put(JOBS, job)
    fake.put(cqs, cluster_queue(reserved=2))
    fake.put(lqs, LOCAL_QUEUE)
    first = admitted(NAME, 2)
    fake.put(WORKLOADS, first)
    bridge = Bridge(bus, KubeApi(api_client, retries=0), cluster=f"c{uuid.uuid4().hex[:8]}", holder="a",
                    resources=[(resource_for(k), None) for k in ("Workload", "Job", "ClusterQueue", "LocalQueue")],
                    lease_ttl_s=1.0, checkpoint_every_s=0.1, backoff_max_s=0.1, queue_every_s=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    stored = lambda: fake.objects[(JOBS, NS, NAME)]  # noqa: E731
    try:
        await until(lambda: stored()["spec"]["parallelism"] == 3)
        asked = json.loads(stored()["metadata"]["annotations"][ANNOTATION_RESIZE_REQUESTED])
        assert (asked["old_count"], asked["new_count"], asked["cause"]) == (2, 3, "Grown")
        # Kueue admits the scale-up slice, finishes the old one and charges the third GPU
        fake.put(WORKLOADS, {**slice_workload(3, admitted=True), "spec": {**admitted(NAME, 3)["spec"]},
                             "status": {**admitted(NAME, 3)["status"]}})
        fake.modify(WORKLOADS, NS, first["metadata"]["name"], lambda o: o["status"]["conditions"].append(
            condition("Finished", "True", "WorkloadSliceReplaced")))
        fake.modify(cqs, None, "team-a-cq", lambda o: o.update(status=cluster_queue(reserved=3)["status"]))
        await until(lambda: ANNOTATION_RESIZED in stored()["metadata"]["annotations"])
        [grown] = resized_events(stored())
        assert grown.payload == c.ExecResized(old_count=2, new_count=3, cause="Grown", pod_set="main")

        fake.put(WORKLOADS, waiting("hi-1-a1-w", gpus=2, run="hi-1"))  # priority 100 over the run's 10
        await until(lambda: stored()["spec"]["parallelism"] == 2)
        for _ in range(5):  # and no more: Kueue has not recorded the shrink yet, so nothing is decided twice
            await asyncio.sleep(0.1)
        assert stored()["spec"]["parallelism"] == 2
    finally:
        stop.set()
        await task
    [shrunk] = resized_events(stored())
    assert shrunk.payload == c.ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1",
                                           pod_set="main")
