"""BACKEND is an interest-retention stream (issue 27), on real nats-servers: a request is dropped once its reader
acked it (the local cluster's lane, the dispatcher, a site's feed), a request for a site whose link is down waits
on the hub until the site is back and is delivered to it once, and a BACKEND an earlier release made with limits
retention is reported by the bootstrap and switched by ``--update``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from taugrid.bus import Bus, connect, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.local.backend import LocalBackend
from tests.owners import acting_as
from tests.sitebus import link, start_hub, start_site, stop


async def held(bus: Bus, stream: str = "BACKEND") -> list[tuple[str, str]]:
    """(subject, message id) of every message ``stream`` holds, in stream order."""
    info = await bus.js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg(stream, seq)
        except Exception:  # noqa: BLE001 - a sequence already removed: a gap
            continue
        out.append((str(msg.subject), (msg.headers or {}).get("Nats-Msg-Id", "")))
    assert len(out) == info.state.messages
    return out


async def take(bus: Bus, durable: str, count: int) -> list[Any]:
    """Fetch ``count`` messages from ``durable`` (bound, as the local cluster's ConsumerLoop binds)."""
    psub = await bus.js.pull_subscribe_bind(durable, stream="BACKEND")
    try:
        msgs = await psub.fetch(count, timeout=5)
    finally:
        await psub.unsubscribe()
    assert len(msgs) == count
    return msgs


def apply_for(run: str, lane: str = "") -> BackendApply:
    return BackendApply(run_id=run, workspace="ws", attempt=1, manifests=[{"kind": "Job"}], lane=lane)


async def test_a_run_s_requests_leave_backend_once_the_local_cluster_acked_them(private_bus: Bus) -> None:
    assert await bootstrap(private_bus, replicas=1) == []
    assert (await private_bus.js.stream_info("BACKEND")).config.retention == RetentionPolicy.INTEREST
    assert sorted(c.name for c in await private_bus.js.consumers_info("BACKEND")) == [
        "dispatcher", "local-cluster", "local-cluster-high"]

    backend = LocalBackend(private_bus)  # the renderer's, TAU_CLUSTER unset
    with acting_as(private_bus, "renderer"):
        await backend.apply(apply_for("r1"))
        await backend.apply(apply_for("r2", lane="high"))
        await backend.delete(BackendDelete(run_id="r1", workspace="ws", attempt=1, kind="Job",
                                           namespace="default", name="r1-a1"))
        # a cluster nothing reads (no feed, no lane): no durable's filter matches, so it is not stored at all
        nowhere = await private_bus.publish("backend.nowhere.apply", apply_for("r3"), event_type="apply",
                                            ce_subject="r3", msg_id="r3.1.apply", workspace="ws", family="backend")
    assert nowhere == 4
    assert await held(private_bus) == [("backend.local.apply", "r1.1.apply"),
                                       ("backend.local.apply.high", "r2.1.apply"),
                                       ("backend.local.delete", "r1.1.delete")]

    for m in await take(private_bus, "local-cluster-high", 1):
        await m.ack_sync()
    apply, delete = await take(private_bus, "local-cluster", 2)
    await apply.ack_sync()
    assert await held(private_bus) == [("backend.local.delete", "r1.1.delete")]  # delivered, not acked yet
    await delete.ack_sync()
    assert (await private_bus.js.stream_info("BACKEND")).state.messages == 0
    # the renderer's redelivered apply is still dropped as a repeat, though the first left the stream
    with acting_as(private_bus, "renderer"):
        await backend.apply(apply_for("r1"))
    assert (await private_bus.js.stream_info("BACKEND")).state.messages == 0


async def wait_for(check: Any, timeout: float = 40.0) -> None:
    """Poll ``check`` (async, truthy when done) until it holds; the link's catching up is the server's own."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.2)


async def test_a_request_for_a_site_whose_link_is_down_waits_on_the_hub_and_is_delivered_once(
        tmp_path: Path) -> None:
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    site_proc, site_port = start_site(tmp_path, "site-a", leaf_port)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    site: Bus | None = None
    try:
        assert await bootstrap(hub, replicas=1) == []
        site = await link(hub, site_port, "site-a")
        assert await sites.feed_exists(hub, "site-a") and not await sites.feed_exists(hub, "site-b")

        async def reserve(run: str) -> None:
            with acting_as(hub, "dispatcher"):
                await hub.publish("backend.site-a.reserve", apply_for(run), event_type="reserve", ce_subject=run,
                                  msg_id=f"{run}.1.reserve.site-a", workspace="ws", family="backend")

        async def at_site(bus: Bus, n: int) -> bool:
            try:
                return (await bus.js.stream_info(sites.SITE_IN)).state.messages >= n
            except Exception:  # noqa: BLE001 - the site's server not answering yet
                return False

        await reserve("r1")
        # the site's SITE_IN stored it and its source's flow-control reply acked it on the hub: BACKEND lets it go
        await wait_for(lambda: at_site(site, 1))
        await wait_for(lambda: _empty(hub))

        await site.close()
        stop(site_proc)
        await reserve("r2")
        assert await held(hub) == [("backend.site-a.reserve", "r2.1.reserve.site-a")]  # nobody acked it: it waits

        site_proc, _ = start_site(tmp_path, "site-a", leaf_port, port=site_port)
        site = await connect(f"nats://127.0.0.1:{site_port}", name="local-cluster")
        await wait_for(lambda: at_site(site, 2))
        await wait_for(lambda: _empty(hub))
        assert await held(site, sites.SITE_IN) == [("backend.site-a.reserve", "r1.1.reserve.site-a"),
                                                   ("backend.site-a.reserve", "r2.1.reserve.site-a")]
    finally:
        if site is not None:
            await site.close()
        await hub.close()
        stop(site_proc, hub_proc)


async def _empty(bus: Bus) -> bool:
    return (await bus.js.stream_info("BACKEND")).state.messages == 0


async def test_an_earlier_release_s_limits_backend_is_reported_and_switched_by_update(
        private_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    # what an earlier release made on a hub: BACKEND with limits retention, the local cluster's and the
    # dispatcher's durables on it, and a site's feed (its site down: nothing delivered)
    await private_bus.js.add_stream(StreamConfig(name="BACKEND", subjects=["backend.>"], max_age=7 * 86400.0,
                                                 duplicate_window=600.0))
    for durable, subject in (("local-cluster", "backend.local.*"), ("local-cluster-high", "backend.local.*.high"),
                             ("dispatcher", "backend.dispatch.>")):
        await private_bus.js.add_consumer("BACKEND", ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, filter_subject=subject, max_deliver=20))
    await sites.provision_feed(private_bus, "site-a")
    for subject, msg_id in (("backend.local.apply", "r1"), ("backend.local.apply", "r2"),
                            ("backend.site-a.reserve", "r3"), ("backend.gone.apply", "r4")):
        await private_bus.js.publish(subject, b"{}", headers={"Nats-Msg-Id": msg_id})
    [first] = await take(private_bus, "local-cluster", 1)
    await first.ack_sync()  # the second is not handled yet
    assert len(await held(private_bus)) == 4  # limits retention: acked or not, all kept

    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream BACKEND: retention is 'limits', declared 'interest'; not changed" in caplog.text
    assert (await private_bus.js.stream_info("BACKEND")).config.retention == RetentionPolicy.LIMITS

    assert await bootstrap(private_bus, update=True, replicas=1) == []
    assert (await private_bus.js.stream_info("BACKEND")).config.retention == RetentionPolicy.INTEREST
    # the switch dropped what was acked; the pending one and the site's stay, and so does the one no durable
    # reads (the server drops only what every interested durable acked): it ages out as under limits
    assert await held(private_bus) == [("backend.local.apply", "r2"), ("backend.site-a.reserve", "r3"),
                                       ("backend.gone.apply", "r4")]
    [second] = await take(private_bus, "local-cluster", 1)
    await second.ack_sync()
    assert await held(private_bus) == [("backend.site-a.reserve", "r3"), ("backend.gone.apply", "r4")]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream BACKEND" not in caplog.text
