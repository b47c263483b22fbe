"""A Kubernetes site's kube-bridge under the chart's auth (docs §13d "A Kubernetes site", §13a): the site's leaf
server admits it with its role's grant plus ``permissions.site_grants`` (what ``chartauth render --site`` renders),
the hub's leaf user lets its replies through (the inbox of its key, as ``chartauth leaf`` records it). On real
authenticated servers and the Kubernetes API emulated over real HTTP: it renews its lease across the link, takes the
dispatcher's signed reservation from its ``SITE_IN`` (a Workload, no Job), leads its watches (lease and checkpoints in
the site's ``bridge`` bucket, made as the chart's site Job makes it) so that Kueue's admission of the reservation
reaches the hub's ``SITE_<CLUSTER>``, holds a chosen Job that Kueue preempted back (deleted, its Workload kept as the
reservation), writes its capacity record, and, once the
hub declares it lost, reads the dispatch records, deletes its orphan Job and rejoins. Without the site grant its
role may do none of it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import msgspec

from taugrid.access import permissions
from taugrid.bus import connect, creds, kv, sitecapacity, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.sites import SiteLease
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.core.errors import TemporaryError
from taugrid.kube import queues
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import KubeApi, resource_for
from taugrid.ports import free_port
from taugrid.stack import chartsites, natsserver
from taugrid.stack.natsserver import Leaf
from taugrid_services.kube_bridge.bridge import QUEUES_BUCKET, QUEUES_KEY, Bridge
from taugrid_services.kube_bridge.site import KubeSite
from tests.dispatcher.test_across_sites import stored
from tests.dispatcher.test_lost_site import PLATFORM
from tests.kube.test_site_lease import CLUSTER_QUEUE, JOBS, WORKLOADS, job
from tests.kube.test_site_requests import request
from tests.sitebus import stop


def _identity(root: Path, name: str) -> tuple[creds.Identity, Path]:
    identity = creds.new_identity(name)
    path = root / f"{name}.nk"
    creds.write(path, identity)
    return identity, path


async def test_the_site_grant_lets_a_kubernetes_sites_bridge_act_for_it_on_authenticated_servers(
        tmp_path: Path, fake_kube: Any) -> None:
    fake, api_client = fake_kube
    boot, boot_path = _identity(tmp_path, "bootstrap")
    disp, disp_path = _identity(tmp_path, "dispatcher")
    bridge, bridge_path = _identity(tmp_path, "kube_bridge")
    role = permissions.SERVICE_ROLES["kube_bridge"]
    lease_write = "$JS.hub.API.$KV.site_leases.site-a"
    assert lease_write not in permissions.service_permissions(role, bridge.public_key).publish
    assert lease_write in permissions.service_permissions(role, bridge.public_key, site="site-a").publish
    leaf_port = free_port()
    hub_auth, site_auth = tmp_path / "hub-auth.conf", tmp_path / "site-auth.conf"
    hub_auth.write_text(permissions.authorization_conf(
        [permissions.Account("bootstrap", boot.public_key, permissions.bootstrap_permissions()),
         permissions.Account("dispatcher", disp.public_key, permissions.service_permissions(
             permissions.SERVICE_ROLES["dispatcher"], disp.public_key))],
        [permissions.LeafUser("site-a", "pw-a", permissions.inbox_prefix(bridge.public_key))]))
    site_auth.write_text(permissions.authorization_conf(permissions.accounts(
        bootstrap_key=boot.public_key, service_keys={"kube_bridge": bridge.public_key}, people=(), site="site-a")))
    hub_proc, hub_port = natsserver.start(tmp_path / "hub", log_file=tmp_path / "hub.log", auth_conf=hub_auth,
                                          leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    site_proc, site_port = natsserver.start(
        tmp_path / "site-a", log_file=tmp_path / "site-a.log", auth_conf=site_auth,
        leaf=Leaf("site-a", hub_url=f"nats-leaf://leaf-site-a:pw-a@127.0.0.1:{leaf_port}",
                  deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS))
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="bootstrap", creds=boot_path)
    dispatcher = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher", creds=disp_path)
    site_boot = await connect(f"nats://127.0.0.1:{site_port}", name="bootstrap", creds=boot_path)
    bus = await connect(f"nats://127.0.0.1:{site_port}", name="kube-bridge", creds=bridge_path)
    site = KubeSite(bus, KubeBackend(api_client), "site-a", grace_s=0)
    loop = ConsumerLoop(bus, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE, handler=site.on_request,
                        fetch_timeout=0.2, gate=site.lease.held)
    task: asyncio.Task[None] | None = None
    watching: asyncio.Task[None] | None = None
    stopping = asyncio.Event()
    try:
        await bootstrap(hub)
        await sites.provision_feed(hub, "site-a")
        # as the chart's site Job does it (its platform names site-a)
        await chartsites.provision_site(site_boot, "site-a", PLATFORM, {"dispatcher": disp.public_key})
        await sites.provision_hub(hub, "site-a")
        deadline = time.monotonic() + 20
        while True:  # the leaf link comes up within a second or two
            try:
                await site.lease_pass()
                break
            except TemporaryError:
                assert time.monotonic() < deadline, "the site never reached the hub"
                await asyncio.sleep(0.2)
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(1, False)]

        task = asyncio.create_task(loop.run())
        req = request("r1")
        await dispatcher.publish("backend.site-a.reserve", req, event_type="reserve", ce_subject="r1",
                                 msg_id="r1.1.reserve.site-a", workspace="ws", attempt=1, family="backend")
        deadline = time.monotonic() + 10
        while (WORKLOADS, "team-a", "r1-a1") not in fake.objects:
            assert time.monotonic() < deadline, "the reservation was never applied"
            await asyncio.sleep(0.05)
        assert [k for k in fake.objects if k[0] == JOBS] == []

        # the leading bridge (its lease and checkpoints in the site's own `bridge` bucket) watches Workloads: Kueue's
        # admission of the reservation crosses to the hub as this cluster's report
        watching = asyncio.create_task(Bridge(bus, KubeApi(api_client), cluster="site-a", lease_ttl_s=3.0,
                                              resources=[(resource_for("Workload"), None)],
                                              observers=[site.on_change]).run(stopping))
        prefix = "site.site-a.k8s.site-a.workload.team-a.r1-a1"

        async def reported(change: str) -> None:
            deadline = time.monotonic() + 10
            while f"{prefix}.{change}" not in await stored(hub, sites.hub_stream("site-a")):
                assert time.monotonic() < deadline, "the preempted Job was never held back"
                await asyncio.sleep(0.1)

        await reported("added")  # the reservation as listed, waiting
        fake.modify(WORKLOADS, "team-a", "r1-a1", lambda o: o.update(status={"conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]}))
        await reported("modified")
        assert await stored(hub, sites.hub_stream("site-a")) == [f"{prefix}.added", f"{prefix}.modified"]

        # chosen: the Job runs under the Workload (Kueue adopts it); then Kueue preempts it there: the bridge deletes
        # the Job and keeps the Workload, queued again as the reservation, so it cannot start again by itself
        await dispatcher.publish("backend.site-a.apply", req, event_type="apply", ce_subject="r1",
                                 msg_id="r1.1.apply.site-a", workspace="ws", attempt=1, family="backend")
        deadline = time.monotonic() + 10
        while (JOBS, "team-a", "r1-a1") not in fake.objects:
            assert time.monotonic() < deadline, "the chosen apply was never applied"
            await asyncio.sleep(0.05)
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "r1-a1", "controller": True,
                 "uid": fake.objects[(JOBS, "team-a", "r1-a1")]["metadata"]["uid"]}
        fake.modify(WORKLOADS, "team-a", "r1-a1", lambda o: (o["metadata"].update(ownerReferences=[owner]), o.update(
            status={"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending"},
                                   {"type": "Evicted", "status": "True", "reason": "Preempted",
                                    "message": "Preempted to accommodate a higher priority workload"}]})))
        deadline = time.monotonic() + 10
        while (JOBS, "team-a", "r1-a1") in fake.objects:
            assert time.monotonic() < deadline, "the preempted Job was never held back"
            await asyncio.sleep(0.05)
        assert "ownerReferences" not in fake.objects[(WORKLOADS, "team-a", "r1-a1")]["metadata"]

        snap = queues.snapshot([CLUSTER_QUEUE], [], pending=None, cluster="site-a", now=1.0)
        await kv.put(bus, QUEUES_BUCKET, QUEUES_KEY, msgspec.json.encode(snap))
        await site.lease_pass()
        [(name, record)] = (await sitecapacity.reports(hub, ["site-a"])).items()
        assert (name, [q.cluster_queue for q in record.queues]) == ("site-a", ["team-a-cq"])

        # declared lost: the bridge reads the dispatch records across the link, deletes the Job the hub has no
        # record of and the reservation it does not have chosen here, and rejoins
        fake.put(JOBS, job("run-z", 1))
        [(lease, revision)] = (await sites.leases(hub)).values()
        assert await sites.declare_lost(hub, "site-a", lease, revision) == SiteLease(2, True)
        await site.lease_pass()
        assert [k for k in fake.objects if k[0] in (JOBS, WORKLOADS)] == []
        assert [v for v, _ in (await sites.leases(hub)).values()] == [SiteLease(2, False)]
    finally:
        stopping.set()
        if watching is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watching, 5)
        loop.stopping.set()
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
        for b in (hub, dispatcher, site_boot, bus):
            with contextlib.suppress(Exception):
                await b.close()
        stop(site_proc, hub_proc)
