"""Dispatch across real sites: a hub (bootstrapped, the dispatcher's bus) and two leaf nodes with their own
JetStream domains. The dispatcher's copies reach each site only as its ``SITE_IN`` (its own requests, nothing of
the other's); a site's admission reaches the hub only through its ``SITE_<CLUSTER>`` stream, which the dispatcher
reads with a loop per cluster; the first site to admit wins and the other's copy is withdrawn across its link."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from taugrid.bus import connect, kv, sites, streams
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.config.platform import load_platform
from taugrid.core.contracts import WatchEvent
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.dispatcher.test_dispatcher import admitted, apply_for, request, steps
from tests.platforms import lab_platform
from tests.sitebus import fixed, link, start_hub, start_site

SITES = ("site-a", "site-b")


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def stored(bus: Bus, stream: str) -> list[str]:
    first, last = await streams.bounds(bus, stream)
    found: list[str] = []
    for seq in range(max(first, 1), last + 1):
        ev = await streams.at(bus, stream, seq)
        if ev is not None:
            found.append(ev.nats_subject)
    return found


async def report(site: Bus, cluster: str, run: str) -> None:
    change = admitted(run)
    await site.publish(f"k8s.{cluster}.Workload.default.job-{run}-a1.modified",
                       WatchEvent(type=change.type, object=change.object, cluster=cluster), event_type="modified",
                       ce_subject=run, msg_id=f"{cluster}.{run}.admitted", family="k8s")


async def test_the_first_site_to_admit_wins_and_the_other_copy_is_withdrawn_across_its_link(tmp_path: Path) -> None:
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    procs = [hub_proc]
    site_buses: dict[str, Bus] = {}
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    loops: list[ConsumerLoop] = []
    try:
        await bootstrap(hub)
        for name in SITES:
            proc, port = start_site(tmp_path, name, leaf_port)
            procs.append(proc)
            site_buses[name] = await link(hub, port, name)
        d = Dispatcher(hub, fixed(load_platform(lab_platform(clusters=[{"name": n, "backend": "local"}
                                                                       for n in SITES]))))
        loops = [ConsumerLoop(hub, stream=sites.hub_stream(n), durable=sites.DISPATCHER_DURABLE,
                              handler=d.reports_of(n), fetch_timeout=0.2) for n in SITES]
        tasks = [asyncio.create_task(loop.run()) for loop in loops]

        run = "across-1"
        await request(hub, d, apply_for(run))

        async def copies_arrived() -> bool:
            got = [await stored(site_buses[n], sites.SITE_IN) for n in SITES]
            return got == [[f"backend.{n}.reserve"] for n in SITES]

        await until(copies_arrived)

        await report(site_buses["site-b"], "site-b", run)

        async def chosen() -> str:
            rec, _ = await kv.load(hub, BUCKET, key(run, 1), DispatchRecord)
            return rec.chosen if rec is not None else ""

        async def b_won() -> bool:
            return await chosen() == "site-b"

        await until(b_won)
        await report(site_buses["site-a"], "site-a", run)  # too late: its copy is taken back, once

        async def withdrawn() -> bool:
            return await stored(site_buses["site-a"], sites.SITE_IN) == ["backend.site-a.reserve",
                                                                         "backend.site-a.delete"]

        await until(withdrawn)
        # the chosen site's object changes reach the hub's K8S for the admission watcher; the loser's never do
        for name in SITES:
            pod = {"kind": "Pod", "metadata": {"name": f"{run}-a1-0", "namespace": "default", "labels": {
                "taugrid.io/run-id": run, "taugrid.io/attempt": "1"}}, "status": {"phase": "Running"}}
            await site_buses[name].publish(f"k8s.{name}.pod.default.{run}-a1-0.modified",
                                           WatchEvent(type="MODIFIED", object=pod, cluster="forged"),
                                           event_type="pod.modified", ce_subject=run, msg_id=f"{name}.pod",
                                           family="k8s")
        await until(lambda: _settled(hub))
        assert await stored(hub, "K8S") == [
            f"k8s.site-b.workload.default.job-{run}-a1.modified", f"k8s.site-b.pod.default.{run}-a1-0.modified"]
        mirrored = await streams.last(hub, "K8S", f"k8s.site-b.pod.default.{run}-a1-0.modified")
        assert mirrored is not None and mirrored.payload(WatchEvent).cluster == "site-b"
        # the winner alone is asked to run it, after its reservation; the loser never is
        assert await stored(site_buses["site-b"], sites.SITE_IN) == ["backend.site-b.reserve", "backend.site-b.apply"]
        assert [s[:2] for s in await steps(hub, run)] == [
            ("dispatch.nominated", ["site-a", "site-b"]), ("dispatch.chosen", ["site-b"]),
            ("dispatch.withdrawn", ["site-a"])]
        for loop in loops:
            loop.stopping.set()
        await asyncio.gather(*tasks)
    finally:
        for loop in loops:
            loop.stopping.set()
        await hub.close()
        for b in site_buses.values():
            await b.close()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def _settled(hub: Bus) -> bool:
    """Both sites' reports handled: the dispatcher's durables have nothing pending or unacknowledged."""
    for name in SITES:
        info = await hub.js.consumer_info(sites.hub_stream(name), sites.DISPATCHER_DURABLE)
        if info.num_pending or info.num_ack_pending or not info.delivered.stream_seq:
            return False
    return True
