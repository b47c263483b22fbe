"""kube-bridge against a real nats-server and the kmock API: publish, checkpoint, one leader, takeover."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import nats.js.errors

from taugrid.bus import Bus
from taugrid.bus.envelope import from_message
from taugrid.core.contracts import WatchEvent
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid_services.kube_bridge.bridge import Bridge

JOBS = ("batch", "v1", "jobs")


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": "r-1"},
        },
        "spec": {"suspend": True},
        "status": {},
    }


async def until(cond: Callable[[], Any], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.05)


async def last(bus: Bus, subject: str) -> Any:
    try:
        return await bus.js.get_last_msg("K8S", subject)
    except nats.js.errors.NotFoundError:
        return None


def bridge(bus: Bus, api_client: Any, cluster: str, holder: str) -> Bridge:
    return Bridge(
        bus,
        KubeApi(api_client, retries=0),
        cluster=cluster,
        holder=holder,
        resources=[(resource_for("Job"), MANAGED_SELECTOR)],
        lease_ttl_s=1.0,
        checkpoint_every_s=0.1,
        backoff_max_s=0.1,
    )


async def test_publishes_changes_checkpoints_and_hands_over_to_a_standby(bus: Bus, fake_kube: Any) -> None:
    fake, api_client = fake_kube
    cluster = f"c{uuid.uuid4().hex[:8]}"
    obj = fake.put(JOBS, job("train-a1"))
    subject = f"k8s.{cluster}.job.team-a.train-a1"

    a, b = bridge(bus, api_client, cluster, "a"), bridge(bus, api_client, cluster, "b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = asyncio.create_task(a.run(stop_a))
    await until(lambda: last(bus, f"{subject}.added"))
    task_b = asyncio.create_task(b.run(stop_b))
    try:
        msg = await last(bus, f"{subject}.added")
        assert msg.headers["Nats-Msg-Id"] == f"{obj['metadata']['uid']}.{obj['metadata']['resourceVersion']}"
        assert "ce-type" not in msg.headers  # its subject says it (issue 27: compact headers)
        assert from_message(msg.subject, msg.headers, msg.data).ce_type == "io.taugrid.k8s.job.added.v1"
        ev = msgspec.json.decode(msg.data, type=WatchEvent)
        assert ev.cluster == cluster and ev.object["metadata"]["name"] == "train-a1"

        kv = await bus.kv("bridge")

        async def checkpointed() -> bool:
            try:
                return (await kv.get(f"rv.{cluster}.jobs")).value == obj["metadata"][
                    "resourceVersion"
                ].encode()
            except nats.js.errors.KeyNotFoundError:
                return False

        await until(checkpointed)
        await asyncio.sleep(0.5)
        assert b.published == 0 and not b.lease.held  # one active bridge per cluster

        stop_a.set()
        await task_a
        fake.modify(JOBS, "team-a", "train-a1", lambda o: o["status"].update(active=1))
        await until(lambda: last(bus, f"{subject}.modified"))
        assert b.lease.held
        assert b.watchers["jobs"].relists == 0  # resumed from the checkpoint, not relisted
        assert b.published == 1  # only the change it had not seen
        fake.remove(JOBS, "team-a", "train-a1")
        await until(lambda: last(bus, f"{subject}.deleted"))
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(task_a, task_b)
