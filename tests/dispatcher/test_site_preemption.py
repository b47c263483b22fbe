"""A site preempting a dispatched run, on real servers (issue 28 item 3): a hub and two leaf sites, each running a
simulated local cluster (one CPU of quota, preemption of lower priorities) as its site. A low-priority run is
chosen and running at the preferred site; a high-priority run nominated there preempts it. The site queues the
evicted run again as a reservation (it may not start there unless chosen again) and reports the eviction; the
dispatcher stops counting that admission and nominates the run again, as MultiKueue redoes the admission once the
admitting worker loses it (kueue#8302); the other site admits it first, runs it, and the preempting site's copy
is withdrawn."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from taugrid.bus import connect, kv, sites, streams
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.config.platform import load_platform
from taugrid.core.contracts import BackendApply
from taugrid.local.controller import LocalCluster
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.dispatcher.test_across_sites import stored, until
from tests.dispatcher.test_dispatcher import request, steps
from tests.dispatcher.test_site_reservations import run_request
from tests.platforms import FOUR_PRIORITIES, lab_platform
from tests.sitebus import fixed, link, site_cluster, start_hub, start_site

SITES = ("site-a", "site-b")


def _platform(dispatch: dict[str, object]) -> str:
    data = yaml.safe_load(lab_platform(
        quota={"cpu": "1", "memory": "16Gi"}, priority_classes=FOUR_PRIORITIES,
        clusters=[{"name": "site-a", "backend": "local"}, {"name": "site-b", "backend": "local", "preference": 1}],
        dispatch=dispatch))
    data["cluster_queues"][0]["preemption"] = {"within_cluster_queue": "LowerPriority"}
    return yaml.safe_dump(data)


PLATFORM = _platform({"mode": "Incremental", "incremental_step": 1})
ALL_AT_ONCE = _platform({"mode": "AllAtOnce"})


def prioritised(run: str, priority: str) -> BackendApply:
    req = run_request(run, seconds=600.0)  # runs far longer than the test
    job = copy.deepcopy(req.manifests[0])
    job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    return BackendApply(run_id=req.run_id, workspace=req.workspace, attempt=1, manifests=[job])


async def requests(site: Bus, run: str) -> list[str]:
    """The verbs of the requests for ``run`` in the site's ``SITE_IN``, in order."""
    first, last = await streams.bounds(site, sites.SITE_IN)
    found = []
    for seq in range(max(first, 1), last + 1):
        ev = await streams.at(site, sites.SITE_IN, seq)
        if ev is not None and ev.subject == run:
            found.append(ev.nats_subject.split(".")[2])
    return found


@dataclass
class TwoSites:
    hub: Bus
    dispatcher: Dispatcher
    buses: dict[str, Bus]
    clusters: dict[str, LocalCluster]


@contextlib.asynccontextmanager
async def two_sites(tmp_path: Path, platform_text: str) -> AsyncIterator[TwoSites]:
    """A hub and the two leaf sites, each running its simulated local cluster (admission loop, housekeeping every
    0.1 s, its SITE_IN consumer), and the dispatcher reading both sites' hub streams."""
    procs: list[subprocess.Popen[bytes]] = []
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    procs.append(hub_proc)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    buses: dict[str, Bus] = {}
    clusters: dict[str, LocalCluster] = {}
    stopping = asyncio.Event()
    loops: list[ConsumerLoop] = []
    tasks: list[asyncio.Task[None]] = []

    async def housekeeping(cluster: LocalCluster) -> None:
        while not stopping.is_set():
            await cluster.housekeep()
            await asyncio.sleep(0.1)

    try:
        await bootstrap(hub)
        d = Dispatcher(hub, fixed(load_platform(platform_text)))
        for name in SITES:
            proc, port = start_site(tmp_path, name, leaf_port)
            procs.append(proc)
            buses[name] = await link(hub, port, name)
            cluster = clusters[name] = await site_cluster(buses[name], tmp_path, name, platform_text)
            loops += [ConsumerLoop(buses[name], stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                   handler=cluster.on_backend, fetch_timeout=0.2),
                      ConsumerLoop(hub, stream=sites.hub_stream(name), durable=sites.DISPATCHER_DURABLE,
                                   handler=d.reports_of(name), fetch_timeout=0.2)]
            tasks += [asyncio.create_task(cluster.admission_loop(stopping)),
                      asyncio.create_task(housekeeping(cluster))]
        tasks += [asyncio.create_task(loop.run()) for loop in loops]
        yield TwoSites(hub, d, buses, clusters)
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
        for bus in buses.values():
            await bus.close()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def chosen_at(hub: Bus, run: str, site: str) -> bool:
    rec, _ = await kv.load(hub, BUCKET, key(run, 1), DispatchRecord)
    return rec is not None and rec.chosen == site


def running_at(cluster: LocalCluster, run: str) -> bool:
    got = cluster.wls.get(f"{run}-a1")
    return got is not None and got.state == "running"


async def test_a_run_preempted_at_its_site_is_nominated_again_and_runs_at_the_other(tmp_path: Path) -> None:
    async with two_sites(tmp_path, PLATFORM) as env:
        hub, d, buses, clusters = env.hub, env.dispatcher, env.buses, env.clusters
        lo, hi = "pre-lo", "pre-hi"
        a, b = clusters["site-a"], clusters["site-b"]

        async def lo_running_at_a() -> bool:
            return running_at(a, lo)

        await request(hub, d, prioritised(lo, "low"))
        await until(lambda: chosen_at(hub, lo, "site-a"))
        await until(lo_running_at_a)

        # nominated at site-a only: gated there, let preempt (the only cluster asking), it preempts lo
        await request(hub, d, prioritised(hi, "high"))

        async def settled() -> bool:
            return (running_at(a, hi) and running_at(b, lo) and f"{lo}-a1" not in a.wls
                    and await chosen_at(hub, lo, "site-b"))

        await until(settled)
        assert [s[:2] for s in await steps(hub, lo)] == [
            ("dispatch.nominated", ["site-a"]), ("dispatch.chosen", ["site-a"]),
            ("dispatch.nominated", ["site-a", "site-b"]), ("dispatch.chosen", ["site-b"]),
            ("dispatch.withdrawn", ["site-a"])]
        reason = (await steps(hub, lo))[2][2]
        assert reason.startswith("site-a preempted it (") and reason.endswith(
            "); Incremental: nominated site-a, site-b again"), reason
        assert [s[:2] for s in await steps(hub, hi)] == [
            ("dispatch.nominated", ["site-a"]), ("dispatch.granted", ["site-a"]), ("dispatch.chosen", ["site-a"])]
        # lo's one pod at site-a was taken down by the preemption and never started again there; one pod at b
        out_a, out_b = await stored(buses["site-a"], sites.SITE_OUT), await stored(buses["site-b"], sites.SITE_OUT)
        assert out_a.count(f"k8s.site-a.pod.default.{lo}-a1-pod.added") == 1
        assert out_b.count(f"k8s.site-b.pod.default.{lo}-a1-pod.added") == 1
        # site-a kept lo's copy as a reservation until it was withdrawn: its quota is hi's alone
        [queue] = a.admitter.snapshot(time.time())
        assert (queue["admitted"], queue["used"]["cpu"]) == (1, 1.0)
        # lo reserved, applied, reserved again (dropped: the site held it already), then withdrawn
        assert await requests(buses["site-a"], lo) == ["reserve", "apply", "reserve", "delete"]
        assert await requests(buses["site-a"], hi) == ["reserve", "reserve", "apply"]  # the second may preempt
        assert await requests(buses["site-b"], lo) == ["reserve", "apply"]


async def test_a_run_nominated_at_two_full_sites_preempts_at_one_only(tmp_path: Path) -> None:
    """MultiKueue's motivating case (KEP-8303): a high-priority run sent to every cluster at once, each full of
    lower-priority work, would preempt at all of them; gated, the first site that needs to preempt is let, the run
    is admitted there, and the other site's work runs on."""
    async with two_sites(tmp_path, ALL_AT_ONCE) as env:
        hub, d, clusters = env.hub, env.dispatcher, env.clusters
        lows = ("two-lo-1", "two-lo-2")
        for lo in lows:  # the first goes to one site, the second to the other (each has one CPU)
            await request(hub, d, prioritised(lo, "low"))

            async def running(run: str = lo) -> bool:
                return any(running_at(c, run) for c in clusters.values())

            await until(running)
        hi = "two-hi"
        await request(hub, d, prioritised(hi, "high"))

        async def hi_running() -> bool:
            return any(running_at(c, hi) for c in clusters.values())

        await until(hi_running)
        winner = next(n for n, c in clusters.items() if running_at(c, hi))
        other = next(n for n in SITES if n != winner)
        # exactly one eviction among the low runs: the winner's, whose run went back to nomination
        evicted = [lo for lo in lows if any(s[2].startswith(f"{winner} preempted it") for s in await steps(hub, lo))]
        [spared] = [lo for lo in lows if lo not in evicted]
        assert len(evicted) == 1 and not any("preempted it" in s[2] for s in await steps(hub, spared))
        assert running_at(clusters[other], spared)  # never preempted: the other site was never let
        hi_steps = [s[:2] for s in await steps(hub, hi)]
        assert hi_steps[:3] == [("dispatch.nominated", list(SITES)), ("dispatch.granted", [winner]),
                                ("dispatch.chosen", [winner])]
        assert [s for s in hi_steps if s[0] == "dispatch.granted"] == [("dispatch.granted", [winner])]
