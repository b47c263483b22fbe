"""One trace across the Kubernetes path: the renderer stamps the run's traceparent on what it applies (not on
what it digests), and kube-bridge republishes each watch event with the traceparent of the object's run."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import nats.js.errors

from taugrid.bus import Bus
from taugrid.bus import manifests as stored_manifests
from taugrid.bus.envelope import Event
from taugrid.core.contracts import PolicyApproved, RenderApplied, ResolvedRun
from taugrid.core.events import run_subject
from taugrid.kube.apply import KubeBackend
from taugrid.kube.backend import KubernetesBackend
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid.render import TRACEPARENT_ANNOTATION, manifest_digest
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.renderer.handlers import Renderer

JOBS = ("batch", "v1", "jobs")
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def resolved_run(run_id: str) -> ResolvedRun:
    return ResolvedRun(
        run_id=run_id, submission_id="18f0c2a9b1d4e5f6a7b8", workspace="team-a", namespace="team-a",
        name="train", local_queue="team-a-lq", cluster_queue="team-a-cq", config_hash="sha256:0c1d2e3f",
        source_digest="sha256:a1b2c3d4", command=["python3", "train.py"], entrypoint="train.py",
    )


def approved(run: ResolvedRun, *, traceparent: str) -> Event:
    return Event(
        id=f"{run.run_id}.1.policy.approved", type="policy.approved", source="/test", subject=run.run_id,
        time="", data=msgspec.json.encode(PolicyApproved(run=run)), workspace=run.workspace,
        traceparent=traceparent,
    )


async def last(bus: Bus, stream: str, subject: str) -> Any:
    try:
        return await bus.js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None


async def wait_last(bus: Bus, stream: str, subject: str, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while (msg := await last(bus, stream, subject)) is None:
            await asyncio.sleep(0.05)
    return msg


def bridge(bus: Bus, api_client: Any, cluster: str) -> Bridge:
    return Bridge(
        bus,
        KubeApi(api_client, retries=0),
        cluster=cluster,
        holder="t",
        resources=[(resource_for("Job"), MANAGED_SELECTOR), (resource_for("Workload"), None)],
        lease_ttl_s=1.0,
        checkpoint_every_s=0.1,
        backoff_max_s=0.1,
    )


async def test_applied_job_and_its_workload_are_republished_with_the_runs_traceparent(
    bus: Bus, fake_kube: Any
) -> None:
    fake, api_client = fake_kube
    run = resolved_run(f"train-{uuid.uuid4().hex[:6]}")
    cluster = f"c{uuid.uuid4().hex[:8]}"
    renderer = Renderer(bus, KubernetesBackend(KubeBackend(api_client, retries=0), cluster))

    await renderer.on_event(approved(run, traceparent=TRACEPARENT))

    # What the cluster got carries the trace on the Job and on its pod template ...
    name = f"{run.run_id}-a1"
    job = fake.objects[(JOBS, "team-a", name)]
    assert job["metadata"]["annotations"][TRACEPARENT_ANNOTATION] == TRACEPARENT
    assert job["spec"]["template"]["metadata"]["annotations"][TRACEPARENT_ANNOTATION] == TRACEPARENT
    # ... while render.applied names the manifests as rendered by their digest, stored once by it (issue 27).
    msg = await wait_last(bus, "RUNS", run_subject(run.workspace, run.run_id, "render.applied"))
    applied = msgspec.json.decode(msg.data, type=RenderApplied)
    rendered = await stored_manifests.read(bus, run.workspace, run.run_id, applied.digest)
    assert isinstance(rendered, list) and applied.manifests == []
    assert applied.digest == manifest_digest(rendered)
    assert TRACEPARENT_ANNOTATION not in rendered[0]["metadata"]["annotations"]

    # Kueue's Workload does not copy our annotations, only the pod template: the bridge reads it there.
    fake.put(WORKLOADS, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"job-{name}-1a2b3", "namespace": "team-a",
                     "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": {"queueName": "team-a-lq",
                 "podSets": [{"name": "main", "count": 1, "template": job["spec"]["template"]}]},
    })
    # A managed Job that was not applied by the renderer (no annotation) gets no trace context at all.
    fake.put(JOBS, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "untraced-a1", "namespace": "team-a",
                     "labels": {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": "untraced"}},
        "spec": {"suspend": True},
    })

    b, stop = bridge(bus, api_client, cluster), asyncio.Event()
    task = asyncio.create_task(b.run(stop))
    try:
        job_msg = await wait_last(bus, "K8S", f"k8s.{cluster}.job.team-a.{name}.added")
        wl_msg = await wait_last(bus, "K8S", f"k8s.{cluster}.workload.team-a.job-{name}-1a2b3.added")
        other = await wait_last(bus, "K8S", f"k8s.{cluster}.job.team-a.untraced-a1.added")
    finally:
        stop.set()
        await task
    assert job_msg.headers["traceparent"] == TRACEPARENT
    assert wl_msg.headers["traceparent"] == TRACEPARENT
    assert "traceparent" not in (other.headers or {})


async def test_a_redelivered_approval_reapplies_the_same_object(bus: Bus, fake_kube: Any) -> None:
    """The stamp is the event's traceparent, not the delivery's span: a redelivery changes nothing."""
    fake, api_client = fake_kube
    run = resolved_run(f"train-{uuid.uuid4().hex[:6]}")
    renderer = Renderer(bus, KubernetesBackend(KubeBackend(api_client, retries=0), "c"))
    await renderer.on_event(approved(run, traceparent=TRACEPARENT))
    version = fake.objects[(JOBS, "team-a", f"{run.run_id}-a1")]["metadata"]["resourceVersion"]
    await renderer.on_event(approved(run, traceparent=TRACEPARENT))
    assert fake.objects[(JOBS, "team-a", f"{run.run_id}-a1")]["metadata"]["resourceVersion"] == version
