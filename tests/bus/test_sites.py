"""One bus across sites, on real nats-servers: a hub (the control plane's server, JetStream domain ``hub``) and a
leaf node with its own domain (the site ``site-a``). Requests for the site cross as the site's ``SITE_IN``
(sourced from the hub's BACKEND, only ``backend.site-a.>``); the site's reports cross as the hub's ``SITE_SITE_A``
(sourced from the site's ``SITE_OUT``, stamped ``site.site-a.`` by the hub). With the hub stopped the site keeps
storing its reports; when the hub comes back on its port and store, both sides catch up, every message once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.js.api import RawStreamMsg, StreamConfig

from taugrid.bus import connect, sites
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import from_message
from taugrid.ports import free_port
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf
from tests.sitebus import start_site, stop


def event_id(msg: RawStreamMsg) -> str:
    """The id a reader takes: ``ce-id``, else ``Nats-Msg-Id`` (a service's event stores only that one, issue 27)."""
    return from_message(msg.subject or "", msg.headers, msg.data or b"").id


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except Exception:  # noqa: BLE001 - a stream not yet made, a link still coming up
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.1)


async def subjects(bus: Bus, stream: str) -> list[tuple[str, str]]:
    """Every stored message of ``stream`` as (subject, event id), in stream order."""
    info = await bus.js.stream_info(stream)
    out = []
    for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
        msg = await bus.js.get_msg(stream, seq)
        out.append((msg.subject or "", event_id(msg)))
    return out


async def report(bus: Bus, n: int) -> None:
    await bus.publish(f"k8s.site-a.Workload.ns.w{n}.modified", b"{}", event_type="modified", ce_subject=f"r{n}",
                      msg_id=f"w{n}", family="k8s")


async def request(bus: Bus, cluster: str, n: int) -> None:
    await bus.publish(f"backend.{cluster}.apply", b"{}", event_type="apply", ce_subject=f"r{n}",
                      msg_id=f"{cluster}.{n}", family="backend")


async def test_a_site_keeps_working_while_cut_off_and_both_sides_catch_up_once(tmp_path: Path) -> None:
    hub_port, leaf_port = free_port(), free_port()
    hub_leaf = Leaf(sites.HUB_DOMAIN, listen_port=leaf_port)
    hub, _ = natsserver.start(tmp_path / "hub", port=hub_port, log_file=tmp_path / "hub.log", leaf=hub_leaf)
    site, site_port = start_site(tmp_path, "site-a", leaf_port)
    hub_bus = await connect(f"nats://127.0.0.1:{hub_port}", name="renderer")
    site_bus = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster")
    try:
        await hub_bus.js.add_stream(StreamConfig(name="BACKEND", subjects=["backend.>"]))
        await hub_bus.js.add_stream(StreamConfig(name="K8S", subjects=["k8s.>"]))  # the hub's own watch changes
        await sites.provision_hub(hub_bus, "site-a")
        await sites.provision_site(site_bus, "site-a")
        for n in (1, 2):
            await request(hub_bus, "site-a", n)
            await report(site_bus, n)
        await request(hub_bus, "site-b", 1)  # another cluster's request never reaches this site
        # a site owns its server: it may widen its own stream and write another cluster's name into a subject, but
        # the hub files whatever it sends under its own name
        out = (await site_bus.js.stream_info(sites.SITE_OUT)).config
        out.subjects = [*(out.subjects or []), "k8s.site-b.>"]
        await site_bus.js.update_stream(out)
        await site_bus.publish("k8s.site-b.Workload.ns.forged.modified", b"{}", event_type="modified",
                               ce_subject="r9", msg_id="forged", family="k8s")

        async def caught_up(ins: int, outs: int) -> bool:
            return (len(await subjects(site_bus, sites.SITE_IN)) == ins
                    and len(await subjects(hub_bus, sites.hub_stream("site-a"))) == outs)

        await until(lambda: caught_up(2, 3))

        stop(hub)  # the link is cut: the site goes on storing what its services report
        for n in (3, 4, 5):
            await report(site_bus, n)
        assert len(await subjects(site_bus, sites.SITE_OUT)) == 6

        hub, _ = natsserver.start(tmp_path / "hub", port=hub_port, log_file=tmp_path / "hub.log", leaf=hub_leaf)
        await request(hub_bus, "site-a", 3)  # the hub's client reconnects on its own
        # nats-server resumes the hub's source on its own retry schedule: about 40 s after the hub's restart here
        restarted = time.monotonic()
        await until(lambda: caught_up(3, 6), timeout=120)
        print(f"the hub caught up {time.monotonic() - restarted:.1f} s after its restart")
        await asyncio.sleep(1.0)  # and nothing more arrives: no message is stored twice
        assert await subjects(site_bus, sites.SITE_IN) == [
            ("backend.site-a.apply", "site-a.1"), ("backend.site-a.apply", "site-a.2"),
            ("backend.site-a.apply", "site-a.3")]
        reports = [(f"site.site-a.k8s.site-a.Workload.ns.w{n}.modified", f"w{n}") for n in range(1, 6)]
        forged = ("site.site-a.k8s.site-b.Workload.ns.forged.modified", "forged")
        assert await subjects(hub_bus, sites.hub_stream("site-a")) == [*reports[:2], forged, *reports[2:]]
        assert sites.origin(sites.hub_stream("site-a"), ["site-b", "site-a"]) == "site-a"
        # the site's reports reached the hub only through its stream: no plain publish crossed the link
        assert (await hub_bus.js.stream_info("K8S")).state.messages == 0
    finally:
        await hub_bus.close()
        await site_bus.close()
        stop(hub, site)
