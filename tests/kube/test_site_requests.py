"""The dispatcher's requests at a Kubernetes site (issue 28, docs §13d) on real servers: a hub and the site's leaf
nats-server, the site's Kubernetes API emulated over real HTTP (kmock), the kube-bridge's site mode consuming its
``SITE_IN``. As MultiKueue does it: a reservation creates only a Kueue Workload for the run's Job (no Job: nothing
can run), whose admission the bridge's watch reports into ``SITE_OUT`` with the run's labels; the chosen apply
creates the Job labelled with that Workload (``kueue.x-k8s.io/prebuilt-workload-name``); the reservation carries
Kueue's preemption gate until the dispatcher lets this cluster preempt; a withdrawal deletes the
Workload; a request Kueue could never admit (no queue) goes to the site's DLQ with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus import connect, sites
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.dlq import dead_letters
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.core.contracts import BackendApply, BackendDelete, WatchEvent
from taugrid.core.errors import PermanentError
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import KubeApi
from taugrid.kube.sitework import PREBUILT_LABEL, PREEMPTION_GATE_ANNOTATION, chosen, reservation
from taugrid_services.dispatcher.handlers import admitted
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.kube_bridge.site import KubeSite
from tests.dispatcher.test_across_sites import stored
from tests.sitebus import link, start_hub, start_site, stop

JOBS, WORKLOADS = ("batch", "v1", "jobs"), ("kueue.x-k8s.io", "v1beta2", "workloads")
TEMPLATE = {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "python:3.11-slim"}]}}


def request(run: str, *, queue: str | None = "team-a-lq") -> BackendApply:
    labels = {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run, "taugrid.io/workspace": "ws",
              "taugrid.io/attempt": "1"} | ({"kueue.x-k8s.io/queue-name": queue} if queue else {})
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{run}-a1", "namespace": "team-a", "labels": labels},
           "spec": {"suspend": True, "backoffLimit": 0, "parallelism": 2, "completions": 2, "template": TEMPLATE}}
    return BackendApply(run_id=run, workspace="ws", attempt=1, manifests=[job])


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_kubernetes_site_reserves_with_a_workload_runs_the_chosen_job_under_it_and_withdraws(
        tmp_path: Path, fake_kube: Any) -> None:
    fake, api_client = fake_kube
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    site_proc, site_port = start_site(tmp_path, "site-a", leaf_port)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    site_bus = await link(hub, site_port, "site-a")
    site = KubeSite(site_bus, KubeBackend(api_client), "site-a")
    loop = ConsumerLoop(site_bus, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE, handler=site.on_request,
                        fetch_timeout=0.2, gate=site.lease.held)
    task = asyncio.create_task(loop.run())

    async def send(verb: str, req: BackendApply | BackendDelete) -> None:  # as the dispatcher sends them
        grant = isinstance(req, BackendApply) and req.may_preempt
        await hub.publish(f"backend.site-a.{verb}", req, event_type=verb, ce_subject=req.run_id,
                          msg_id=f"{req.run_id}.{req.attempt}.{verb}.site-a{'.grant' if grant else ''}",
                          workspace=req.workspace,
                          attempt=req.attempt, family="backend")

    def names(res: tuple[str, str, str]) -> list[str]:
        return sorted(k[2] for k in fake.objects if k[0] == res)

    try:
        await send("reserve", request("r1"))
        await until(lambda: names(WORKLOADS) == ["r1-a1"])
        wl = fake.objects[(WORKLOADS, "team-a", "r1-a1")]
        assert wl["metadata"]["labels"] == {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": "r1",
                                            "taugrid.io/workspace": "ws", "taugrid.io/attempt": "1"}
        assert wl["spec"] == {"queueName": "team-a-lq", "podSets": [{"name": "main", "count": 2, "template": TEMPLATE}]}
        assert wl["metadata"]["annotations"] == {PREEMPTION_GATE_ANNOTATION: "multi-kueue:OrchestratedPreemption"}
        assert names(JOBS) == []  # a reservation runs nothing

        # the dispatcher lets this cluster preempt for it: the same reservation, its gate lifted
        await send("reserve", msgspec.structs.replace(request("r1"), may_preempt=True))
        await until(lambda: PREEMPTION_GATE_ANNOTATION not in (
            fake.objects[(WORKLOADS, "team-a", "r1-a1")]["metadata"].get("annotations") or {}))

        # Kueue reserves quota for it; the bridge's watch reports that into SITE_OUT, as the dispatcher reads it
        def admit(o: dict[str, Any]) -> None:
            o["status"] = {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]}

        fake.modify(WORKLOADS, "team-a", "r1-a1", admit)
        change = WatchEvent(type="MODIFIED", object=fake.objects[(WORKLOADS, "team-a", "r1-a1")], cluster="site-a")
        await Bridge(site_bus, KubeApi(api_client), cluster="site-a").publish(change)
        assert await stored(site_bus, sites.SITE_OUT) == ["k8s.site-a.workload.team-a.r1-a1.modified"]
        assert admitted(change.object)

        # chosen: the Job, still suspended, to run under the Workload Kueue admitted
        await send("apply", request("r1"))
        await until(lambda: names(JOBS) == ["r1-a1"])
        job = fake.objects[(JOBS, "team-a", "r1-a1")]
        assert (job["metadata"]["labels"][PREBUILT_LABEL], job["spec"]["suspend"]) == ("r1-a1", True)

        # another run reserved, then withdrawn (another cluster admitted it first): its Workload goes
        await send("reserve", request("r2"))
        await until(lambda: names(WORKLOADS) == ["r1-a1", "r2-a1"])
        # Kueue preempting a reservation (no Job yet) holds nothing back: it queues on as it is
        evicted = dict(fake.objects[(WORKLOADS, "team-a", "r2-a1")], status={"conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "for a higher priority"}]})
        assert await site.work.hold_back(evicted) is False
        assert names(WORKLOADS) == ["r1-a1", "r2-a1"]
        await send("delete", BackendDelete(run_id="r2", workspace="ws", attempt=1, kind="Job", namespace="team-a",
                                           name="r2-a1", reason="site-b admitted it first"))
        await until(lambda: names(WORKLOADS) == ["r1-a1"])

        # a reservation Kueue could never admit is refused into the site's DLQ, nothing created
        await send("reserve", request("r3", queue=None))
        deadline = time.monotonic() + 5
        while await stored(site_bus, "DLQ") == []:
            assert time.monotonic() < deadline, "the refused reservation never reached the DLQ"
            await asyncio.sleep(0.05)
        [dead] = await dead_letters(site_bus)
        assert (dead.kind, dead.subject, dead.durable) == ("refused", "backend.site-a.reserve", SITE_LOCAL_DURABLE)
        assert "r3-a1 has no kueue.x-k8s.io/queue-name label" in dead.error
        assert (names(WORKLOADS), names(JOBS)) == (["r1-a1"], ["r1-a1"])

        # the run cancelled: its Job and its Workload go
        await send("delete", BackendDelete(run_id="r1", workspace="ws", attempt=1, kind="Job", namespace="team-a",
                                           name="r1-a1", reason="cancelled"))
        await until(lambda: (names(WORKLOADS), names(JOBS)) == ([], []))
        assert await stored(site_bus, sites.SITE_IN) == [
            "backend.site-a.reserve", "backend.site-a.reserve", "backend.site-a.apply", "backend.site-a.reserve",
            "backend.site-a.delete", "backend.site-a.reserve", "backend.site-a.delete"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await hub.close()
        await site_bus.close()
        stop(site_proc, hub_proc)


def test_a_rayjobs_reservation_has_a_head_pod_set_and_one_per_worker_group() -> None:
    head, worker = {"spec": {"containers": [{"name": "head"}]}}, {"spec": {"containers": [{"name": "worker"}]}}
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "r9-a1", "namespace": "team-a",
                           "labels": {"kueue.x-k8s.io/queue-name": "team-a-lq",
                                      "kueue.x-k8s.io/priority-class": "high", "taugrid.io/run-id": "r9"}},
              "spec": {"rayClusterSpec": {"headGroupSpec": {"template": head},
                                          "workerGroupSpecs": [{"groupName": "gpu", "replicas": 3,
                                                                "template": worker}]}}}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    req = BackendApply(run_id="r9", workspace="ws", attempt=1, manifests=[namespace, rayjob])
    assert reservation(req) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "r9-a1", "namespace": "team-a", "labels": {"taugrid.io/run-id": "r9"},
                     "annotations": {PREEMPTION_GATE_ANNOTATION: "multi-kueue:OrchestratedPreemption"}},
        "spec": {"queueName": "team-a-lq", "priorityClassName": "high",
                 "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
                 "podSets": [{"name": "head", "count": 1, "template": head},
                             {"name": "gpu", "count": 3, "template": worker}]}}
    [ns, labelled] = chosen(req)
    assert ns == namespace and labelled["metadata"]["labels"][PREBUILT_LABEL] == "r9-a1"
    assert PREBUILT_LABEL not in rayjob["metadata"]["labels"]  # the request itself is left as it came
    with pytest.raises(PermanentError, match="names no Job or RayJob"):
        reservation(BackendApply(run_id="r9", workspace="ws", attempt=1, manifests=[namespace]))
