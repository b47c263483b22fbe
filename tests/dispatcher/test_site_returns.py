"""What a site does with a run whose choice the dispatcher reopens, on a real leaf server (issue 28 items 3, 4): a
workload it stopped (an orphan fenced after a loss, a withdrawn copy) may be reserved there again, since a
reservation starts nothing by itself; a reservation of one still stopping waits (redelivered); a chosen run it
preempts queues again as a reservation, and the dispatcher's apply of it, sent before the site's eviction reached
the dispatcher, does not start it. And a site whose lease renewal failed (its hub out of reach) admits nothing and
takes no request from its ``SITE_IN`` (the consumer's gate: tests/bus/test_lane_yield.py) until a renewal succeeds
(fencing first, had the hub declared it lost)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import connect, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendDelete
from taugrid.core.errors import TemporaryError
from taugrid.local.controller import LocalCluster
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf
from taugrid_services.dispatcher.handlers import preempted, preemption_gated
from tests.dispatcher.test_across_sites import until
from tests.dispatcher.test_site_preemption import PLATFORM, prioritised
from tests.dispatcher.test_site_reservations import PLATFORM as WIDE
from tests.dispatcher.test_site_reservations import run_request
from tests.sitebus import link, site_cluster, start_hub, start_site, stop


async def test_a_stopped_workload_may_be_reserved_again_and_a_preempted_one_waits_as_a_reservation(
        tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    procs.append(hub_proc)
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    stopping = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    site: Bus | None = None
    cluster: LocalCluster | None = None
    try:
        proc, port = start_site(tmp_path, "site-a", leaf_port)
        procs.append(proc)
        site = await link(hub, port, "site-a")
        cluster = await site_cluster(site, tmp_path, "site-a", PLATFORM)
        tasks.append(asyncio.create_task(cluster.admission_loop(stopping)))
        c = cluster

        def state(run: str) -> str:
            got = c.wls.get(f"{run}-a1")
            return got.state if got is not None else ("finished" if f"{run}-a1" in c.finished else "absent")

        async def is_(run: str, wanted: str) -> bool:
            await c.housekeep()
            return state(run) == wanted

        # chosen and running, then stopped (as a fenced orphan is): remembered as finished here
        lo = prioritised("ret-lo", "low")
        await c.apply(lo, hold=True)
        await until(lambda: is_("ret-lo", "reserved"))
        await c.apply(lo)
        await until(lambda: is_("ret-lo", "running"))
        gone = BackendDelete(run_id=lo.run_id, workspace=lo.workspace, attempt=1, kind="Job", namespace="default",
                             name="ret-lo-a1", reason="site-a was declared lost")
        async with c.lock:
            await c.delete(gone)
        assert state("ret-lo") == "deleted"
        with pytest.raises(TemporaryError, match="ret-lo-a1 is still stopping here"):
            await c.apply(lo, hold=True)
        await until(lambda: is_("ret-lo", "finished"))
        await c.apply(lo)  # a plain apply of a finished run stays a repeat, never run again
        assert state("ret-lo") == "finished"
        await c.apply(lo, hold=True)  # the dispatcher reserves it here again: accepted, nothing started
        await until(lambda: is_("ret-lo", "reserved"))
        assert c.wls["ret-lo-a1"].held and c.wls["ret-lo-a1"].pods == []
        await c.apply(lo)  # chosen again
        await until(lambda: is_("ret-lo", "running"))

        # a higher priority's reservation could preempt it (the lab queue has one CPU) but is gated: it waits
        hi = prioritised("ret-hi", "high")
        await c.apply(hi, hold=True)

        async def gated() -> bool:
            await c.housekeep()  # publishes the waiting run's reason
            return preemption_gated(c.wls["ret-hi-a1"].workload)  # as the dispatcher reads it

        await until(gated)
        assert state("ret-lo") == "running" and state("ret-hi") == "pending"
        # the dispatcher lets this cluster preempt (the same reservation, may_preempt): lo is preempted, and queues
        # again held, not to start unless chosen again
        await c.apply(msgspec.structs.replace(hi, may_preempt=True), hold=True)
        assert c.wls["ret-hi-a1"].preempt_granted
        await until(lambda: is_("ret-hi", "reserved"))
        await until(lambda: is_("ret-lo", "pending"))
        wl = c.wls["ret-lo-a1"]
        assert wl.held and wl.pods == [] and not wl.preempt_granted
        assert preempted(wl.workload).startswith("Preempted to accommodate a workload (ret-hi-a1)")
        await c.apply(lo)  # an apply sent before the dispatcher read the eviction: it stays held
        assert c.wls["ret-lo-a1"].held
        async with c.lock:  # withdrawn once another cluster wins: its quota never held, it may come back
            await c.delete(BackendDelete(run_id=lo.run_id, workspace=lo.workspace, attempt=1, kind="Job",
                                         namespace="default", name="ret-lo-a1", reason="site-b admitted it first"))
        assert state("ret-lo") == "absent"
    finally:
        stopping.set()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)
        if cluster is not None:
            await cluster.kubelet.close()
        await hub.close()
        if site is not None:
            await site.close()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def test_a_site_away_from_its_hub_admits_nothing_until_a_renewal_goes_through(tmp_path: Path) -> None:
    hub_proc, hub_port, leaf_port = start_hub(tmp_path)
    procs = {"hub": hub_proc}
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    stopping = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    site: Bus | None = None
    cluster: LocalCluster | None = None
    try:
        await bootstrap(hub)  # the hub's site_leases bucket
        procs["site-a"], port = start_site(tmp_path, "site-a", leaf_port)
        site = await link(hub, port, "site-a")
        c = cluster = await site_cluster(site, tmp_path, "site-a", WIDE)
        tasks.append(asyncio.create_task(c.admission_loop(stopping)))
        await c.lease_pass()
        assert c.lease_held.is_set()

        stop(procs["hub"])  # the hub goes: the next renewal fails
        with pytest.raises(TemporaryError):
            await c.lease_pass()
        assert not c.lease_held.is_set()
        held = run_request("away-1", seconds=60.0)
        await c.apply(held, hold=True)  # a request it had taken before: it waits, not admitted
        await c.tick()
        assert c.wls["away-1-a1"].state == "pending"

        # the hub is back on its port and store: the first renewal that goes through lets the site admit again
        procs["hub"], _ = start_hub_again(tmp_path, hub_port, leaf_port)

        async def renewed() -> bool:
            with contextlib.suppress(TemporaryError):
                await c.lease_pass()  # not declared lost: nothing to fence
            return c.lease_held.is_set()

        await until(renewed)

        async def reserved() -> bool:
            return c.wls["away-1-a1"].state == "reserved"

        await until(reserved)
    finally:
        stopping.set()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)
        if cluster is not None:
            await cluster.kubelet.close()
        with contextlib.suppress(Exception):
            await hub.close()
        if site is not None:
            await site.close()
        stop(*procs.values())


def start_hub_again(tmp_path: Path, port: int, leaf_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """The hub's server restarted on its client and leaf ports and its store."""
    return natsserver.start(tmp_path / "hub", port=port, log_file=tmp_path / "hub.log",
                            leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
