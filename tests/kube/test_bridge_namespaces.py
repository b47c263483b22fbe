"""kube-bridge with ``TAU_WATCH_NAMESPACES``: namespaced kinds are watched per listed namespace only."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats.js.errors

from taugrid.bus import Bus
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid.settings import Settings
from taugrid_services.kube_bridge.bridge import Bridge
from tests.kube.test_bridge import JOBS, job, last, until


def watch_namespaces(raw: str) -> list[str]:
    """As kube-bridge's start hands them to the bridge."""
    return sorted(Settings.from_env({"TAU_WATCH_NAMESPACES": raw}).kube.watch_namespaces)


def test_env_value_parsing() -> None:
    assert watch_namespaces("") == [] and watch_namespaces(" , ") == []
    assert watch_namespaces("team-b, team-a,,team-b") == ["team-a", "team-b"]


async def test_only_listed_namespaces_are_watched_nodes_stay_cluster_wide(bus: Bus, fake_kube: Any) -> None:
    fake, api_client = fake_kube
    cluster = f"c{uuid.uuid4().hex[:8]}"
    for ns in ("team-a", "team-b", "other"):
        obj = job(f"train-{ns}")
        obj["metadata"]["namespace"] = ns
        fake.put(JOBS, obj)
    fake.put(("", "v1", "nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}})
    b = Bridge(bus, KubeApi(api_client, retries=0), cluster=cluster, holder="a",
               resources=[(resource_for("Job"), MANAGED_SELECTOR), (resource_for("Node"), None)],
               lease_ttl_s=1.0, checkpoint_every_s=0.1, backoff_max_s=0.1, namespaces=["team-a", "team-b"])
    stop = asyncio.Event()
    task = asyncio.create_task(b.run(stop))
    try:
        await until(lambda: last(bus, f"k8s.{cluster}.job.team-b.train-team-b.added"))
        await until(lambda: last(bus, f"k8s.{cluster}.node.>"))  # cluster-scoped: no namespace token
        assert sorted(b.watchers) == ["jobs.team-a", "jobs.team-b", "nodes"]
        assert await last(bus, f"k8s.{cluster}.job.team-a.train-team-a.added") is not None
        await asyncio.sleep(0.3)
        assert await last(bus, f"k8s.{cluster}.job.other.train-other.added") is None
        paths = {(w.resource.plural, w.namespace) for w in b.watchers.values()}
        assert paths == {("jobs", "team-a"), ("jobs", "team-b"), ("nodes", None)}
        kv = await bus.kv("bridge")

        async def checkpointed() -> bool:
            try:
                return bool((await kv.get(f"rv.{cluster}.jobs.team-a")).value)
            except nats.js.errors.KeyNotFoundError:
                return False

        await until(checkpointed)
    finally:
        stop.set()
        await task
