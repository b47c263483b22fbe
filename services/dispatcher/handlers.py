"""Fan a run's request out to the clusters nominated for it; the first cluster to admit it wins.

As MultiKueue does (it creates the Workload on every nominated worker and the Job only on the one that reserved
quota first): a nominated cluster gets a *reservation* (``backend.<cluster>.reserve``: queue the workload and
reserve quota, start nothing); only the chosen cluster then gets the request to run it (``backend.<cluster>.apply``),
and every other reservation is withdrawn (``backend.<cluster>.delete``). So two clusters admitting at once never
both start the run.

Idempotency: the dispatch record of a run attempt is created once and changed only by compare-and-set, and is
written before anything it decides is published; every publish has a deterministic id (a reservation
``<run>.<attempt>.reserve.<cluster>``, the winner's ``….apply.<cluster>``, a withdrawal ``….delete.<cluster>``,
an event ``<run>.<attempt>.dispatch.<step>`` with the nomination's size for ``nominated``), so a redelivery or a
crash between the write and the publishes only publishes the same messages again, which the streams drop as
duplicates.

Trust: a report's cluster is the hub stream it was read from (``reports_of(cluster)``, bound per stream), never a
token or field inside the report; a cluster that was not nominated for the run cannot claim it
(``core.dispatch.on_admitted`` refuses it), and the chosen cluster is written once (the KV revision check).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from taugrid.bus import kv, sites
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config.clusters import eligible
from taugrid.config.platform import Platform
from taugrid.core.contracts import BackendApply, BackendDelete, DispatchStep, WatchEvent
from taugrid.core.dispatch import Mode, nominate, on_admitted, preemption_grant, withdrawals
from taugrid.core.errors import PermanentError
from taugrid.core.events import HIGH_LANE, backend_subject, k8s_subject, run_subject
from taugrid.core.siteleases import Lease, judge
from taugrid.core.workloadstatus import admitted, preempted  # shared with a Kubernetes site
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord, key

log = logging.getLogger("taugrid.dispatcher")

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# How often ``next_rounds`` reads every record (those another replica or an earlier process made) rather than only
# the undecided Incremental ones this process knows: the whole bucket is every run's request (2,000 runs: 5 MB).
FULL_SCAN_S = 60.0
RUN_LABEL = "taugrid.io/run-id"
# How often a request may ask again whether a cluster without a feed has one now (``leases_pass`` always asks).
FEED_RECHECK_S = 5.0
GATED = "PreemptionGated"  # core/admission/results.PREEMPTION_GATED, as a site words it
ATTEMPT_LABEL = "taugrid.io/attempt"
_WORKLOAD_KINDS = ("Job", "RayJob")  # what a withdrawal deletes (their Workloads and pods go with them)


def cluster_queue_of(platform: Platform, manifests: list[dict[str, Any]]) -> str:
    """The ClusterQueue a rendered run goes through: its workload's LocalQueue (Kueue's queue-name label) in its
    namespace, as the platform maps it."""
    for m in manifests:
        meta = m.get("metadata") or {}
        name = (meta.get("labels") or {}).get(QUEUE_LABEL)
        if m.get("kind") in _WORKLOAD_KINDS and name:
            queue = platform.local_queue(name, str(meta.get("namespace") or "default"))
            if queue is None:
                raise PermanentError(f"local queue {meta.get('namespace')}/{name} is not in the platform")
            return queue.cluster_queue
    raise PermanentError("the rendered run has no Job or RayJob with a kueue.x-k8s.io/queue-name label")


def finished(workload: dict[str, Any]) -> bool:
    """Whether a Workload is finished (Kueue's Finished condition is True)."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Finished" and c.get("status") == "True" for c in conditions)


def _waiting(gone: list[str], fed: set[str]) -> str:
    """Why a run has no cluster nominated: every one serving it is lost, or has no feed yet."""
    said = [c if c in fed else f"{c} (no feed yet)" for c in gone]
    return f"no cluster to nominate: {', '.join(said)} lost; it waits for one to rejoin"


def _timed(rec: DispatchRecord) -> bool:
    """Whether an undecided dispatch waits on the timer: an Incremental round, or a preemption grant to pass on."""
    return not rec.chosen and not rec.deleted and (rec.mode == "Incremental" or bool(set(rec.gated) - set(rec.granted)))


def _requeued(rec: DispatchRecord) -> str:
    """The id suffix of what is sent after the ``requeues``-th requeue: new ids, not repeats the streams drop."""
    return f".r{rec.requeues}" if rec.requeues else ""


def preemption_gated(workload: dict[str, Any]) -> bool:
    """Whether a Workload waits at its cluster because it could be admitted only by preempting and may not yet
    (Kueue's QuotaReserved False with reason PreemptionGated, KEP-8303)."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "False" and c.get("reason") == GATED
               for c in conditions)


def version(obj: dict[str, Any]) -> int:
    """An object's resourceVersion as its cluster numbers its changes (0 when absent)."""
    got = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(got) if got.isdigit() else 0


class Dispatcher:
    def __init__(self, bus: Bus, platform: Callable[[], Awaitable[Platform]], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.bus, self.platform, self.clock = bus, platform, clock
        # leases are timed by this process's clock from its start (core/siteleases.py)
        self.lease_clock, self.up_since = sites.LeaseClock(), clock()
        self._suspicion = ""  # the last self-suspicion logged, so it is logged once per change
        self._rounds: set[str] = set()  # keys of undecided Incremental dispatches this process made or saw
        self._full_scan_at = float("-inf")
        # the clusters whose lease is lost as the latest leases pass found them (None before the first: every
        # cluster holding its lease then may have rejoined while no dispatcher ran); never let preempt
        self._lost_before: set[str] | None = None
        # the clusters whose feed (their durable on BACKEND, ``sites.provision_feed``) was seen; a feed is never
        # deleted, so one seen stays. Those without one: when each was last asked about (``_find_feeds``)
        self._fed: set[str] = set()
        self._unfed_asked: dict[str, float] = {}

    # --- the renderer's requests (backend.dispatch.apply|delete) ---

    async def on_request(self, ev: Event) -> None:
        verb = ev.nats_subject.split(".")[2:3]  # backend.dispatch.<verb>[.high]
        if verb == ["apply"]:
            await self._apply(ev.payload(BackendApply))
        elif verb == ["delete"]:
            await self._delete(ev.payload(BackendDelete))

    async def _apply(self, req: BackendApply) -> None:
        platform = await self.platform()
        rec, revision = await kv.load(self.bus, BUCKET, key(req.run_id, req.attempt), DispatchRecord)
        if rec is None:
            queue = cluster_queue_of(platform, req.manifests)
            d = platform.dispatch
            await self._find_feeds(platform)
            candidates, gone = self._split(platform, queue)
            step = nominate(candidates, [], mode=d.mode, now=self.clock(),
                            step=d.incremental_step, round_timeout=d.round_timeout)
            rec = DispatchRecord(apply=req, cluster_queue=queue, mode=d.mode, nominated=list(step.clusters),
                                 round_started=step.round_started, lost=gone)
            await kv.save(self.bus, BUCKET, key(req.run_id, req.attempt), rec, revision=revision)
            self._track(rec)
            await self._send(rec, _waiting(gone, self._fed) if gone and not step.clusters else step.reason)
        elif not rec.chosen and not rec.deleted:  # a redelivery: the same copies and event, dropped as repeats
            await self._send(rec, f"{rec.mode}: nominated {', '.join(rec.nominated)}")

    def _split(self, platform: Platform, cluster_queue: str, *, also: str = "") -> tuple[list[str], list[str]]:
        """The clusters serving ``cluster_queue``, in preference order, split into those that may be nominated and
        those lost now (``also`` with them) or without a feed (``_find_feeds`` asked first): a lost cluster's
        reservation could only wait in its SITE_IN, and an Incremental round spent on it would hold the run back a
        whole round; a cluster with no feed would not even have it kept (BACKEND stores a request only for a
        durable whose filter matches it). The others are the record's ``lost``: nominated again when they rejoin
        or their feed appears (``_renominate``)."""
        lost_now = self._lost_before or set()
        clusters = eligible(platform.clusters, cluster_queue)
        gone = [c for c in clusters if c in lost_now or c == also or c not in self._fed]
        return [c for c in clusters if c not in gone], gone

    async def _find_feeds(self, platform: Platform, *, always: bool = False) -> set[str]:
        """Ask the hub which of the platform's clusters without a known feed have one now (each at most every
        ``FEED_RECHECK_S``, unless ``always``); the clusters found. A cluster the platform names before its link
        is provisioned (``tau platform apply`` adding one, the chart's hub Job not yet run) gets no request: BACKEND
        is an interest-retention stream, and what no durable's filter matches is not stored."""
        found: set[str] = set()
        now = self.clock()
        for cluster in platform.clusters:
            name = cluster.name
            asked = self._unfed_asked.get(name)
            if name in self._fed or (not always and asked is not None and now - asked < FEED_RECHECK_S):
                continue
            if await sites.feed_exists(self.bus, name):
                self._fed.add(name)
                self._unfed_asked.pop(name, None)
                found.add(name)
            else:
                if name not in self._unfed_asked:
                    log.warning("cluster %s has no feed on BACKEND (its link is not provisioned): not nominated "
                                "until it has", name)
                self._unfed_asked[name] = now
        return found

    async def _send(self, rec: DispatchRecord, reason: str, *, only: tuple[str, ...] | None = None) -> None:
        """A reservation to each nominated cluster (``only`` those, when given): queue the run's workload and
        reserve quota, start nothing."""
        for cluster in rec.nominated if only is None else only:
            await self._request(rec, cluster, "reserve")
        await self._event(rec, "dispatch.nominated", rec.nominated, reason, suffix=str(len(rec.nominated)))

    async def _request(self, rec: DispatchRecord, cluster: str, verb: str) -> None:
        """``backend.<cluster>.reserve|apply`` with the run's request (the high lane kept), id ``<run>.<attempt>.<verb>.
        <cluster>``."""
        req = rec.apply
        subject = backend_subject(cluster, verb) + (f".{HIGH_LANE}" if req.lane == HIGH_LANE else "")
        await self.bus.publish(subject, req, event_type=verb, ce_subject=req.run_id,
                               msg_id=f"{req.run_id}.{req.attempt}.{verb}.{cluster}{_requeued(rec)}",
                               workspace=req.workspace,
                               attempt=req.attempt, family="backend")

    async def _delete(self, req: BackendDelete) -> None:
        k = key(req.run_id, req.attempt)
        rec, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if rec is None:
            return  # never dispatched: nothing went to any cluster
        if not rec.deleted:
            rec = msgspec.structs.replace(rec, deleted=True)
            await kv.save(self.bus, BUCKET, k, rec, revision=revision)
        for cluster in rec.nominated:
            await self._withdraw(rec, cluster, req.reason or "the run was taken back")

    # --- each cluster's reports, read from its hub stream ---

    def reports_of(self, cluster: str) -> Callable[[Event], Awaitable[None]]:
        """The handler for the hub stream of ``cluster``: every report it passes on is that cluster's."""

        async def handle(ev: Event) -> None:
            change = ev.payload(WatchEvent)
            if change.object.get("kind") == "Workload" and preempted(change.object):
                # the run's own status first (it is queued again), while the record still names this cluster
                await self.mirror(cluster, ev, change)
                await self.on_report(cluster, change)
                return
            await self.on_report(cluster, change)
            await self.mirror(cluster, ev, change)

        return handle

    async def mirror(self, cluster: str, ev: Event, change: WatchEvent) -> None:
        """Pass a run's object change on to the hub's K8S stream when ``cluster`` is the run's chosen cluster (as
        MultiKueue mirrors the admitting worker's status back), under ``k8s.<cluster>.…`` built from the object, not
        from the subject the site wrote; the admission watcher turns it into the run's events. A copy elsewhere
        never reaches the run: its changes stop here."""
        obj = change.object
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        run_id, attempt = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL, "")
        if ev.source == "/svc/dispatcher":  # our own mirror come back (a site that imports k8s.>): never again
            return
        if not run_id or not attempt.isdigit() or not obj.get("kind") or not meta.get("name"):
            return
        rec, _ = await kv.load(self.bus, BUCKET, key(run_id, int(attempt)), DispatchRecord)
        if rec is None or rec.chosen != cluster:
            return
        kind = str(obj["kind"])
        subject = k8s_subject(cluster, kind, str(meta.get("namespace") or ""), str(meta["name"]), change.type)
        await self.bus.publish(subject, WatchEvent(type=change.type, object=obj, cluster=cluster),
                               event_type=f"{kind.lower()}.{change.type.lower()}", ce_subject=run_id,
                               # a copy reserved again after a reopening may repeat the site's ids (its versions
                               # restart when it forgot the workload): the reopening count keeps them new
                               msg_id=f"{cluster}.{ev.id}{_requeued(rec)}",
                               workspace=rec.apply.workspace, attempt=int(attempt), family="k8s")

    async def on_report(self, cluster: str, change: WatchEvent) -> None:
        obj = change.object
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") == "Workload" and change.type != "DELETED" and finished(obj):
            await self._finished(cluster, labels)
            return
        if obj.get("kind") == "Workload" and change.type != "DELETED" and (why := preempted(obj)):
            await self._preempted(cluster, labels, why, version(obj))
            return
        if obj.get("kind") == "Workload" and change.type != "DELETED" and preemption_gated(obj):
            await self._gated(cluster, labels)
            return
        if obj.get("kind") != "Workload" or change.type == "DELETED" or not admitted(obj):
            return
        run_id, attempt = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL, "")
        if not run_id or not attempt.isdigit():
            return
        k = key(run_id, int(attempt))
        rec, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if rec is None:
            log.warning("cluster %s admitted %s attempt %s, which was never dispatched: ignored", cluster, run_id,
                        attempt)
            return
        if rec.deleted:  # taken back: every copy was withdrawn, this one too (the same request again, a repeat)
            if cluster in rec.nominated:
                await self._withdraw(rec, cluster, "the run was taken back")
            return
        if rec.finished:  # a copy reserved after the run ended (a stale reservation come again): never counted
            if cluster in rec.nominated and change.type != "DELETED":
                await self._withdraw(rec, cluster, f"the run finished at {rec.chosen}")
            return
        decision = on_admitted(cluster, rec.nominated, rec.chosen or None)
        if decision.verdict == "refuse":
            log.warning("%s: %s", run_id, decision.reason)
            return
        if decision.verdict == "withdraw":
            await self._withdraw(rec, cluster, decision.reason)
            return
        if decision.verdict == "won" and rec.announced:
            return  # the winner's later changes (a run of days changes its Workload often): all was said
        if decision.verdict == "claim":
            rec = msgspec.structs.replace(rec, chosen=cluster, chosen_version=version(obj))
            # written once: a concurrent claim makes this a Conflict, redelivered, and then read as withdraw/won
            revision = await kv.save(self.bus, BUCKET, k, rec, revision=revision)
        await self._request(rec, cluster, "apply")  # only now may the run start, and only there
        await self._event(rec, "dispatch.chosen", [cluster], f"{cluster} admitted it first")
        for other in withdrawals(cluster, rec.nominated):
            await self._withdraw(rec, other, f"{cluster} admitted it first")
        # said once: a crash before this line repeats the same ids (dropped); after it, nothing is said again
        await kv.save(self.bus, BUCKET, k, msgspec.structs.replace(rec, announced=True), revision=revision)

    async def _finished(self, cluster: str, labels: dict[str, str]) -> None:
        """The chosen cluster finished the run: a later loss of that cluster no longer requeues it."""
        run_id, attempt = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL, "")
        if not run_id or not attempt.isdigit():
            return
        k = key(run_id, int(attempt))
        rec, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if rec is not None and rec.chosen == cluster and not rec.finished:
            await kv.save(self.bus, BUCKET, k, msgspec.structs.replace(rec, finished=True), revision=revision)

    async def _preempted(self, cluster: str, labels: dict[str, str], why: str, at_version: int) -> None:
        """The chosen cluster preempted the run (its engine evicted it for a higher priority): it no longer holds
        the run's quota, so the run goes back to nomination, as MultiKueue redoes the admission on every eligible
        worker once the admitting one loses it (kueue#8302). The evicting cluster keeps its copy, queued there
        again as a reservation (the site holds it back from starting), and stays nominated; the others get new
        reservations; whichever admits first is chosen as before. An eviction of a copy that was not chosen
        counted for nothing and changes nothing."""
        run_id, attempt = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL, "")
        if not run_id or not attempt.isdigit():
            return
        k = key(run_id, int(attempt))
        rec, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if rec is None or rec.chosen != cluster or rec.finished or rec.deleted or at_version < rec.chosen_version:
            return
        platform = await self.platform()
        d = platform.dispatch
        await self._find_feeds(platform)
        candidates, gone = self._split(platform, rec.cluster_queue)
        mode: Mode = "Incremental" if rec.mode == "Incremental" else "AllAtOnce"  # as it was dispatched
        step = nominate(candidates, [cluster], mode=mode, now=self.clock(), step=d.incremental_step,
                        round_timeout=d.round_timeout)
        rec = msgspec.structs.replace(rec, chosen="", announced=False, chosen_version=0, requeues=rec.requeues + 1,
                                      nominated=list(step.clusters), round_started=step.round_started, lost=gone,
                                      gated=[], granted=[], granted_at=0.0)  # gated again everywhere (KEP-8303)
        await kv.save(self.bus, BUCKET, k, rec, revision=revision)  # the choice is open again: compare-and-set
        self._track(rec)
        log.warning("%s: %s preempted it (%s): nominated again", run_id, cluster, why)
        await self._send(rec, f"{cluster} preempted it ({why}); {mode}: nominated {', '.join(rec.nominated)} again")

    async def _gated(self, cluster: str, labels: dict[str, str]) -> None:
        """A nominated cluster could admit the run only by preempting, and waits (its copy is gated): noted in the
        record, in the order clusters said so, and the grant decided (``_pass_grant``)."""
        run_id, attempt = labels.get(RUN_LABEL), labels.get(ATTEMPT_LABEL, "")
        if not run_id or not attempt.isdigit():
            return
        k = key(run_id, int(attempt))
        rec, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if rec is None or rec.chosen or rec.deleted or rec.finished or cluster not in rec.nominated:
            return
        if cluster not in rec.gated:
            rec = msgspec.structs.replace(rec, gated=[*rec.gated, cluster])
            await kv.save(self.bus, BUCKET, k, rec, revision=revision)
        self._track(rec)
        await self._pass_grant(rec)

    async def _pass_grant(self, rec: DispatchRecord) -> None:
        """Let one gated cluster preempt for the run when none may or the one let has had its time
        (``core.dispatch.preemption_grant``): written by compare-and-set, then the reservation sent again to it with
        ``may_preempt`` (id ``….reserve.<cluster>.grant``) and ``dispatch.granted``. The timer (``next_rounds``)
        passes a grant on once its time is up."""
        platform = await self.platform()
        grant = preemption_grant(rec.gated, rec.granted, rec.granted_at, now=self.clock(),
                                 timeout=platform.dispatch.preemption_gate_timeout, lost=self._lost_before or ())
        if not grant.cluster:
            return
        k = key(rec.apply.run_id, rec.apply.attempt)
        current, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if current != rec:
            return  # changed meanwhile (a report, another replica): decided again on its next report or tick
        rec = msgspec.structs.replace(rec, granted=[*rec.granted, grant.cluster], granted_at=self.clock())
        await kv.save(self.bus, BUCKET, k, rec, revision=revision)
        req = msgspec.structs.replace(rec.apply, may_preempt=True)
        subject = backend_subject(grant.cluster, "reserve") + (f".{HIGH_LANE}" if req.lane == HIGH_LANE else "")
        await self.bus.publish(subject, req, event_type="reserve", ce_subject=req.run_id,
                               msg_id=f"{req.run_id}.{req.attempt}.reserve.{grant.cluster}.grant{_requeued(rec)}",
                               workspace=req.workspace, attempt=req.attempt, family="backend")
        await self._event(rec, "dispatch.granted", [grant.cluster], grant.reason, suffix=grant.cluster)

    async def _withdraw(self, rec: DispatchRecord, cluster: str, reason: str) -> None:
        req = rec.apply
        for m in req.manifests:
            if m.get("kind") not in _WORKLOAD_KINDS:
                continue
            meta = m.get("metadata") or {}
            delete = BackendDelete(run_id=req.run_id, workspace=req.workspace, attempt=req.attempt,
                                   kind=str(m["kind"]), namespace=str(meta.get("namespace") or "default"),
                                   name=str(meta.get("name")), reason=reason)
            await self.bus.publish(backend_subject(cluster, "delete"), delete, event_type="delete",
                                   ce_subject=req.run_id,
                                   msg_id=f"{req.run_id}.{req.attempt}.delete.{cluster}{_requeued(rec)}",
                                   workspace=req.workspace, attempt=req.attempt, family="backend")
        await self._event(rec, "dispatch.withdrawn", [cluster], reason, suffix=cluster)

    # --- Incremental rounds ---

    def _track(self, rec: DispatchRecord) -> None:
        if _timed(rec):
            self._rounds.add(key(rec.apply.run_id, rec.apply.attempt))

    async def next_rounds(self) -> None:
        """Every undecided Incremental dispatch whose round has run out gets its next clusters, and a preemption
        grant whose time is up passes on to the next cluster waiting to preempt. Those this process knows are read
        one by one; every ``FULL_SCAN_S`` the whole bucket is read for the others (another
        replica's, an earlier process's), so such a round may start up to that much late."""
        platform = await self.platform()
        await self._find_feeds(platform)
        now = self.clock()
        if now - self._full_scan_at >= FULL_SCAN_S:
            self._full_scan_at = now
            self._rounds.clear()
            undecided = list(await kv.values(self.bus, BUCKET, DispatchRecord))
        else:
            undecided = [rec for k in sorted(self._rounds)
                         if (rec := (await kv.load(self.bus, BUCKET, k, DispatchRecord))[0]) is not None]
        for rec in undecided:
            if not _timed(rec):
                self._rounds.discard(key(rec.apply.run_id, rec.apply.attempt))
                continue
            self._track(rec)
            if rec.mode == "Incremental":
                await self._next_round(platform, rec)
            if set(rec.gated) - set(rec.granted):  # a cluster waits to preempt: the grant may pass on
                rec = (await kv.load(self.bus, BUCKET, key(rec.apply.run_id, rec.apply.attempt), DispatchRecord))[0] \
                    or rec
                await self._pass_grant(rec)

    async def _next_round(self, platform: Platform, rec: DispatchRecord) -> None:
        d = platform.dispatch
        candidates, gone = self._split(platform, rec.cluster_queue)
        step = nominate(candidates, rec.nominated, mode="Incremental",
                        now=self.clock(), round_started=rec.round_started, step=d.incremental_step,
                        round_timeout=d.round_timeout)
        if not step.added:
            return
        k = key(rec.apply.run_id, rec.apply.attempt)
        current, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
        if current != rec:
            return  # decided or advanced meanwhile (a report, another replica): the next tick reads it again
        rec = msgspec.structs.replace(rec, nominated=list(step.clusters), round_started=step.round_started,
                                      lost=sorted(set(rec.lost) | set(gone)))
        await kv.save(self.bus, BUCKET, k, rec, revision=revision)
        await self._send(rec, step.reason)

    # --- losing a cluster (core/siteleases.py; each site renews its lease in the hub's site_leases) ---

    async def leases_pass(self) -> None:
        """Judge the platform's clusters' leases by this process's clock; declare each expired one lost by
        compare-and-set (the fence), then requeue the unfinished runs chosen there. A lease already lost has its
        runs requeued again on every pass (a crash between the two steps loses nothing; requeued runs no longer
        name it). When every live cluster is silent at once nothing is declared: the hub suspects itself. A
        cluster removed from the platform is declared lost at once and its runs requeued; one that rejoins counts
        again for the runs still waiting (``_renominate``)."""
        platform = await self.platform()
        if not platform.clusters:
            return
        fed_now = await self._find_feeds(platform, always=True)
        now = self.clock()
        current = await sites.leases(self.bus)
        named = [c.name for c in platform.clusters]
        seen = {lease.cluster: lease for lease in self.lease_clock.observe(current, now)}
        views = [seen.get(name) or Lease(name) for name in named]
        verdict = judge(views, now, timeout=platform.dispatch.worker_lost_timeout, hub_up_since=self.up_since)
        if verdict.suspect_self and verdict.reason != self._suspicion:
            log.warning("%s", verdict.reason)
        self._suspicion = verdict.reason if verdict.suspect_self else ""
        lost = [name for name in named if name in current and current[name][0].lost]
        for name in verdict.lost:
            stored, revision = current.get(name, (sites.SiteLease(), 0))
            if await sites.declare_lost(self.bus, name, stored, revision) is not None:
                log.warning("cluster %s lost (%s): requeueing its runs", name, verdict.reason)
                lost.append(name)
        # a cluster no longer in the platform is lost for good: fenced (its site, if it still runs, stops what it
        # holds) and its runs requeued, once (and at a dispatcher's first pass); its lease stays, lost, as the fence
        removed: list[str] = []
        for name in sorted(set(current) - set(named)):
            stored, revision = current[name]
            if not stored.lost and await sites.declare_lost(self.bus, name, stored, revision) is not None:
                log.warning("cluster %s is no longer in the platform: requeueing its runs", name)
                removed.append(name)
            elif stored.lost and self._lost_before is None:
                removed.append(name)
        holding = {name for name in named if name in current and not current[name][0].lost} - set(lost)
        back = holding if self._lost_before is None else holding & self._lost_before
        self._lost_before = {*lost, *(name for name in current if name not in named)}
        back |= fed_now - self._lost_before  # a feed provisioned since: its cluster may be nominated now
        timeout = platform.dispatch.worker_lost_timeout
        for name in lost:
            await self._requeue_lost(platform, name, f"{name} lost: no lease renewal for over {timeout:g}s")
        for name in removed:
            await self._requeue_lost(platform, name, f"{name} is no longer in the platform")
        if back:
            await self._renominate(platform, back, provisioned=fed_now)

    async def _renominate(self, platform: Platform, back: set[str], *,
                          provisioned: frozenset[str] | set[str] = frozenset()) -> None:
        """Clusters that rejoined (lost, then fenced and renewing again), or whose feed exists now (``provisioned``),
        may be nominated again for the runs still waiting that had left them out as lost: a run requeued while every
        other cluster was lost had nobody to go to (kueue#8302 asks that a run lost with its worker be admitted on any
        cluster). Only undecided runs; a run chosen elsewhere meanwhile stays there."""
        d = platform.dispatch
        for rec in await kv.values(self.bus, BUCKET, DispatchRecord):
            returning = sorted(set(rec.lost) & back)
            if rec.chosen or rec.deleted or rec.finished or not returning:
                continue
            k = key(rec.apply.run_id, rec.apply.attempt)
            current, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
            if current != rec:
                continue  # changed meanwhile: the next rejoin (or process start) reads it again
            clusters = eligible(platform.clusters, rec.cluster_queue)
            # a cluster with no feed yet stays out (and in ``lost``, to be nominated once it has one)
            gone = [c for c in rec.lost if c not in back or c not in self._fed]
            gone += [c for c in clusters if c not in self._fed and c not in gone]
            candidates = [c for c in clusters if c not in gone]
            mode: Mode = "Incremental" if rec.mode == "Incremental" else "AllAtOnce"
            # nobody nominated (all were lost): a round starts now; otherwise Incremental's next round adds them
            step = nominate(candidates, rec.nominated, mode=mode, now=self.clock(), step=d.incremental_step,
                            round_started=rec.round_started if rec.nominated else None,
                            round_timeout=d.round_timeout)
            rec = msgspec.structs.replace(rec, lost=gone, requeues=rec.requeues + (1 if step.added else 0),
                                          nominated=list(step.clusters), round_started=step.round_started)
            await kv.save(self.bus, BUCKET, k, rec, revision=revision)
            self._track(rec)
            if step.added:
                log.info("%s: %s rejoined: nominated %s", rec.apply.run_id, ", ".join(returning),
                         ", ".join(step.added))
                rejoined = [c for c in returning if c not in provisioned]
                why = [f"{', '.join(rejoined)} rejoined"] if rejoined else []
                why += [f"{c}'s feed exists now" for c in returning if c in provisioned]
                await self._send(rec, f"{'; '.join(why)}; {mode}: nominated {', '.join(step.added)}",
                                 only=step.added)

    async def _requeue_lost(self, platform: Platform, cluster: str, reason: str) -> None:
        """Requeue the runs chosen at ``cluster``, lost, among the clusters not lost now (one lost earlier in the
        attempt that has rejoined since counts again)."""
        d = platform.dispatch
        await self._find_feeds(platform)
        for rec in await kv.values(self.bus, BUCKET, DispatchRecord):
            if not rec.chosen and not rec.deleted and rec.granted[-1:] == [cluster]:
                await self._pass_grant(rec)  # the cluster let preempt was lost: the next waiting one is let
            if rec.chosen != cluster or rec.finished or rec.deleted:
                continue
            k = key(rec.apply.run_id, rec.apply.attempt)
            current, revision = await kv.load(self.bus, BUCKET, k, DispatchRecord)
            if current != rec:
                continue  # changed meanwhile: the next pass reads it again
            candidates, gone = self._split(platform, rec.cluster_queue, also=cluster)
            mode: Mode = "Incremental" if rec.mode == "Incremental" else "AllAtOnce"  # as it was dispatched
            step = nominate(candidates, [], mode=mode, now=self.clock(), step=d.incremental_step,
                            round_timeout=d.round_timeout)
            rec = msgspec.structs.replace(rec, chosen="", announced=False, chosen_version=0, lost=gone,
                                          requeues=rec.requeues + 1, nominated=list(step.clusters),
                                          round_started=step.round_started, gated=[], granted=[], granted_at=0.0)
            await kv.save(self.bus, BUCKET, k, rec, revision=revision)  # the new choice is open: compare-and-set
            self._track(rec)
            await self._withdraw(rec, cluster, reason)  # its delete waits in the site's SITE_IN for its return
            await self._send(rec, _waiting(gone, self._fed) if gone and not step.clusters else step.reason)

    async def _event(self, rec: DispatchRecord, event_type: str, clusters: list[str], reason: str, *,
                     suffix: str = "") -> None:
        req = rec.apply
        await self.bus.publish(run_subject(req.workspace, req.run_id, event_type),
                               DispatchStep(clusters=clusters, mode=rec.mode, reason=reason), event_type=event_type,
                               ce_subject=req.run_id,
                               msg_id=f"{req.run_id}.{req.attempt}.{event_type}" + (f".{suffix}" if suffix else "")
                               + _requeued(rec),
                               workspace=req.workspace, attempt=req.attempt)
