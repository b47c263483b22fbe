"""The site side of dispatch on real servers: a hub (bootstrapped, the dispatcher's bus) and two leaf nodes, each
running a local cluster as its site (``TAU_SITE``, named by ``TAU_CLUSTER``, simulated pods) that reads the
dispatcher's requests from its own ``SITE_IN``. Both sites admit the reservation (quota taken, no pod), the first
admission reported through a ``SITE_OUT`` wins, the winner alone starts the run, once, and the other site drops
its withdrawn reservation and gets its quota back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

from taugrid.bus import connect, kv, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.config.platform import load_platform
from taugrid.core.contracts import BackendApply
from taugrid.core.errors import ConfigError
from taugrid.local.controller import LocalCluster
from taugrid.settings import Settings
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.dispatcher.test_across_sites import stored, until
from tests.dispatcher.test_dispatcher import request, steps
from tests.platforms import lab_platform
from tests.sitebus import fixed, link, site_cluster, start_hub, start_site

SITES = ("site-a", "site-b")
PLATFORM = lab_platform(clusters=[{"name": n, "backend": "local"} for n in SITES])


def run_request(run: str, seconds: float) -> BackendApply:
    container = {"name": "main", "image": "python:3.11-slim", "command": ["true"],
                 "env": [{"name": "SIMULATED_DURATION", "value": str(seconds)}],
                 "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{run}-a1", "namespace": "default",
                        "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": run,
                                   "taugrid.io/workspace": "default", "taugrid.io/attempt": "1"}},
           "spec": {"suspend": True, "backoffLimit": 0, "completions": 1, "parallelism": 1,
                    "template": {"metadata": {"labels": {}},
                                 "spec": {"restartPolicy": "Never", "containers": [container]}}}}
    return BackendApply(run_id=run, workspace="default", attempt=1, manifests=[job])


async def _housekeeping(cluster: LocalCluster, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        await cluster.housekeep()
        await asyncio.sleep(0.1)


def test_a_site_needs_its_cluster_name(tmp_path: Path) -> None:
    for cluster in ("", "dispatch", "Site_A"):
        with pytest.raises(ConfigError, match="TAU_SITE is on but TAU_CLUSTER is"):
            LocalCluster(None, data_dir=tmp_path, node="n", capacity={"cpu": 1.0}, gpu_count=0,  # type: ignore[arg-type]
                         given=Settings.from_env({"TAU_SITE": "on", "TAU_CLUSTER": cluster}))


async def test_both_sites_reserve_the_winner_alone_runs_it_once_and_the_loser_frees_its_quota(tmp_path: Path) -> None:
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    procs = [hub_proc]
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    buses: dict[str, Bus] = {}
    clusters: dict[str, LocalCluster] = {}
    stopping = asyncio.Event()
    loops: list[ConsumerLoop] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        await bootstrap(hub)
        d = Dispatcher(hub, fixed(load_platform(PLATFORM)))
        for name in SITES:
            proc, port = start_site(tmp_path, name, leaf_port)
            procs.append(proc)
            buses[name] = await link(hub, port, name)
            cluster = clusters[name] = await site_cluster(buses[name], tmp_path, name, PLATFORM)
            loops.append(ConsumerLoop(buses[name], stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                      handler=cluster.on_backend, fetch_timeout=0.2))
            tasks += [asyncio.create_task(cluster.admission_loop(stopping)),
                      asyncio.create_task(_housekeeping(cluster, stopping))]
        tasks += [asyncio.create_task(loop.run()) for loop in loops]

        run = "reserved-1"
        wl = f"{run}-a1"
        await request(hub, d, run_request(run, seconds=1.0))

        async def both_reserved() -> bool:
            return all(c.wls.get(wl) is not None and c.wls[wl].state == "reserved" for c in clusters.values())

        # the dispatcher reads the sites' reports only once both reserved it (they wait in each site's stream)
        await until(both_reserved)
        for cluster in clusters.values():  # quota taken, no pod
            [queue] = cluster.admitter.snapshot(time.time())
            assert (queue["admitted"], queue["used"]["cpu"], cluster.wls[wl].pods) == (1, 1.0, [])
        hub_loops = [ConsumerLoop(hub, stream=sites.hub_stream(n), durable=sites.DISPATCHER_DURABLE,
                                  handler=d.reports_of(n), fetch_timeout=0.2) for n in SITES]
        loops += hub_loops
        tasks += [asyncio.create_task(loop.run()) for loop in hub_loops]

        async def chosen() -> str:
            rec, _ = await kv.load(hub, BUCKET, key(run, 1), DispatchRecord)
            return rec.chosen if rec is not None else ""

        await until(lambda: _truthy(chosen()))
        winner = await chosen()
        loser = next(n for n in SITES if n != winner)
        winner_cluster, loser_cluster = clusters[winner], clusters[loser]

        async def loser_dropped_it() -> bool:  # gone, and not remembered as done: it may be reserved again
            return wl not in loser_cluster.wls and wl not in loser_cluster.finished

        async def winner_finished() -> bool:
            return wl not in winner_cluster.wls and wl in winner_cluster.finished

        await until(loser_dropped_it)
        await until(winner_finished)
        # both sites reserved it first (their admission reported through SITE_OUT), before any pod existed
        for name in SITES:
            out = await stored(buses[name], sites.SITE_OUT)
            first_pod = next((i for i, s in enumerate(out) if ".pod." in s), len(out))
            assert f"k8s.{name}.workload.default.job-{wl}.modified" in out[:first_pod]
        # the winner was asked to run it after its reservation and started it exactly once; the loser never ran it
        assert await stored(buses[winner], sites.SITE_IN) == [f"backend.{winner}.reserve", f"backend.{winner}.apply"]
        winner_out = await stored(buses[winner], sites.SITE_OUT)
        assert winner_out.count(f"k8s.{winner}.pod.default.{wl}-pod.added") == 1
        assert await stored(buses[loser], sites.SITE_IN) == [f"backend.{loser}.reserve", f"backend.{loser}.delete"]
        assert [s for s in await stored(buses[loser], sites.SITE_OUT) if ".pod." in s] == []
        # the loser's quota is free again: nothing admitted, nothing used (the winner's too, once its run ended)
        for cluster in (loser_cluster, winner_cluster):
            [queue] = cluster.admitter.snapshot(time.time())
            assert (queue["admitted"], queue["used"]) == (0, {})
        assert [s[:2] for s in await steps(hub, run)] == [
            ("dispatch.nominated", list(SITES)), ("dispatch.chosen", [winner]), ("dispatch.withdrawn", [loser])]
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
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def _truthy(value: Awaitable[str]) -> bool:
    return bool(await value)


