"""One site cannot read or write another site's traffic on the hub (many clusters, docs §13d). Each link's sourcing
delivers on a subject space of its cluster's own (``topology.site_delivery``: ``sitelink.<cluster>.in|out``), and
the hub lets each site's leaf user receive and send only its own (``permissions.leaf_permissions``). A site owns
its server, so a misbehaving ``site-b`` is played by a client on ``site-b``'s server: it listens to everything its
server gets (``>``) while ``site-a``'s request crosses; having overheard the name and delivery subject of the
consumer the hub's source made on ``site-a``'s ``SITE_OUT``, it makes a stream and a consumer of that name on its
own server, which delivers a forged report there. With the server's default deliveries (``$JS.S.<random>``, one
space for every link) ``site-b`` heard ``site-a``'s apply and report, and the hub stored the forgery as
``site-a``'s first report and skipped the genuine one. Now it hears nothing of ``site-a``'s and the hub stores
nothing of its forgery, while both sites' links and ``site-a``'s lease keep working (about 2 s here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ExternalStream,
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)

from taugrid.access import permissions
from taugrid.bus import connect, creds, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.core.errors import PermanentError
from taugrid.ports import free_port
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf
from tests.sitebus import stop

SITES = ("site-a", "site-b")


def event_id(msg: Msg | RawStreamMsg) -> str:
    """The id a reader takes: ``ce-id``, else ``Nats-Msg-Id`` (a service's event stores only that one, issue 27)."""
    return from_message(msg.subject or "", msg.headers, msg.data or b"").id


def _identity(root: Path, name: str) -> tuple[creds.Identity, Path]:
    identity = creds.new_identity(name)
    path = root / f"{name}.nk"
    creds.write(path, identity)
    return identity, path


async def _stored(bus: Bus, stream: str) -> list[tuple[str, str]]:
    """(subject, ce-id) of every message of ``stream``."""
    info = await bus.js.stream_info(stream)
    out = []
    for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
        msg = await bus.js.get_msg(stream, seq)
        out.append((msg.subject or "", event_id(msg)))
    return out


async def _until(bus: Bus, stream: str, want: list[tuple[str, str]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while await _stored(bus, stream) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream} holds {await _stored(bus, stream)}, not {want}")
        await asyncio.sleep(0.05)


async def _overheard_source(heard: list[Msg], cluster: str, timeout: float = 10.0) -> tuple[str, str]:
    """The name and delivery subject of the consumer the hub's source of ``cluster`` made on its ``SITE_OUT``, as
    the site's answer to the hub's request carries them (``$JSC.R.<random>``: every site's leaf user receives
    those answers, docs §16)."""
    deadline = time.monotonic() + timeout
    while True:
        for msg in heard:
            with contextlib.suppress(ValueError):
                got = json.loads(msg.data)
                if isinstance(got, dict) and (got.get("config") or {}).get("metadata", {}).get(
                        "_nats.src.stream") == sites.hub_stream(cluster):
                    return got["name"], got["config"]["deliver_subject"]
        if time.monotonic() > deadline:
            raise AssertionError(f"no answer naming {sites.hub_stream(cluster)}'s source was heard")
        await asyncio.sleep(0.05)


async def _report(site: Bus, cluster: str, n: int) -> None:
    await site.publish(f"k8s.{cluster}.Workload.ns.w{n}.modified", b"{}", event_type="modified",
                       ce_subject=f"r{n}", msg_id=f"{cluster}.w{n}", family="k8s")


async def test_a_site_neither_hears_nor_feeds_another_sites_link(tmp_path: Path) -> None:
    boot, boot_path = _identity(tmp_path, "bootstrap")
    local = {c: _identity(tmp_path, f"local_cluster-{c}") for c in SITES}  # each site's own (stack.sites)
    leaf_port = free_port()
    auth = tmp_path / "auth.conf"
    auth.write_text(permissions.authorization_conf(
        [permissions.Account("bootstrap", boot.public_key, permissions.bootstrap_permissions())],
        [permissions.LeafUser(c, f"pw-{c}", permissions.inbox_prefix(local[c][0].public_key)) for c in SITES]))
    hub_proc, hub_port = natsserver.start(tmp_path / "hub", log_file=tmp_path / "hub.log", auth_conf=auth,
                                          leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    procs, site_ports = [hub_proc], {}
    for c in SITES:
        proc, site_ports[c] = natsserver.start(
            tmp_path / c, log_file=tmp_path / f"{c}.log",
            leaf=Leaf(c, hub_url=f"nats-leaf://leaf-{c}:pw-{c}@127.0.0.1:{leaf_port}",
                      deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS))
        procs.append(proc)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="bootstrap", creds=boot_path)
    site = {c: await connect(f"nats://127.0.0.1:{site_ports[c]}", name="local-cluster", creds=local[c][1])
            for c in SITES}
    attacker = await connect(f"nats://127.0.0.1:{site_ports['site-b']}", name="attacker")
    try:
        heard: list[Msg] = []

        async def listen(msg: Msg) -> None:
            heard.append(msg)

        await attacker.nc.subscribe(">", cb=listen)  # everything site-b's server gets, from the hub or its own
        await attacker.nc.flush()
        await bootstrap(hub)
        for c in SITES:
            await sites.provision_feed(hub, c)
            await sites.provision_site(site[c], c)
            await sites.provision_hub(hub, c)
        # what site-b learns of site-a's link: the consumer the hub made on site-a's SITE_OUT, its name and where
        # it delivers to the hub, from site-a's answer to the hub's request
        name, deliver = await _overheard_source(heard, "site-a")
        # site-b makes a stream of its own holding a forged report and a consumer of that name delivering there:
        # its server sends what the hub's source of site-a takes for site-a's first report
        await attacker.js.add_stream(StreamConfig(name="FORGED", subjects=["forged.>"]))
        await attacker.publish("forged.w1", b'{"forged": true}', event_type="modified", ce_subject="r1",
                               msg_id="forgery.1", family="k8s")
        await attacker.js.add_consumer("FORGED", ConsumerConfig(
            name=name, deliver_subject=deliver, ack_policy=AckPolicy.NONE))
        # nor may it make the hub deliver there itself: a consumer on the hub's BACKEND (of its own requests, the
        # one filter a create subject of its own could name) with that name and subject; a site only resets the
        # durable the hub made to feed its SITE_IN (topology.site_in_durable)
        await attacker.nc.publish(f"$JS.hub.API.CONSUMER.CREATE.BACKEND.{name}.backend.site-b.>", json.dumps({
            "stream_name": "BACKEND", "config": {"name": name, "deliver_subject": deliver, "ack_policy": "none",
                                                 "filter_subject": "backend.site-b.>"}}).encode())
        await attacker.nc.flush()
        for c in SITES:
            await hub.publish(f"backend.{c}.apply", b"{}", event_type="apply", ce_subject="r1", msg_id=f"{c}.1",
                              family="backend")
            await _report(site[c], c, 1)
        # what the links are for still crosses, each site its own, and site-a's lease renews
        for c in SITES:
            await _until(site[c], sites.SITE_IN, [(f"backend.{c}.apply", f"{c}.1")])
            await _until(hub, sites.hub_stream(c), [(f"site.{c}.k8s.{c}.Workload.ns.w1.modified", f"{c}.w1")])
        assert (await sites.renew(site["site-a"], "site-a", 1)).fence is False
        await asyncio.sleep(0.5)  # what else could arrive has
        assert await _stored(hub, sites.hub_stream("site-a")) == [
            ("site.site-a.k8s.site-a.Workload.ns.w1.modified", "site-a.w1")]
        assert await _stored(site["site-a"], sites.SITE_IN) == [("backend.site-a.apply", "site-a.1")]
        assert sorted(c.name for c in await hub.js.consumers_info("BACKEND") if c.name.startswith(("JS_", "site"))) \
            == ["site-site-a-in", "site-site-b-in"]
        # nothing of site-a's crossed to site-b: none of its requests, deliveries or reports
        # (nor the hub's replies to its local cluster: its lease read and write above)
        inbox = permissions.inbox_prefix(local["site-a"][0].public_key)
        theirs = [(m.subject, event_id(m)) for m in heard if event_id(m).startswith("site-a.")
                  or m.subject.startswith(("backend.site-a", "k8s.site-a", inbox))]
        assert theirs == []
        # while site-b's own request reached its server (so the listener did listen)
        assert ("backend.site-b.apply", "site-b.1") in [(m.subject, event_id(m)) for m in heard]
    finally:
        for bus in (hub, attacker, *site.values()):
            with contextlib.suppress(Exception):
                await bus.close()
        stop(*procs)


async def test_a_hub_stream_made_with_the_shared_deliveries_is_refused_with_the_fix(private_bus: Bus) -> None:
    # as an earlier taugrid made it: the server's default deliveries, which every site's leaf user was let read
    await private_bus.js.add_stream(StreamConfig(
        name=sites.hub_stream("site-a"), retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
        max_age=7 * 86400.0, sources=[StreamSource(
            name=sites.SITE_OUT, external=ExternalStream(api=sites.api_prefix("site-a")),
            subject_transforms=[SubjectTransform(src=">", dest=sites.hub_subject("site-a"))])]))
    with pytest.raises(PermanentError, match=r"stream SITE_SITE_A exists with another configuration .* update its "
                                             r"source to deliver on sitelink\.site-a\.out with the break-glass"):
        await sites.provision_hub(private_bus, "site-a")


async def test_a_site_acts_only_on_requests_a_service_that_may_send_them_signed(tmp_path: Path) -> None:
    """trust.md rule 2 at a site: its local cluster checks each request in its ``SITE_IN`` against the hub's service
    keys copied to the site (``provision_site(service_keys=…)``), so a request on the hub's BACKEND that the
    dispatcher did not sign as it stands (here the bootstrap identity, which may publish anything on the hub,
    replays the dispatcher's apply with another body) is refused at the site, not applied (about 2 s here)."""
    boot, boot_path = _identity(tmp_path, "bootstrap")
    disp, disp_path = _identity(tmp_path, "dispatcher")
    local, local_path = _identity(tmp_path, "local_cluster")
    leaf_port = free_port()
    hub_auth, site_auth = tmp_path / "hub-auth.conf", tmp_path / "site-auth.conf"
    hub_auth.write_text(permissions.authorization_conf(
        [permissions.Account("bootstrap", boot.public_key, permissions.bootstrap_permissions()),
         permissions.Account("dispatcher", disp.public_key, permissions.service_permissions(
             permissions.SERVICE_ROLES["dispatcher"], disp.public_key))],
        [permissions.LeafUser("site-a", "pw-a", permissions.inbox_prefix(local.public_key))]))
    site_auth.write_text("authorization {\n  users = [\n" + "".join(
        f'    {{"nkey": "{key}"}}\n' for key in (boot.public_key, local.public_key)) + "  ]\n}\n")
    hub_proc, hub_port = natsserver.start(tmp_path / "hub", log_file=tmp_path / "hub.log", auth_conf=hub_auth,
                                          leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    site_proc, site_port = natsserver.start(
        tmp_path / "site-a", log_file=tmp_path / "site-a.log", auth_conf=site_auth,
        leaf=Leaf("site-a", hub_url=f"nats-leaf://leaf-site-a:pw-a@127.0.0.1:{leaf_port}",
                  deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS))
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="bootstrap", creds=boot_path)
    dispatcher = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher", creds=disp_path)
    site_boot = await connect(f"nats://127.0.0.1:{site_port}", name="bootstrap", creds=boot_path)
    site = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster", creds=local_path)
    handled: list[str] = []

    async def apply(event: Event) -> None:
        handled.append(event.id)

    loop = ConsumerLoop(site, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE, handler=apply, fetch_timeout=0.2)
    task: asyncio.Task[None] | None = None
    try:
        await bootstrap(hub)
        await sites.provision_hub(hub, "site-a")
        await sites.provision_site(site_boot, "site-a", service_keys={"dispatcher": disp.public_key})
        task = asyncio.create_task(loop.run())
        await dispatcher.publish("backend.site-a.apply", b'{"run": "r1"}', event_type="apply", ce_subject="r1",
                                 msg_id="r1.1.apply.site-a", family="backend")
        genuine = await hub.js.get_msg("BACKEND", 1)
        forged = dict(genuine.headers or {}, **{"Nats-Msg-Id": "r2.1.apply.site-a"})
        await hub.js.publish("backend.site-a.apply", b'{"run": "r2"}', headers=forged)
        deadline = time.monotonic() + 20
        while len(await _stored(site_boot, "DLQ")) < 1 or not handled:
            assert time.monotonic() < deadline, f"handled {handled}, DLQ {await _stored(site_boot, 'DLQ')}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the forged request is settled, never handled
        assert handled == ["r1.1.apply.site-a"]
        refused = await site_boot.js.get_msg("DLQ", 1)
        assert refused.subject == f"dlq.{sites.SITE_IN}.{SITE_LOCAL_DURABLE}"
        assert (refused.headers or {})["x-dlq-subject"] == "backend.site-a.apply"
        assert "claims dispatcher's key, but" in (refused.headers or {})["x-dlq-error"]
        assert refused.data == b'{"run": "r2"}'
    finally:
        loop.stopping.set()
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5)
        for bus in (hub, dispatcher, site_boot, site):
            with contextlib.suppress(Exception):
                await bus.close()
        stop(site_proc, hub_proc)


async def test_a_links_flow_control_crosses_under_the_leaf_permissions(tmp_path: Path) -> None:
    """The flow-control subjects a site's leaf user is let use are narrowed to its link's
    (``$JS.FC.BACKEND.site-<cluster>-in.>`` out, ``$JS.FC.SITE_OUT.>`` in): 5 MB each way, past the sourcing
    consumers' first flow-control window, still crosses whole (without any ``$JS.FC`` grant both sides stop at 8
    messages)."""
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
        await sites.provision_site(site, "site-a")
        await sites.provision_hub(hub, "site-a")
        body = b"x" * (256 << 10)
        for n in range(20):
            await hub.js.publish("backend.site-a.apply", body, headers={"Nats-Msg-Id": f"a{n}"})
            await site.js.publish(f"k8s.site-a.Workload.ns.w{n}.modified", body, headers={"Nats-Msg-Id": f"w{n}"})
        deadline = time.monotonic() + 20
        while True:
            held = ((await site.js.stream_info(sites.SITE_IN)).state.messages,
                    (await hub.js.stream_info(sites.hub_stream("site-a"))).state.messages)
            if held == (20, 20):
                break
            assert time.monotonic() < deadline, f"SITE_IN and the hub's stream hold {held}, not 20 each"
            await asyncio.sleep(0.1)
    finally:
        for bus in (hub, site):
            with contextlib.suppress(Exception):
                await bus.close()
        stop(site_proc, hub_proc)
