"""Render, validate, apply. Idempotent: the same run and attempt always give the same object name and
manifests; the backend apply is keyed by run+attempt and ``render.applied`` by its deterministic id.

A retry renders the attempt with the ``exclude_nodes`` that recovery chose (a required node anti-affinity).
Trace continuity on Kubernetes: the objects handed to the backend carry ``taugrid.io/traceparent`` (on their
metadata and pod templates), which kube-bridge puts back on every watch event it republishes. The value is
the triggering event's own ``traceparent`` header, not this delivery's span: it is the same on every
redelivery, so a re-apply stays a no-op (a Job's pod template is immutable once it has started). The
annotation is stamped after rendering and validating, onto copies: the manifests as rendered, without it, are
stored once in the ``manifests`` KV bucket by their digest (``bus/manifests.py``, issue 27: the evidence seals
them from there and purges them), before the backend sees them, and ``render.applied`` carries that digest,
``manifest_digest`` of exactly those, not the manifests themselves.

Authorization. A ``cancel.requested`` is acted on only when its signature checks out and the signer is the
run's own submitter, an admin of its workspace or a platform admin: the answer is ``cancel.accepted`` (which
sets the run's cancel flag) or ``cancel.refused`` with the reason. A ``recovery.retrying`` is applied only when
the run record shows that the attempt it replaces actually failed (or was preempted or degraded); the spec it
applies is the run's own approved spec, with only the retry variables recovery adds taken from the event.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

import msgspec

from taugrid import runrecord
from taugrid.access.signers import Refused, Signers
from taugrid.bus import manifests as stored_manifests
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.config.platform import Platform
from taugrid.core.contracts import (
    BackendApply,
    BackendDelete,
    CancelDecision,
    CancelRequested,
    ExecFinished,
    PolicyApproved,
    RecoveryRetrying,
    RenderApplied,
    RenderFailed,
    ResolvedRun,
)
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.ids import token
from taugrid.core.states import TERMINAL, RunRecord
from taugrid.render import (
    TRACEPARENT_ANNOTATION,
    RenderSettings,
    canonical_json,
    render,
    with_annotation,
)
from taugrid.render.validate import validate

log = logging.getLogger("taugrid.renderer")

# Objects the backend must delete to stop a run (the Service of a multi-node Job goes with its owner).
_WORKLOAD_KINDS = ("Job", "RayJob")
# What a retry may change in the approved spec: the variables recovery adds (see recovery's handler).
_RETRY_ENV = ("TAU_RETRY_REASON", "TAU_RESUME_FROM")
# How long a retry may wait for the projection to record the failure it names before it is refused.
_PROJECTION_GRACE_S = 15.0


class Renderer:
    def __init__(self, bus: Bus, backend: Any, settings: RenderSettings | None = None) -> None:
        self.bus, self.backend = bus, backend
        # Where the source-fetch init container comes from (TAU_SOURCE_FETCH_* from the chart).
        self.settings = settings or RenderSettings.from_env()
        self.signers = Signers(bus)
        self.cancelled: OrderedDict[str, None] = OrderedDict()  # runs this replica cancelled (bounded)

    async def on_event(self, ev: Event) -> None:
        if ev.type == "policy.approved":
            run = ev.payload(PolicyApproved).run
            if (token(run.workspace), token(run.run_id)) != (ev.workspace, ev.subject):
                # the subject is what the server vouched for; a spec for another run is never applied
                raise PermanentError(f"policy.approved on {ev.nats_subject} carries the spec of run {run.run_id} "
                                     f"in workspace {run.workspace}: refused")
            await self.apply(ev, run, attempt=1, exclude=[])
        elif ev.type == "recovery.retrying":
            await self.retry(ev, ev.payload(RecoveryRetrying))
        elif ev.type == "cancel.requested":
            await self.cancel(ev)

    async def apply(self, ev: Event, run: ResolvedRun, *, attempt: int, exclude: list[str],
                    resume_from: str = "") -> None:
        record, _ = await runrecord.get(self.bus, run.workspace, run.run_id)
        if run.run_id in self.cancelled:
            return
        if record is not None and (record.cancel_requested or record.state in TERMINAL):
            return
        try:
            manifests = render(run, attempt=attempt, resume_from=resume_from, exclude_nodes=exclude,
                               settings=self.settings)
            for m in manifests:
                validate(m, varying=(run.run_id, run.submission_id))
        except PermanentError as err:
            await self.bus.emit(workspace=ev.workspace, run_id=run.run_id, attempt=attempt,
                                event_type="render.failed",
                                payload=RenderFailed(attempt=attempt, reason="InvalidManifest", message=str(err)))
            return
        # stored before the backend sees them: an applied run's manifests are always there for its seal
        digest = await stored_manifests.put(self.bus, run.workspace, run.run_id, canonical_json(manifests))
        applied = manifests
        if ev.traceparent:
            applied = with_annotation(manifests, TRACEPARENT_ANNOTATION, ev.traceparent)
        await self.backend.apply(BackendApply(
            run_id=run.run_id, workspace=run.workspace, attempt=attempt, manifests=applied,
            source_object=run.source_object, exclude_nodes=exclude, python=run.python,
            python_source=run.python_source, image=run.image, pip=list(run.pip), lane=ev.lane,
            platform_revision=run.platform_revision,
        ))
        log.info("applied %s attempt %d via %s", run.run_id, attempt, self.backend.name)
        main = next((m for m in manifests if m.get("kind") in _WORKLOAD_KINDS), manifests[0])
        await self.bus.emit(
            workspace=ev.workspace, run_id=run.run_id, attempt=attempt, event_type="render.applied",
            payload=RenderApplied(attempt=attempt, backend=self.backend.name, kind=str(main["kind"]),
                                  object_name=str(main["metadata"]["name"]), digest=digest),
        )

    async def retry(self, ev: Event, req: RecoveryRetrying) -> None:
        wait = req.not_before - time.time()
        if wait > 0.05:
            raise TemporaryError(f"backoff before attempt {req.attempt}", delay=min(wait, 600.0))
        record, run = await runrecord.require_resolved(self.bus, ev)
        if record.attempt > req.attempt or record.state in TERMINAL:
            return  # superseded by a later attempt, or the run is over
        previous = req.attempt - 1
        if not _failed(record, previous):
            waited = time.time() - req.not_before
            if waited < _PROJECTION_GRACE_S:  # the failure may not be projected yet
                raise TemporaryError(f"attempt {previous} of {ev.subject} not recorded as failed yet", delay=1.0)
            raise PermanentError(
                f"refused recovery.retrying for attempt {req.attempt} of {ev.subject}: the run record shows "
                f"attempt {previous} did not fail (state {record.state}, attempt {record.attempt})")
        if req.run is not None:
            extra = {k: req.run.env[k] for k in _RETRY_ENV if k in req.run.env}
            run = msgspec.structs.replace(run, env={**run.env, **extra})
        await self._delete_attempt(ev, run, previous, reason="superseded by a retry")
        await self.apply(ev, run, attempt=req.attempt, exclude=req.exclude_nodes, resume_from=req.resume_from)

    async def cancel(self, ev: Event) -> None:
        record = await runrecord.require(self.bus, ev)
        request = _request(ev)
        answer = hashlib.sha256(ev.id.encode()).hexdigest()[:12]  # one answer per request
        try:
            user, signer = await self.signers.identify(ev)
        except Refused as refused:
            await self._refuse(ev, record, answer, CancelDecision(
                request_id=ev.id, signer=ev.signer, reason=refused.issue.message, field=refused.issue.field))
            return
        if not (await self.signers.is_local_admin(signer)
                or _may_cancel(await self.signers.platform(), user, record)):
            await self._refuse(ev, record, answer, CancelDecision(
                request_id=ev.id, by=user, signer=signer, field="user",
                reason=f"{user!r} may not cancel run {record.run_id} of {record.user!r}: only its submitter, an "
                       f"admin of workspace {record.workspace!r} or a platform admin may"))
            return
        if record.state in TERMINAL:
            return
        self.cancelled[record.run_id] = None
        while len(self.cancelled) > 4096:
            self.cancelled.popitem(last=False)
        await self.bus.emit(workspace=ev.workspace, run_id=ev.subject, attempt=record.attempt,
                            event_type="cancel.accepted", dedup=answer,
                            payload=CancelDecision(request_id=ev.id, by=user, signer=signer, reason=request.reason))
        if record.resolved is not None and record.object_name:
            await self._delete_attempt(ev, record.resolved, record.attempt, reason="cancelled")
            return
        # Nothing applied yet: no backend will ever report on this run, so finish it here.
        await self.bus.emit(workspace=ev.workspace, run_id=ev.subject, attempt=record.attempt,
                            event_type="exec.cancelled",
                            payload=ExecFinished(reason="Cancelled", message="cancelled before it was applied"))

    async def _refuse(self, ev: Event, record: RunRecord, answer: str, decision: CancelDecision) -> None:
        log.warning("refused cancel of %s: %s", record.run_id, decision.reason)
        await self.bus.emit(workspace=ev.workspace, run_id=ev.subject, attempt=record.attempt,
                            event_type="cancel.refused", dedup=answer, payload=decision)

    async def _delete_attempt(self, ev: Event, run: ResolvedRun, attempt: int, *, reason: str) -> None:
        if attempt < 1:
            return
        for m in render(run, attempt=attempt):
            if m.get("kind") in _WORKLOAD_KINDS:
                await self.backend.delete(BackendDelete(
                    run_id=run.run_id, workspace=run.workspace, attempt=attempt, kind=str(m["kind"]),
                    namespace=str(m["metadata"].get("namespace", "")), name=str(m["metadata"]["name"]),
                    grace_s=run.termination_grace_s, reason=reason,
                ))


def _request(ev: Event) -> CancelRequested:
    try:
        return ev.payload(CancelRequested)
    except msgspec.DecodeError:
        return CancelRequested(reason="")


def _failed(record: RunRecord, attempt: int) -> bool:
    """Does the record show that ``attempt`` ended badly? (The projection moves a record past an attempt
    only after recording its failure, see ``states.allowed``.)"""
    return record.failed_attempt == attempt or record.attempt > attempt


def _may_cancel(platform: Platform | None, user: str, record: RunRecord) -> bool:
    """The run's submitter, an admin of its workspace, or a platform admin; on a platform with no users the
    only accepted signer is the local user, who runs the stack."""
    if user == record.user or platform is None or not platform.users:
        return True
    return user in platform.workspace_admins(record.workspace)
