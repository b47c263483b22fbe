"""The dispatcher on a real nats-server: a run's request fans out to the nominated clusters (AllAtOnce, or
Incremental rounds spilling over by preference), the first cluster to admit it is written once as its cluster, the
other copies are withdrawn, every step is a run event with its reason, and a cluster that was never nominated
cannot claim the run. Reports are handed in as the hub stream of their cluster passes them on (the sourcing
itself is tests/bus/test_sites.py's)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import msgspec
import pytest
import yaml

from taugrid.bus import kv, sites, streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config.platform import Platform, load_platform
from taugrid.core.contracts import BackendApply, BackendDelete, DispatchStep, WatchEvent
from taugrid.core.errors import TemporaryError
from taugrid_services.dispatcher.handlers import FULL_SCAN_S, Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key
from tests.platforms import lab_platform
from tests.sitebus import fed, fixed

RUNS = itertools.count(1)


def platform(dispatch: dict[str, Any] | None = None) -> Platform:
    clusters = [{"name": "cloud", "backend": "kubernetes", "preference": 10},
                {"name": "onprem-a", "backend": "local"}, {"name": "onprem-b", "backend": "local"},
                {"name": "onprem-c", "backend": "local", "preference": 1},
                {"name": "gpu-only", "backend": "local", "cluster_queues": ["gpu"]}]
    data = yaml.safe_load(lab_platform(clusters=clusters, **({"dispatch": dispatch} if dispatch else {})))
    data["cluster_queues"].append({"name": "gpu", "resource_groups": [{"covered_resources": ["cpu"], "flavors": [
        {"name": "default", "resources": [{"name": "cpu", "nominal_quota": 8}]}]}]})
    return load_platform(yaml.safe_dump(data))


def apply_for(run: str) -> BackendApply:
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{run}-a1", "namespace": "default",
                        "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": run}}}
    return BackendApply(run_id=run, workspace="ws", attempt=1, manifests=[job])


def admitted(run: str, *, reserved: bool = True) -> WatchEvent:
    status = "True" if reserved else "False"
    return WatchEvent(type="MODIFIED", cluster="ignored", object={
        "kind": "Workload", "metadata": {"name": f"job-{run}-a1", "namespace": "default",
                                          "labels": {"taugrid.io/run-id": run, "taugrid.io/attempt": "1"}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": status}]}})


async def request(bus: Bus, dispatcher: Dispatcher, req: BackendApply) -> None:
    """Publish the renderer's request as the local backend would (TAU_CLUSTER=dispatch) and hand it over."""
    await bus.publish("backend.dispatch.apply", req, event_type="apply", ce_subject=req.run_id,
                      msg_id=f"{req.run_id}.{req.attempt}.apply", workspace=req.workspace, family="backend")
    ev = await streams.last(bus, "BACKEND", "backend.dispatch.apply")
    assert isinstance(ev, Event)
    await dispatcher.on_request(ev)


async def sent(bus: Bus, run: str) -> dict[str, int]:
    """How many requests each cluster's subject holds for ``run`` (``<cluster>.<verb>`` → count)."""
    out = {}
    for cluster in ("cloud", "onprem-a", "onprem-b", "onprem-c", "gpu-only"):
        for verb in ("reserve", "apply", "delete"):
            n = 0
            first, last = await streams.bounds(bus, "BACKEND")
            for seq in range(first, last + 1):
                ev = await streams.at(bus, "BACKEND", seq)
                if ev is not None and ev.nats_subject == f"backend.{cluster}.{verb}" and ev.subject == run:
                    n += 1
            if n:
                out[f"{cluster}.{verb}"] = n
    return out


async def steps(bus: Bus, run: str) -> list[tuple[str, list[str], str]]:
    """The run's dispatch events in stream order: (type, clusters, reason)."""
    found = []
    first, last = await streams.bounds(bus, "RUNS")
    for seq in range(first, last + 1):
        ev = await streams.at(bus, "RUNS", seq)
        if ev is not None and ev.subject == run and ev.type.startswith("dispatch."):
            step = ev.payload(DispatchStep)
            found.append((ev.type, step.clusters, step.reason))
    return found


async def test_all_at_once_the_first_admission_wins_and_the_other_copies_are_withdrawn(bus: Bus) -> None:
    run = f"dispatch-{next(RUNS)}"

    plat = await fed(bus, platform())
    d = Dispatcher(bus, plat)
    await request(bus, d, apply_for(run))
    await request(bus, d, apply_for(run))  # redelivered: the same copies, dropped as repeats
    # reservations only: nothing may start before a cluster has won
    assert await sent(bus, run) == {"cloud.reserve": 1, "onprem-a.reserve": 1, "onprem-b.reserve": 1,
                                    "onprem-c.reserve": 1}

    await d.on_report("gpu-only", admitted(run))  # never nominated (it serves only gpu): cannot claim the run
    await d.on_report("onprem-b", admitted(run, reserved=False))  # pending there: nothing decided
    await d.on_report("onprem-c", admitted(run))
    await d.on_report("onprem-c", admitted(run))  # a repeat
    await d.on_report("cloud", admitted(run))  # admitted too late: its copy is withdrawn (again: one request)
    rec, revision = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None and rec.chosen == "onprem-c" and rec.announced
    await d.on_report("onprem-c", admitted(run))  # the winner's Workload changes again: nothing more is written
    assert (await kv.load(bus, BUCKET, key(run, 1), DispatchRecord))[1] == revision
    assert await sent(bus, run) == {
        "cloud.reserve": 1, "cloud.delete": 1, "onprem-a.reserve": 1, "onprem-a.delete": 1, "onprem-b.reserve": 1,
        "onprem-b.delete": 1, "onprem-c.reserve": 1, "onprem-c.apply": 1}
    assert await steps(bus, run) == [
        ("dispatch.nominated", ["onprem-a", "onprem-b", "onprem-c", "cloud"],
         "AllAtOnce: nominated onprem-a, onprem-b, onprem-c, cloud"),
        ("dispatch.chosen", ["onprem-c"], "onprem-c admitted it first"),
        ("dispatch.withdrawn", ["onprem-a"], "onprem-c admitted it first"),
        ("dispatch.withdrawn", ["onprem-b"], "onprem-c admitted it first"),
        ("dispatch.withdrawn", ["cloud"], "onprem-c admitted it first"),
    ]
    last_delete = await streams.last(bus, "BACKEND", "backend.cloud.delete")
    assert last_delete is not None and last_delete.payload(BackendDelete) == BackendDelete(
        run_id=run, workspace="ws", attempt=1, kind="Job", namespace="default", name=f"{run}-a1",
        reason="onprem-c admitted it first")


async def test_two_clusters_admitting_at_once_leave_one_winner(bus: Bus) -> None:
    run = f"dispatch-{next(RUNS)}"

    plat = await fed(bus, platform())
    replicas = [Dispatcher(bus, plat), Dispatcher(bus, plat)]
    await request(bus, replicas[0], apply_for(run))
    results = await asyncio.gather(replicas[0].on_report("onprem-a", admitted(run)),
                                   replicas[1].on_report("cloud", admitted(run)), return_exceptions=True)
    lost = [i for i, r in enumerate(results) if isinstance(r, TemporaryError)]
    assert len(lost) <= 1, results  # the compare-and-set lets one claim through; the other is redelivered
    for i in lost:
        await replicas[i].on_report(("onprem-a", "cloud")[i], admitted(run))
    rec, _ = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None and rec.chosen in ("onprem-a", "cloud")
    chosen = [s for s in await steps(bus, run) if s[0] == "dispatch.chosen"]
    assert chosen == [("dispatch.chosen", [rec.chosen], f"{rec.chosen} admitted it first")]
    loser = "cloud" if rec.chosen == "onprem-a" else "onprem-a"
    requests = await sent(bus, run)
    assert requests.get(f"{loser}.delete") == 1
    assert [k for k in requests if k.endswith(".apply")] == [f"{rec.chosen}.apply"]  # the run starts in one place


async def test_incremental_rounds_spill_over_by_preference(bus: Bus) -> None:
    run = f"dispatch-{next(RUNS)}"
    now = [1000.0]

    plat = await fed(bus, platform({"mode": "Incremental", "incremental_step": 2, "round_timeout": "60s"}))
    d = Dispatcher(bus, plat, clock=lambda: now[0])
    await request(bus, d, apply_for(run))
    assert await sent(bus, run) == {"onprem-a.reserve": 1, "onprem-b.reserve": 1}
    now[0] += 30
    await d.next_rounds()
    assert await sent(bus, run) == {"onprem-a.reserve": 1, "onprem-b.reserve": 1}  # the round is still on
    now[0] += 31
    await d.next_rounds()
    assert await sent(bus, run) == {"onprem-a.reserve": 1, "onprem-b.reserve": 1, "onprem-c.reserve": 1,
                                    "cloud.reserve": 1}
    await d.on_report("cloud", admitted(run))
    now[0] += 600
    await d.next_rounds()  # decided: nothing more is nominated
    assert [s[:2] for s in await steps(bus, run)] == [
        ("dispatch.nominated", ["onprem-a", "onprem-b"]),
        ("dispatch.nominated", ["onprem-a", "onprem-b", "onprem-c", "cloud"]),
        ("dispatch.chosen", ["cloud"]), ("dispatch.withdrawn", ["onprem-a"]), ("dispatch.withdrawn", ["onprem-b"]),
        ("dispatch.withdrawn", ["onprem-c"])]
    assert (await steps(bus, run))[1][2] == (
        "Incremental: no admission in 60s from onprem-a, onprem-b; nominated onprem-c, cloud")


async def test_another_replicas_incremental_round_is_picked_up_by_the_full_read(bus: Bus) -> None:
    """Between full reads of the bucket a replica advances only the Incremental dispatches it knows; another
    replica's get their next round at its next full read (``FULL_SCAN_S``)."""
    run = f"dispatch-{next(RUNS)}"
    now = [5000.0]
    plat = await fed(bus, platform({"mode": "Incremental", "incremental_step": 2, "round_timeout": "30s"}))
    mine, other = Dispatcher(bus, plat, clock=lambda: now[0]), Dispatcher(bus, plat, clock=lambda: now[0])
    await other.next_rounds()  # its first full read, before the run exists
    await request(bus, mine, apply_for(run))
    now[0] += 31  # the round has run out
    await other.next_rounds()  # within FULL_SCAN_S of its last full read: it does not know the run yet
    assert await sent(bus, run) == {"onprem-a.reserve": 1, "onprem-b.reserve": 1}
    now[0] += FULL_SCAN_S
    await other.next_rounds()
    assert await sent(bus, run) == {"onprem-a.reserve": 1, "onprem-b.reserve": 1, "onprem-c.reserve": 1,
                                    "cloud.reserve": 1}
    await mine.next_rounds()  # it reads the record again and finds the round already moved: nothing repeated
    assert [s[1] for s in await steps(bus, run)] == [["onprem-a", "onprem-b"],
                                                    ["onprem-a", "onprem-b", "onprem-c", "cloud"]]


async def test_a_cluster_without_a_feed_is_nominated_only_once_it_has_one(bus: Bus) -> None:
    """BACKEND keeps a request only for a durable whose filter matches it (interest retention, issue 27): a cluster
    the platform names before its link is provisioned (no feed, ``sites.provision_feed``) is sent nothing, and is
    nominated for the runs still waiting once its feed exists (the next leases pass asks)."""
    run, late = f"dispatch-{next(RUNS)}", f"late-{next(RUNS)}"
    plat = load_platform(lab_platform(clusters=[{"name": "onprem-a", "backend": "local"},
                                                {"name": late, "backend": "local"}]))
    await sites.provision_feed(bus, "onprem-a")
    d = Dispatcher(bus, fixed(plat))
    await request(bus, d, apply_for(run))
    rec, _ = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None and (rec.nominated, rec.lost, rec.requeues) == (["onprem-a"], [late], 0)
    assert await requests(bus, run) == ["backend.onprem-a.reserve"]

    await d.leases_pass()  # still no feed: nothing changes
    assert await requests(bus, run) == ["backend.onprem-a.reserve"]
    await sites.provision_feed(bus, late)
    await d.leases_pass()
    assert await requests(bus, run) == ["backend.onprem-a.reserve", f"backend.{late}.reserve"]
    rec, _ = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None and (rec.nominated, rec.lost, rec.requeues) == (["onprem-a", late], [], 1)
    assert await steps(bus, run) == [
        ("dispatch.nominated", ["onprem-a"], "AllAtOnce: nominated onprem-a"),
        ("dispatch.nominated", ["onprem-a", late], f"{late}'s feed exists now; AllAtOnce: nominated {late}")]


async def requests(bus: Bus, run: str) -> list[str]:
    """The subjects of the requests BACKEND holds for ``run`` (none read: every feed's site is absent here)."""
    out = []
    first, last = await streams.bounds(bus, "BACKEND")
    for seq in range(first, last + 1):
        ev = await streams.at(bus, "BACKEND", seq)
        if ev is not None and ev.subject == run and not ev.nats_subject.startswith("backend.dispatch."):
            out.append(ev.nats_subject)
    return out


async def test_a_run_taken_back_withdraws_every_copy(bus: Bus) -> None:
    run = f"dispatch-{next(RUNS)}"

    plat = await fed(bus, platform())
    d = Dispatcher(bus, plat)
    await request(bus, d, apply_for(run))
    delete = BackendDelete(run_id=run, workspace="ws", attempt=1, kind="Job", namespace="default",
                           name=f"{run}-a1", reason="cancelled by alice")
    await bus.publish("backend.dispatch.delete", delete, event_type="delete", ce_subject=run,
                      msg_id=f"{run}.1.delete", workspace="ws", family="backend")
    ev = await streams.last(bus, "BACKEND", "backend.dispatch.delete")
    assert ev is not None
    await d.on_request(ev)
    await d.on_report("onprem-a", admitted(run))  # admitted after the cancel: already withdrawn, stays so
    rec, _ = await kv.load(bus, BUCKET, key(run, 1), DispatchRecord)
    assert rec is not None and rec.deleted and rec.chosen == ""
    assert await sent(bus, run) == {f"{c}.{v}": 1 for c in ("cloud", "onprem-a", "onprem-b", "onprem-c")
                                    for v in ("reserve", "delete")}


def test_the_record_round_trips() -> None:
    rec = DispatchRecord(apply=apply_for("r"), cluster_queue="lab", mode="AllAtOnce", nominated=["a"],
                         round_started=1.0)
    assert msgspec.json.decode(msgspec.json.encode(rec), type=DispatchRecord) == rec


@pytest.fixture(autouse=True)
def _no_leak() -> None:
    """(each test makes its own run ids; the session's server is shared)"""
