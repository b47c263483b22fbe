"""Losing a site on real servers (issue 28 item 4): a hub and two leaf sites, each running a simulated local cluster
as its site that renews its lease on the hub. The run is chosen at the preferred site; that site's server is cut;
once its lease has gone unrenewed past ``dispatch.worker_lost_timeout`` (2 s here) the hub declares it lost and
requeues the run on the other site, which runs it; the cut site comes back, is told to fence, stops its orphan
before rejoining under the hub's new generation."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from taugrid.bus import connect, kv, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.sites import SiteLease
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.config.platform import load_platform
from taugrid.core.errors import TauError
from taugrid.local.controller import LocalCluster
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.dispatcher.test_across_sites import stored, until
from tests.dispatcher.test_dispatcher import request, steps
from tests.dispatcher.test_site_reservations import run_request
from tests.platforms import lab_platform
from tests.sitebus import fixed, link, site_cluster, start_hub, start_site

SITES = ("site-a", "site-b")
PLATFORM = lab_platform(clusters=[{"name": "site-a", "backend": "local"},
                                  {"name": "site-b", "backend": "local", "preference": 1}],
                        dispatch={"mode": "Incremental", "incremental_step": 1, "worker_lost_timeout": 2})


async def _every(seconds: float, fn: Callable[[], Awaitable[None]], stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        with contextlib.suppress(TauError, OSError):  # a cut site's renewals fail until it is back
            await fn()
        await asyncio.sleep(seconds)


async def test_a_lost_sites_run_is_requeued_on_the_other_and_the_returning_site_stops_its_orphan(
        tmp_path: Path) -> None:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    procs["hub"], hub_port, leaf_port = start_hub(tmp_path)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    buses: dict[str, Bus] = {}
    ports: dict[str, int] = {}
    clusters: dict[str, LocalCluster] = {}
    stopping = asyncio.Event()
    loops: list[ConsumerLoop] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await bootstrap(hub)
        d = Dispatcher(hub, fixed(load_platform(PLATFORM)))
        for name in SITES:
            procs[name], ports[name] = start_site(tmp_path, name, leaf_port)
            buses[name] = await link(hub, ports[name], name)
            cluster = clusters[name] = await site_cluster(buses[name], tmp_path, name, PLATFORM)
            loops += [ConsumerLoop(buses[name], stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                   handler=cluster.on_backend, fetch_timeout=0.2),
                      ConsumerLoop(hub, stream=sites.hub_stream(name), durable=sites.DISPATCHER_DURABLE,
                                   handler=d.reports_of(name), fetch_timeout=0.2)]
            tasks += [asyncio.create_task(cluster.admission_loop(stopping)),
                      asyncio.create_task(_every(0.1, cluster.housekeep, stopping)),
                      asyncio.create_task(_every(0.3, cluster.lease_pass, stopping))]
        tasks += [asyncio.create_task(loop.run()) for loop in loops]
        tasks.append(asyncio.create_task(_every(0.3, d.leases_pass, stopping)))

        run = "lost-1"
        wl = f"{run}-a1"
        await request(hub, d, run_request(run, seconds=600.0))  # runs far longer than the test

        async def chosen_at(site: str) -> bool:
            rec, _ = await kv.load(hub, BUCKET, key(run, 1), DispatchRecord)
            return rec is not None and rec.chosen == site

        async def running_at(site: str) -> bool:
            got = clusters[site].wls.get(wl)
            return got is not None and got.state == "running"

        await until(lambda: chosen_at("site-a"))
        await until(lambda: running_at("site-a"))

        procs["site-a"].terminate()  # the site is cut: its server goes, its renewals fail
        procs["site-a"].wait(timeout=10)
        await until(lambda: chosen_at("site-b"))
        await until(lambda: running_at("site-b"))
        assert [v for v, _ in [(await sites.leases(hub))["site-a"]]] == [SiteLease(2, True)]
        assert [s[:2] for s in await steps(hub, run)] == [
            ("dispatch.nominated", ["site-a"]), ("dispatch.chosen", ["site-a"]), ("dispatch.withdrawn", ["site-a"]),
            ("dispatch.nominated", ["site-b"]), ("dispatch.chosen", ["site-b"])]
        assert [s[2] for s in await steps(hub, run)][2] == "site-a lost: no lease renewal for over 2s"
        # the orphan still runs at the cut site, which cannot know yet
        assert clusters["site-a"].wls[wl].state == "running"

        # the site comes back on its port and store: told to fence, it stops its orphan, then rejoins under 2
        procs["site-a"], _ = start_site(tmp_path, "site-a", leaf_port, port=ports["site-a"])

        async def orphan_stopped() -> bool:
            got = clusters["site-a"].wls.get(wl)
            return got is None or got.state in ("deleted", "finished")

        async def rejoined() -> bool:
            return (await sites.leases(hub))["site-a"][0] == SiteLease(2, False)

        await until(orphan_stopped)
        await until(rejoined)
        assert clusters["site-a"].lease_generation == 2
        assert await running_at("site-b")
        # one pod at each site, ever: the requeued run started once at site-b
        out_b = await stored(buses["site-b"], sites.SITE_OUT)
        assert out_b.count(f"k8s.site-b.pod.default.{wl}-pod.added") == 1
    finally:
        stopping.set()
        for loop in loops:
            loop.stopping.set()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)
        for cluster in clusters.values():
            await cluster.kubelet.close()
        await hub.close()
        for b in buses.values():
            await b.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=10)
