"""A site's leaf node on an authenticated hub (many clusters, docs §13d): the hub admits it as its own leaf user
(``permissions.leaf_permissions``), which lets through its own requests, its own lease and its own capacity record
and nothing else. A site owns its server, so a misbehaving one is played here by a client on the site's server: it
tries to write another cluster's lease or capacity record, publish a run event into the hub, read the hub's run
records, source another cluster's requests and listen to the hub's replies. Each is refused by the hub, while the
site's own link, lease and capacity record keep working."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from nats.js.api import ConsumerConfig

from taugrid.access import permissions
from taugrid.bus import connect, creds, sitecapacity, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.core.errors import TemporaryError
from taugrid.core.sitecapacity import QueueShare, SiteCapacity
from taugrid.ports import free_port
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf
from tests.sitebus import stop


def _identity(root: Path, name: str) -> tuple[creds.Identity, Path]:
    identity = creds.new_identity(name)
    path = root / f"{name}.nk"
    creds.write(path, identity)
    return identity, path


async def _stored(bus: Bus, stream: str) -> list[str]:
    info = await bus.js.stream_info(stream)
    return [(await bus.js.get_msg(stream, seq)).subject or ""
            for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1)]


async def _until_stored(bus: Bus, stream: str, want: list[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while await _stored(bus, stream) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream} holds {await _stored(bus, stream)}, not {want}")
        await asyncio.sleep(0.1)


async def test_a_site_reaches_only_its_own_requests_and_lease_on_the_hub(tmp_path: Path) -> None:
    boot, boot_path = _identity(tmp_path, "bootstrap")
    local, local_path = _identity(tmp_path, "local_cluster")
    leaf_port = free_port()
    auth = tmp_path / "auth.conf"
    auth.write_text(permissions.authorization_conf(
        [permissions.Account("bootstrap", boot.public_key, permissions.bootstrap_permissions())],
        [permissions.LeafUser("site-a", "pw-a", permissions.inbox_prefix(local.public_key))]))
    hub_proc, hub_port = natsserver.start(tmp_path / "hub", log_file=tmp_path / "hub.log", auth_conf=auth,
                                          leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    site_proc, site_port = natsserver.start(
        tmp_path / "site-a", log_file=tmp_path / "site-a.log",
        leaf=Leaf("site-a", hub_url=f"nats-leaf://leaf-site-a:pw-a@127.0.0.1:{leaf_port}",
                  deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS))
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="bootstrap", creds=boot_path)
    site = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster", creds=local_path)
    try:
        await bootstrap(hub)
        for cluster in ("site-a", "site-b"):
            await sites.provision_hub(hub, cluster)
        await sites.provision_site(site, "site-a")
        for cluster in ("site-a", "site-b"):
            await hub.publish(f"backend.{cluster}.apply", b"{}", event_type="apply", ce_subject="r1",
                              msg_id=f"{cluster}.1", family="backend")
        await site.publish("k8s.site-a.Workload.ns.w1.modified", b"{}", event_type="modified", ce_subject="r1",
                           msg_id="w1", family="k8s")
        # what the link is for still crosses: its own requests in, its reports out, its own lease
        await _until_stored(site, sites.SITE_IN, ["backend.site-a.apply"])
        await _until_stored(hub, sites.hub_stream("site-a"), ["site.site-a.k8s.site-a.Workload.ns.w1.modified"])
        assert (await sites.renew(site, "site-a", 1)).fence is False
        assert {name: lease for name, (lease, _) in (await sites.leases(hub)).items()} == {
            "site-a": sites.SiteLease(1)}
        own = SiteCapacity(nodes=2)
        await sitecapacity.report(site, "site-a", own, hub_domain=sites.HUB_DOMAIN)

        hub_js = site.nc.jetstream(domain=sites.HUB_DOMAIN, timeout=2)
        with pytest.raises(Exception):  # noqa: B017 - refused on the hub: the request never gets an answer
            await sites._write_across(site, "site-b", sites.SiteLease(1), last=0, hub_domain=sites.HUB_DOMAIN)
        with pytest.raises(TemporaryError):  # another cluster's capacity record: no answer, nothing stored
            await sitecapacity.report(site, "site-b", SiteCapacity(nodes=99), hub_domain=sites.HUB_DOMAIN)
        with pytest.raises(TemporaryError):  # its own, but past the bucket's size: refused, the last one kept
            await sitecapacity.report(site, "site-a", SiteCapacity(queues=[
                QueueShare(f"queue-{i}", nominal={"cpu": 1.0}) for i in range(3000)]), hub_domain=sites.HUB_DOMAIN)
        with pytest.raises(Exception):  # noqa: B017
            await hub_js.key_value("run_state")
        with pytest.raises(Exception):  # noqa: B017 - another cluster's requests
            await hub_js.add_consumer("BACKEND", ConsumerConfig(filter_subject="backend.site-b.>"))
        heard: list[str] = []

        async def overheard(msg: object) -> None:
            heard.append(getattr(msg, "subject", ""))

        await site.nc.subscribe("_INBOX.>", cb=overheard)
        await site.nc.subscribe("backend.>", cb=overheard)
        await site.nc.publish("run.vision.r9.submit.requested", b"{}")
        await site.nc.flush()
        await hub.kv("platform")  # the hub's own requests and replies
        await hub.publish("backend.site-b.apply", b"{}", event_type="apply", ce_subject="r2", msg_id="site-b.2",
                          family="backend")
        await asyncio.sleep(1.0)
        assert heard == []
        assert await _stored(hub, "RUNS") == []
        assert {name: lease for name, (lease, _) in (await sites.leases(hub)).items()} == {
            "site-a": sites.SiteLease(1)}
        assert await _stored(site, sites.SITE_IN) == ["backend.site-a.apply"]
        assert await sitecapacity.reports(hub, ["site-a", "site-b"]) == {"site-a": own}
    finally:
        for bus in (hub, site):
            with contextlib.suppress(Exception):
                await bus.close()
        stop(site_proc, hub_proc)
