"""A run's choice reopened on a real nats-server (issue 28 items 3, 4): the chosen cluster preempting the run sends
it back to nomination, as MultiKueue redoes the admission once the admitting worker loses it (kueue#8302); and a
run requeued while every other cluster was lost is nominated again at the first lost cluster that rejoins.
Reports are handed in as the cluster's hub stream passes them on; leases are written into the hub's bucket as a
site's renewals and the dispatcher's declarations would leave them, timed by a clock the test moves."""

from __future__ import annotations

import itertools
from typing import Any

import yaml

from taugrid.bus import kv, sites, streams
from taugrid.bus.connection import Bus
from taugrid.bus.sites import SiteLease
from taugrid.config.platform import Platform, load_platform
from taugrid.core.contracts import BackendApply, WatchEvent
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.dispatcher.test_dispatcher import admitted, apply_for, request, steps
from tests.platforms import lab_platform
from tests.sitebus import fed

RUNS = itertools.count(1)


def platform(names: tuple[str, str, str], dispatch: dict[str, Any]) -> Platform:
    """``names[0]`` preferred, ``names[1]`` spill-over, ``names[2]`` serving only another queue (its renewals keep
    the hub from suspecting itself when the other two fall silent)."""
    a, b, c = names
    clusters = [{"name": a, "backend": "local"}, {"name": b, "backend": "local", "preference": 1},
                {"name": c, "backend": "local", "cluster_queues": ["gpu"]}]
    data = yaml.safe_load(lab_platform(clusters=clusters, dispatch=dispatch))
    data["cluster_queues"].append({"name": "gpu", "resource_groups": [{"covered_resources": ["cpu"], "flavors": [
        {"name": "default", "resources": [{"name": "cpu", "nominal_quota": 8}]}]}]})
    return load_platform(yaml.safe_dump(data))


def preempted(run: str, version: int) -> WatchEvent:
    """The run's Workload as a site's engine leaves it after preempting it (local/objects.evict)."""
    return WatchEvent(type="MODIFIED", cluster="ignored", object={
        "kind": "Workload", "metadata": {"name": f"job-{run}-a1", "namespace": "default",
                                          "resourceVersion": str(version),
                                          "labels": {"taugrid.io/run-id": run, "taugrid.io/attempt": "1"}},
        "status": {"conditions": [
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a "
             "workload (UID: hi-a1) due to prioritization in the ClusterQueue"},
            {"type": "QuotaReserved", "status": "False", "reason": "Pending"}]}})


def admitted_at(run: str, version: int) -> WatchEvent:
    ev = admitted(run)
    ev.object["metadata"]["resourceVersion"] = str(version)
    return ev


async def record(bus: Bus, run: str) -> DispatchRecord:
    rec, _ = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None
    return rec


async def ids(bus: Bus, run: str, cluster: str) -> list[str]:
    """The ids of the requests ``cluster`` was sent for ``run``, in order."""
    out = []
    first, last = await streams.bounds(bus, "BACKEND")
    for seq in range(first, last + 1):
        ev = await streams.at(bus, "BACKEND", seq)
        if ev is not None and ev.subject == run and ev.nats_subject.startswith(f"backend.{cluster}."):
            out.append(ev.id)
    return out


async def test_the_chosen_cluster_preempting_the_run_sends_it_back_to_nomination(bus: Bus) -> None:
    run = f"preempted-{next(RUNS)}"
    a, b = "pre-a", "pre-b"
    d = Dispatcher(bus, await fed(bus, platform((a, b, "pre-c"), {"mode": "AllAtOnce"})))
    await request(bus, d, apply_for(run))
    await d.on_report(a, admitted_at(run, 4))
    assert (await record(bus, run)).chosen_version == 4
    await d.on_report(b, preempted(run, 9))  # a copy that was never chosen: it counted for nothing
    await d.on_report(a, preempted(run, 3))  # older than the admission that won (a redelivery): nothing reopens
    assert (await record(bus, run)).chosen == a

    await d.on_report(a, preempted(run, 6))
    rec = await record(bus, run)
    assert (rec.chosen, rec.nominated, rec.requeues, rec.announced) == ("", [a, b], 1, False)
    await d.on_report(a, preempted(run, 6))  # the same report again: the choice is open already
    assert (await record(bus, run)).requeues == 1
    await d.on_report(b, admitted_at(run, 12))  # the other cluster admits first this time
    rec = await record(bus, run)
    assert (rec.chosen, rec.chosen_version) == (b, 12)
    # a keeps its copy queued as a reservation, is sent it again under a new id (its site drops it: it holds it),
    # and has it withdrawn once b won; b's first copy was withdrawn, then reserved again, then applied
    assert await ids(bus, run, a) == [f"{run}.1.reserve.{a}", f"{run}.1.apply.{a}", f"{run}.1.reserve.{a}.r1",
                                      f"{run}.1.delete.{a}.r1"]
    assert await ids(bus, run, b) == [f"{run}.1.reserve.{b}", f"{run}.1.delete.{b}", f"{run}.1.reserve.{b}.r1",
                                      f"{run}.1.apply.{b}.r1"]
    message = ("Preempted to accommodate a workload (UID: hi-a1) due to prioritization in the ClusterQueue")
    assert await steps(bus, run) == [
        ("dispatch.nominated", [a, b], f"AllAtOnce: nominated {a}, {b}"),
        ("dispatch.chosen", [a], f"{a} admitted it first"),
        ("dispatch.withdrawn", [b], f"{a} admitted it first"),
        ("dispatch.nominated", [a, b], f"{a} preempted it ({message}); AllAtOnce: nominated {a}, {b} again"),
        ("dispatch.chosen", [b], f"{b} admitted it first"),
        ("dispatch.withdrawn", [a], f"{b} admitted it first"),
    ]


async def test_a_preempted_incremental_run_keeps_its_cluster_and_adds_the_next_step(bus: Bus) -> None:
    run = f"preempted-{next(RUNS)}"
    a, b = "inc-a", "inc-b"
    d = Dispatcher(bus, await fed(bus, platform((a, b, "inc-c"), {"mode": "Incremental", "incremental_step": 1})))
    await request(bus, d, apply_for(run))
    await d.on_report(a, admitted_at(run, 2))
    await d.on_report(a, preempted(run, 3))
    rec = await record(bus, run)
    assert (rec.chosen, rec.nominated) == ("", [a, b])  # a stays nominated, b is the next step
    assert (await steps(bus, run))[-1][1:] == ([a, b], f"{a} preempted it (Preempted to accommodate a workload "
                                                       "(UID: hi-a1) due to prioritization in the ClusterQueue); "
                                                       f"Incremental: nominated {a}, {b} again")


async def test_a_run_left_with_every_cluster_lost_is_nominated_at_the_first_that_rejoins(bus: Bus) -> None:
    run = f"rejoin-{next(RUNS)}"
    a, b, c = "rj-a", "rj-b", "rj-c"
    now = [1000.0]
    d = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce", "worker_lost_timeout": "10s"})),
                   clock=lambda: now[0])

    async def renew(*names: str, generation: int = 1) -> None:
        for name in names:
            await kv.put(bus, sites.LEASES, name, SiteLease(generation, False))

    await renew(a, b, c)
    await d.leases_pass()
    await request(bus, d, apply_for(run))
    await d.on_report(a, admitted(run))
    assert (await record(bus, run)).chosen == a

    now[0] += 11  # a falls silent past the timeout; b and c renew
    await renew(b, c)
    await d.leases_pass()
    rec = await record(bus, run)
    assert (rec.chosen, rec.lost, rec.nominated) == ("", [a], [b])
    await d.on_report(b, admitted(run))

    now[0] += 11  # now b falls silent too while a is still away: nobody is left to nominate
    await renew(c)
    await d.leases_pass()
    rec = await record(bus, run)
    assert (rec.chosen, rec.lost, rec.nominated) == ("", [a, b], [])
    now[0] += 1
    await d.leases_pass()  # still lost: nothing moves
    assert (await record(bus, run)).nominated == []

    await renew(a, generation=2)  # a fenced its orphan and rejoined under the hub's generation
    now[0] += 1
    await d.leases_pass()
    rec = await record(bus, run)
    assert (rec.chosen, rec.lost, rec.nominated, rec.requeues) == ("", [b], [a], 3)
    await d.on_report(a, admitted(run))
    assert (await record(bus, run)).chosen == a
    assert await ids(bus, run, a) == [f"{run}.1.reserve.{a}", f"{run}.1.apply.{a}", f"{run}.1.delete.{a}.r1",
                                      f"{run}.1.reserve.{a}.r3", f"{run}.1.apply.{a}.r3"]
    assert await steps(bus, run) == [
        ("dispatch.nominated", [a, b], f"AllAtOnce: nominated {a}, {b}"),
        ("dispatch.chosen", [a], f"{a} admitted it first"),
        ("dispatch.withdrawn", [b], f"{a} admitted it first"),
        ("dispatch.withdrawn", [a], f"{a} lost: no lease renewal for over 10s"),
        ("dispatch.nominated", [b], f"AllAtOnce: nominated {b}"),
        ("dispatch.chosen", [b], f"{b} admitted it first"),
        ("dispatch.withdrawn", [b], f"{b} lost: no lease renewal for over 10s"),
        ("dispatch.nominated", [], f"no cluster to nominate: {a}, {b} lost; it waits for one to rejoin"),
        ("dispatch.nominated", [a], f"{a} rejoined; AllAtOnce: nominated {a}"),
        ("dispatch.chosen", [a], f"{a} admitted it first"),
    ]
    # a second dispatcher (a restart) finds nothing left to renominate: the run is decided
    again = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce", "worker_lost_timeout": "10s"})),
                       clock=lambda: now[0])
    await again.leases_pass()
    assert len(await steps(bus, run)) == 10


async def test_a_cluster_lost_earlier_in_the_attempt_counts_again_once_it_rejoined(bus: Bus) -> None:
    run = f"rejoin-{next(RUNS)}"
    a, b, c = "rk-a", "rk-b", "rk-c"
    now = [1000.0]
    d = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce", "worker_lost_timeout": "10s"})),
                   clock=lambda: now[0])
    for name in (a, b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await d.leases_pass()
    await request(bus, d, apply_for(run))
    await d.on_report(a, admitted(run))
    now[0] += 11
    for name in (b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await d.leases_pass()  # a lost: requeued at b
    await d.on_report(b, admitted(run))
    await kv.put(bus, sites.LEASES, a, SiteLease(2, False))  # a rejoins while the run is chosen at b
    now[0] += 1
    await d.leases_pass()  # decided at b: nothing to renominate
    assert (await record(bus, run)).chosen == b
    now[0] += 11
    for name in (a, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(2 if name == a else 1, False))
    await d.leases_pass()  # b lost: a, back, is nominated
    rec = await record(bus, run)
    assert (rec.chosen, rec.lost, rec.nominated) == ("", [b], [a])


def gated(run: str) -> WatchEvent:
    """The run's Workload as a site leaves a reservation that could fit only by preempting (local engine)."""
    return WatchEvent(type="MODIFIED", cluster="ignored", object={
        "kind": "Workload", "metadata": {"name": f"job-{run}-a1", "namespace": "default", "resourceVersion": "3",
                                          "labels": {"taugrid.io/run-id": run, "taugrid.io/attempt": "1"}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "PreemptionGated",
                                   "message": "Workload could preempt to fit, but its preemption is gated"}]}})


async def grants(bus: Bus, run: str) -> list[tuple[str, bool]]:
    """The reservations sent for ``run`` that let a cluster preempt: (id, may_preempt)."""
    out = []
    first, last = await streams.bounds(bus, "BACKEND")
    for seq in range(first, last + 1):
        ev = await streams.at(bus, "BACKEND", seq)
        if ev is not None and ev.subject == run and ev.id.split(".")[-1].startswith("grant"):
            out.append((ev.id, ev.payload(BackendApply).may_preempt))
    return out


async def test_one_cluster_at_a_time_may_preempt_and_the_grant_passes_on_after_its_timeout(bus: Bus) -> None:
    run = f"gated-{next(RUNS)}"
    a, b = "gt-a", "gt-b"
    now = [1000.0]
    d = Dispatcher(bus, await fed(bus, platform((a, b, "gt-c"), {"mode": "AllAtOnce",
                                                                  "preemption_gate_timeout": "60s"})),
                   clock=lambda: now[0])
    await request(bus, d, apply_for(run))
    await d.on_report(b, gated(run))  # b first needs to preempt: it may
    await d.on_report(a, gated(run))  # a too: it waits while b has its turn
    await d.on_report(b, gated(run))  # a repeat changes nothing
    rec = await record(bus, run)
    assert (rec.gated, rec.granted, rec.granted_at) == ([b, a], [b], 1000.0)
    assert await grants(bus, run) == [(f"{run}.1.reserve.{b}.grant", True)]
    now[0] += 59
    await d.next_rounds()
    assert (await record(bus, run)).granted == [b]
    now[0] += 1  # b has had its 60 s without the run admitted: a may preempt now
    await d.next_rounds()
    assert (await record(bus, run)).granted == [b, a]
    await d.on_report(a, admitted(run))
    now[0] += 600
    await d.next_rounds()  # decided: nothing more is granted
    assert await grants(bus, run) == [(f"{run}.1.reserve.{b}.grant", True), (f"{run}.1.reserve.{a}.grant", True)]
    assert [s for s in await steps(bus, run) if s[0] != "dispatch.withdrawn"] == [
        ("dispatch.nominated", [a, b], f"AllAtOnce: nominated {a}, {b}"),
        ("dispatch.granted", [b], f"{b} may preempt for it (the first cluster that needs to; one at a time)"),
        ("dispatch.granted", [a], f"{a} may preempt for it: {b} did not get it admitted within 60s"),
        ("dispatch.chosen", [a], f"{a} admitted it first"),
    ]


async def test_a_gated_report_from_a_cluster_not_nominated_or_after_the_choice_grants_nothing(bus: Bus) -> None:
    run = f"gated-{next(RUNS)}"
    a, b, c = "gn-a", "gn-b", "gn-c"
    d = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce"})))
    await request(bus, d, apply_for(run))
    await d.on_report(c, gated(run))  # c serves another queue: never nominated
    await d.on_report(a, admitted(run))
    await d.on_report(b, gated(run))  # after the choice: b's copy is being withdrawn
    rec = await record(bus, run)
    assert (rec.gated, rec.granted) == ([], [])
    assert await grants(bus, run) == []


async def test_the_grant_passes_on_at_once_when_the_cluster_let_preempt_is_lost(bus: Bus) -> None:
    run = f"gated-{next(RUNS)}"
    a, b, c = "gl-a", "gl-b", "gl-c"
    now = [1000.0]
    d = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce", "worker_lost_timeout": "10s"})),
                   clock=lambda: now[0])
    for name in (a, b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await d.leases_pass()
    await request(bus, d, apply_for(run))
    await d.on_report(a, gated(run))
    await d.on_report(b, gated(run))
    assert (await record(bus, run)).granted == [a]
    now[0] += 11  # a falls silent (b and c renew): lost long before the gate's 300 s
    for name in (b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await d.leases_pass()
    rec = await record(bus, run)
    assert (rec.granted, rec.granted_at) == ([a, b], now[0])
    assert [s[1:] for s in await steps(bus, run) if s[0] == "dispatch.granted"] == [
        ([a], f"{a} may preempt for it (the first cluster that needs to; one at a time)"),
        ([b], f"{b} may preempt for it: {a}, let before, was lost")]


async def test_a_new_run_leaves_a_lost_cluster_out_until_it_rejoins(bus: Bus) -> None:
    """A lost cluster's reservation could only wait in its SITE_IN (and an Incremental round spent on the preferred
    cluster, lost, would hold every new run back a whole round): a run dispatched meanwhile leaves it out, counted
    in its record's ``lost``, and gets it nominated when it rejoins."""
    a, b, c = "lo-a", "lo-b", "lo-c"
    now = [1000.0]
    incremental = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "Incremental", "incremental_step": 1,
                                                             "worker_lost_timeout": "10s"})), clock=lambda: now[0])
    all_at_once = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce",
                                                                      "worker_lost_timeout": "10s"})),
                             clock=lambda: now[0])
    for name in (a, b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    for d in (incremental, all_at_once):
        await d.leases_pass()
    now[0] += 11  # a, the preferred cluster, falls silent and is declared lost
    for name in (b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await incremental.leases_pass()
    await all_at_once.leases_pass()  # (a lost already: it reads that)
    first, second = f"leftout-{next(RUNS)}", f"leftout-{next(RUNS)}"
    await request(bus, incremental, apply_for(first))
    await request(bus, all_at_once, apply_for(second))
    assert [((r := await record(bus, run)).nominated, r.lost) for run in (first, second)] == [([b], [a]), ([b], [a])]
    await kv.put(bus, sites.LEASES, a, SiteLease(2, False))  # a fenced and rejoined
    now[0] += 1
    await all_at_once.leases_pass()
    rec = await record(bus, second)
    assert (rec.nominated, rec.lost) == ([b, a], [])
    assert (await steps(bus, second))[-1] == ("dispatch.nominated", [b, a], f"{a} rejoined; AllAtOnce: nominated {a}")


async def test_a_cluster_removed_from_the_platform_is_fenced_and_its_runs_requeued(bus: Bus) -> None:
    run = f"removed-{next(RUNS)}"
    a, b, c = "rm-a", "rm-b", "rm-c"
    before = Dispatcher(bus, await fed(bus, platform((a, b, c), {"mode": "AllAtOnce"})))
    for name in (a, b, c):
        await kv.put(bus, sites.LEASES, name, SiteLease(1, False))
    await before.leases_pass()
    await request(bus, before, apply_for(run))
    await before.on_report(a, admitted(run))
    # the platform without a (b takes its place as the preferred cluster; c still serves only the gpu queue)
    after = Dispatcher(bus, await fed(bus, platform((b, "rm-d", c), {"mode": "AllAtOnce"})))
    await kv.put(bus, sites.LEASES, "rm-d", SiteLease(1, False))
    await after.leases_pass()
    assert (await sites.leases(bus))[a][0] == SiteLease(2, True)  # fenced: its site, if it runs, stops the run
    rec = await record(bus, run)
    assert (rec.chosen, rec.nominated, rec.lost) == ("", [b, "rm-d"], [])
    assert (await steps(bus, run))[-2:] == [
        ("dispatch.withdrawn", [a], f"{a} is no longer in the platform"),
        ("dispatch.nominated", [b, "rm-d"], f"AllAtOnce: nominated {b}, rm-d")]
    await after.leases_pass()  # done once: nothing is said again
    assert len(await steps(bus, run)) == 5
