"""A Kubernetes site's lease (issue 28 item 4, docs §13d) on real servers: a hub and the site's leaf nats-server,
and the site's Kubernetes API emulated over real HTTP (kmock). The kube-bridge's site mode renews the lease
across the link; once the hub has declared the cluster lost, its next pass deletes the Jobs and reservation
Workloads whose run attempt the hub no longer has chosen there (requeued elsewhere, or no record left) before it
rejoins under the hub's generation, and a delete that fails leaves the lease lost and the site's gate shut until a
pass succeeds. Each pass also writes the site's capacity record on the hub from the bridge's queue snapshot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
from nats.js.api import KeyValueConfig

from taugrid.bus import connect, kv, platformstore, sitecapacity, sites
from taugrid.bus.sites import SiteLease
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.sitecapacity import QueueShare, SiteCapacity
from taugrid.kube import queues
from taugrid.kube.apply import KubeBackend
from taugrid_services.kube_bridge.bridge import QUEUES_BUCKET, QUEUES_KEY
from taugrid_services.kube_bridge.site import KubeSite, lease_period
from tests.dispatcher.test_lost_site import PLATFORM
from tests.sitebus import link, start_hub, start_site, stop

CLUSTER_QUEUE = {  # Kueue's: one workload admitted, another's quota reserved (a reservation), three waiting
    "metadata": {"name": "team-a-cq"},
    "spec": {"cohortName": "all", "resourceGroups": [{"flavors": [{"name": "h100", "resources": [
        {"name": "cpu", "nominalQuota": "32"}, {"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]},
    "status": {"admittedWorkloads": 1, "reservingWorkloads": 2, "pendingWorkloads": 3,
               "flavorsUsage": [{"name": "h100", "resources": [{"name": "cpu", "total": "2"},
                                                               {"name": "nvidia.com/gpu", "total": "1"}]}],
               "flavorsReservation": [{"name": "h100", "resources": [{"name": "cpu", "total": "4"},
                                                                     {"name": "nvidia.com/gpu", "total": "2"}]}]}}
PENDING = {"items": [  # the visibility API's answer (the third waiting run is a foreign one: no run id)
    {"metadata": {"name": "job-run-y-a1-1b2c3", "labels": {"taugrid.io/run-id": "run-y"}}, "positionInClusterQueue": 1},
    {"metadata": {"name": "job-run-x-a1-4d5e6", "labels": {"taugrid.io/run-id": "run-x"}}, "positionInClusterQueue": 0},
    {"metadata": {"name": "theirs"}, "positionInClusterQueue": 2}]}
JOBS, WORKLOADS = ("batch", "v1", "jobs"), ("kueue.x-k8s.io", "v1beta2", "workloads")


def job(run: str, attempt: int | None, *, namespace: str = "team-a") -> dict[str, Any]:
    """A run's Job as the renderer labels it (``attempt`` None: a foreign Job with no tau labels)."""
    labels = {} if attempt is None else {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run,
                                         "taugrid.io/workspace": "ws", "taugrid.io/attempt": str(attempt)}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{run}-a{attempt or 1}", "namespace": namespace, "labels": labels},
            "spec": {"suspend": False, "template": {"spec": {"containers": []}}}}


async def test_a_kubernetes_site_renews_its_lease_and_deletes_its_orphans_before_it_rejoins(
        tmp_path: Path, fake_kube: Any) -> None:
    fake, api_client = fake_kube
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    site_proc, site_port = start_site(tmp_path, "site-a", leaf_port)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    site_bus = await link(hub, site_port, "site-a")
    try:
        kube = KubeBackend(api_client)
        site = KubeSite(site_bus, kube, "site-a", grace_s=0)
        deadline = time.monotonic() + 20
        while True:  # the leaf link comes up within a second or two
            try:
                await site.lease_pass()
                break
            except TemporaryError:
                assert time.monotonic() < deadline, "the site never reached the hub"
                await asyncio.sleep(0.2)
        assert site.lease.held.is_set() and site.lease.generation == 1
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(1, False)]
        assert await sitecapacity.reports(hub, ["site-a"]) == {}  # no queue snapshot yet: nothing to report
        # the lease period: the default timeout's until the site holds a platform, then its worker_lost_timeout's
        assert await lease_period(site_bus) == 5.0
        await platformstore.put_text(site_bus, PLATFORM)  # worker_lost_timeout: 2 s
        assert await lease_period(site_bus) == 0.5

        # the leading bridge's queue snapshot at the site becomes the site's capacity record on the hub
        snap = queues.snapshot([CLUSTER_QUEUE], [], pending={"team-a-cq": PENDING}, cluster="site-a", now=1.0)
        await kv.put(site_bus, QUEUES_BUCKET, QUEUES_KEY, msgspec.json.encode(snap))
        await site.lease_pass()
        assert await sitecapacity.reports(hub, ["site-a"]) == {"site-a": SiteCapacity(queues=[QueueShare(
            "team-a-cq", cohort="all", nominal={"cpu": 32.0, "nvidia.com/gpu": 8.0},
            used={"cpu": 4.0, "nvidia.com/gpu": 2.0}, admitted=2, pending=3, first_pending=["run-x", "run-y"])])}
        written = await kv.get(hub, sitecapacity.BUCKET, "site-a")
        await site.lease_pass()  # unchanged: not written again
        again = await kv.get(hub, sitecapacity.BUCKET, "site-a")
        assert written is not None and again is not None and again.revision == written.revision

        # what runs at the site: run-a chosen here, run-b requeued to site-b meanwhile, run-c's attempt 2 with no
        # record left on the hub, and a Job of someone else's
        for obj in (job("run-a", 1), job("run-b", 1), job("run-c", 2, namespace="team-b"), job("theirs", None)):
            fake.put(JOBS, obj)
        # and a reservation (a Workload of ours alone, kube/sitework.py) of run-d, which site-c won meanwhile
        reserved = job("run-d", 1)
        fake.put(WORKLOADS, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                             "metadata": reserved["metadata"], "spec": {"queueName": "team-a-lq", "podSets": []}})
        await hub.js.create_key_value(KeyValueConfig(bucket=sites.DISPATCH_BUCKET))
        for key, chosen in ((sites.dispatch_key("run-a", 1), "site-a"), (sites.dispatch_key("run-b", 1), "site-b"),
                            (sites.dispatch_key("run-d", 1), "site-c")):
            await kv.put(hub, sites.DISPATCH_BUCKET, key, msgspec.json.encode({"chosen": chosen}))

        [(lease, revision)] = (await sites.leases(hub)).values()
        assert await sites.declare_lost(hub, "site-a", lease, revision) == SiteLease(2, True)

        # the first delete is refused (RBAC): nothing rejoins, the gate stays shut, run-c is not reached
        fake.fail("DELETE", 403, "jobs is forbidden", times=1)
        try:
            await site.lease_pass()
            raise AssertionError("a refused delete must fail the pass")
        except PermanentError:
            pass
        assert not site.lease.held.is_set()
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, True)]
        assert sorted(k[2] for k in fake.objects if k[0] == JOBS) == ["run-a-a1", "run-b-a1", "run-c-a2", "theirs-a1"]

        # the next pass deletes the three orphans, then rejoins under generation 2
        await site.lease_pass()
        assert sorted(k[2] for k in fake.objects if k[0] == JOBS) == ["run-a-a1", "theirs-a1"]
        assert [k for k in fake.objects if k[0] == WORKLOADS] == []
        assert site.lease.held.is_set() and site.lease.generation == 2
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, False)]
        await site.lease_pass()  # a plain renewal under the new generation
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, False)]
    finally:
        await hub.close()
        await site_bus.close()
        stop(site_proc, hub_proc)
