"""The local cluster's side of Kueue's waitForPodsReady (``platform.yaml`` ``wait_for_pods_ready``): marks an
admitted workload ready once all its pods run, evicts one that is not ready within the timeout (its pods
stopped, its quota released, its Workload worded as Kueue words it), requeues it when its backoff ends, and
fails its run once the requeue limit is passed. The decisions are ``podsready``'s; this module does the I/O,
through what the controller hands it.

Invariants: it runs under the controller's lock (housekeeping and ``LocalCluster.pods_ready_pass``); a workload
backing off is in no admission queue (the engine forgot it with its quota) and returns to it through
``admitter.submit`` only; every change is saved before the next tick, and a restart resumes a backoff from the
saved ``requeue_at``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from taugrid.config.podsready import WaitForPodsReady
from taugrid.local import objects
from taugrid.local import podsready as rules
from taugrid.local.admit import LocalAdmitter, Request
from taugrid.local.podsync import PodSync
from taugrid.local.state import LocalWorkload

log = logging.getLogger("taugrid.local")

Publish = Callable[[LocalWorkload, str, dict[str, Any], str], Awaitable[None]]
Save = Callable[[LocalWorkload], Awaitable[None]]


def pod_count(wl: LocalWorkload) -> int:
    """All the workload's pods: its pod set's, and a Ray cluster's head beside its workers (``raycluster``)."""
    return wl.pods_wanted + (1 if wl.head_per_pod else 0)


class Readiness:
    def __init__(self, *, podsync: PodSync, admitter: LocalAdmitter, publish: Publish, save: Save,
                 request: Callable[[LocalWorkload], Request], drop_versions: Callable[..., None],
                 forget: Callable[[LocalWorkload], None], wake: Callable[[], None]) -> None:
        self.podsync, self.admitter, self.publish, self.save = podsync, admitter, publish, save
        self.request, self.drop_versions, self.forget, self.wake = request, drop_versions, forget, wake
        self.rule = WaitForPodsReady()
        self.draw: Callable[[], float] = random.random  # Kueue's jitter; tests pin it

    def admitted(self, wl: LocalWorkload, now: float) -> None:
        """A new admission: not ready yet (Kueue's PodsReady=False, WaitForStart), published with it."""
        wl.ready = False
        if self.rule.enable:
            objects.set_condition(wl.workload, "PodsReady", "False", rules.WAIT_FOR_START, rules.NOT_READY_MESSAGE,
                                  now)

    def not_ready(self, wls: Iterable[LocalWorkload]) -> int:
        """Admitted workloads whose pods are not all ready (blockAdmission waits for none)."""
        return sum(1 for wl in wls if wl.state == "running" and not wl.ready
                   and not rules.pods_ready((p.phase for p in wl.pods), pod_count(wl)))

    def blocked(self, wls: Iterable[LocalWorkload]) -> bool:
        """Kueue's blockAdmission holds (counted only when it is on: admission asks on every wake-up, so the
        caller passes its workloads uncopied, e.g. ``wls.values()``; nothing is iterated while it is off)."""
        return self.rule.block_admission and rules.blocks_admission(self.rule, self.not_ready(wls))

    def backing_off(self, wl: LocalWorkload) -> bool:
        return wl.state == "pending" and wl.requeue_at > 0

    async def check(self, wls: Iterable[LocalWorkload], now: float) -> None:
        """One pass: backoffs that ended go back to their queue; running workloads become ready, or are evicted
        or deactivated when their timeout has passed."""
        # one cheap filter first, taken before any await (applies join ``wls`` meanwhile): housekeeping passes
        # every workload held (thousands waiting, in a burst)
        for wl in [w for w in wls if w.requeue_at or (w.state == "running" and not w.ready)]:
            try:
                if self.backing_off(wl) and now >= wl.requeue_at:
                    await self._requeue(wl, now)
                elif wl.state == "running" and not wl.ready:
                    await self._running(wl, now)
            except Exception as exc:  # the bus failed mid-way: the next pass decides again from what is recorded
                log.warning("waitForPodsReady step for %s failed; retrying next tick: %r", wl.name, exc)

    async def _running(self, wl: LocalWorkload, now: float) -> None:
        if rules.pods_ready((p.phase for p in wl.pods), pod_count(wl)):
            wl.ready = True  # saved with the workload's next change; a restart finds its pods running again
            if self.rule.enable:  # rides on the Workload's next publish: no bus operation of its own
                packed = not wl.decoded
                objects.set_condition(wl.workload, "PodsReady", "True", rules.STARTED, rules.READY_MESSAGE, now)
                if packed:  # it ran holding its Job, Workload and pods as JSON (a started simulated Job): so it
                    wl.pack()  # runs on, the condition in its JSON (the dict kept to its end: 7 KB a workload)
                if self.rule.block_admission:
                    self.wake()
            return
        if any(p.phase == "Failed" for p in wl.pods):
            return  # its Job is failing (backoffLimit 0): the failure, not a timeout, ends this admission
        v = rules.verdict(self.rule, admitted_at=wl.admitted_at, count=wl.ready_requeues, now=now,
                          namespace=wl.workload["metadata"]["namespace"], name=wl.workload["metadata"]["name"],
                          draw=self.draw())
        if isinstance(v, rules.Evict):
            await self._evict(wl, v, now)
        elif isinstance(v, rules.Deactivate):
            await self._deactivate(wl, v, now)

    async def _stop(self, wl: LocalWorkload, reason: str) -> None:
        """Every pod of the workload goes (the running ones SIGTERM, then SIGKILL after their grace period), and
        its quota is released at once, as Kueue releases an evicted workload's quota once its pods are gone."""
        await self.podsync.take_down(wl, wl.pods, reason)
        self.drop_versions(*(p.obj for p in wl.pods))
        wl.pods = []
        self.admitter.release(wl.name)
        self.wake()  # freed capacity

    async def _evict(self, wl: LocalWorkload, v: rules.Evict, now: float) -> None:
        await self._stop(wl, rules.TIMEOUT_REASON)
        w = wl.workload
        objects.evict(w, reason=rules.TIMEOUT_REASON, message=v.message, preemptor_uid="", at=now)
        objects.set_condition(w, "QuotaReserved", "False", "Pending", v.message, now)
        objects.set_condition(w, "Requeued", "False", rules.TIMEOUT_REASON, v.message, now)
        objects.set_condition(w, "PodsReady", "False", rules.WAIT_FOR_START, rules.NOT_READY_MESSAGE, now)
        w["status"]["requeueState"] = {"count": v.count, "requeueAt": objects.ts(v.requeue_at)}
        objects.job_suspended(wl.job)
        wl.state, wl.last_pending, wl.ready = "pending", "", False
        wl.requeues += 1  # its next pods are new pods
        wl.ready_requeues, wl.requeue_at, wl.retry_reason = v.count, v.requeue_at, rules.TIMEOUT_REASON
        wl.queued_at = rules.queued_at(self.rule, created=wl.created, evicted_at=now)
        await self.save(wl)  # before it is announced: a restart resumes the backoff, never re-runs the pods
        await self.publish(wl, "Workload", w, "modified")
        await self.publish(wl, wl.job["kind"], wl.job, "modified")
        log.warning("%s: %s; requeue %d at +%.0fs", wl.name, v.message, v.count, v.requeue_at - now)

    async def _requeue(self, wl: LocalWorkload, now: float) -> None:
        """Its backoff is over: back in its queue, at the place ``requeuing_strategy.timestamp`` gives it."""
        due, wl.requeue_at = wl.requeue_at, 0.0
        try:
            await self.save(wl)
        except BaseException:
            wl.requeue_at = due  # not recorded: still backing off, tried again at the next pass
            raise
        objects.set_condition(wl.workload, "Requeued", "True", rules.BACKOFF_FINISHED,
                              rules.BACKOFF_FINISHED_MESSAGE, now)
        (wl.workload["status"].get("requeueState") or {}).pop("requeueAt", None)
        self.admitter.submit(self.request(wl))
        self.wake()
        await self.publish(wl, "Workload", wl.workload, "modified")  # the run's queued reason: BackoffFinished

    async def _deactivate(self, wl: LocalWorkload, v: rules.Deactivate, now: float) -> None:
        """Kueue deactivates it (``spec.active: false``) and it waits for a person; a run has nobody to
        reactivate it, so its Job fails with Kueue's reason and its run ends (recovery classes the reason
        ``evicted``: ``resilience.retry_on: [Evicted]`` may start a new attempt)."""
        await self._stop(wl, rules.TIMEOUT_REASON)
        w = wl.workload
        w["spec"]["active"] = False
        objects.evict(w, reason=rules.DEACTIVATED_REASON, message=rules.DEACTIVATED_MESSAGE, preemptor_uid="",
                      at=now)
        objects.set_condition(w, "QuotaReserved", "False", "Inactive", rules.DEACTIVATED_MESSAGE, now)
        objects.job_finished(wl.job, succeeded=False, reason=rules.LIMIT_REASON, message=v.message, at=now)
        objects.finish(w, succeeded=False, message=v.message, at=now)
        wl.state = "finished"
        await self.save(wl)
        await self.publish(wl, wl.job["kind"], wl.job, "modified")
        await self.publish(wl, "Workload", w, "modified")
        self.forget(wl)
        log.warning("%s: %s", wl.name, v.message)
