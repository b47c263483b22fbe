"""Render, validate, apply. Idempotent: the same run and attempt always give the same object name and
manifests; the backend apply is keyed by run+attempt and ``render.applied`` by its deterministic id.

A retry renders the attempt with the ``exclude_nodes`` that recovery chose (a required node anti-affinity).
Trace continuity on Kubernetes: the objects handed to the backend carry ``taugrid.io/traceparent`` (on their
metadata and pod templates), which kube-bridge puts back on every watch event it republishes. The value is
the triggering event's own ``traceparent`` header, not this delivery's span: it is the same on every
redelivery, so a re-apply stays a no-op (a Job's pod template is immutable once it has started). The
annotation is stamped after rendering and validating, onto copies: ``render.applied`` carries the manifests
as rendered, without it, and its ``digest`` is ``manifest_digest`` of exactly those.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from taugrid.bus import runstate
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.contracts import (
    BackendApply,
    BackendDelete,
    ExecFinished,
    PolicyApproved,
    RecoveryRetrying,
    RenderApplied,
    RenderFailed,
    ResolvedRun,
)
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.states import TERMINAL
from taugrid.render import (
    TRACEPARENT_ANNOTATION,
    RenderSettings,
    manifest_digest,
    render,
    with_annotation,
)
from taugrid.render.validate import validate

log = logging.getLogger("taugrid.renderer")

# Objects the backend must delete to stop a run (the Service of a multi-node Job goes with its owner).
_WORKLOAD_KINDS = ("Job", "RayJob")


class Renderer:
    def __init__(self, bus: Bus, backend: Any, settings: RenderSettings | None = None) -> None:
        self.bus, self.backend = bus, backend
        # Where the source-fetch init container comes from (TAU_SOURCE_FETCH_* from the chart).
        self.settings = settings or RenderSettings.from_env()

    async def on_event(self, ev: Event) -> None:
        if ev.type == "policy.approved":
            await self.apply(ev, ev.payload(PolicyApproved).run, attempt=1, exclude=[])
        elif ev.type == "recovery.retrying":
            await self.retry(ev, ev.payload(RecoveryRetrying))
        elif ev.type == "cancel.requested":
            await self.cancel(ev)

    async def apply(self, ev: Event, run: ResolvedRun, *, attempt: int, exclude: list[str],
                    resume_from: str = "") -> None:
        record, _ = await runstate.get(self.bus, run.run_id)
        if record is not None and (record.cancel_requested or record.state in TERMINAL):
            return
        try:
            manifests = render(run, attempt=attempt, resume_from=resume_from, exclude_nodes=exclude,
                               settings=self.settings)
            for m in manifests:
                validate(m)
        except PermanentError as err:
            await self.bus.emit(workspace=ev.workspace, run_id=run.run_id, attempt=attempt,
                                event_type="render.failed",
                                payload=RenderFailed(attempt=attempt, reason="InvalidManifest", message=str(err)))
            return
        digest = manifest_digest(manifests)
        applied = manifests
        if ev.traceparent:
            applied = with_annotation(manifests, TRACEPARENT_ANNOTATION, ev.traceparent)
        await self.backend.apply(BackendApply(
            run_id=run.run_id, workspace=run.workspace, attempt=attempt, manifests=applied,
            source_object=run.source_object, exclude_nodes=exclude, python=run.python,
            python_source=run.python_source, image=run.image, pip=list(run.pip),
        ))
        log.info("applied %s attempt %d via %s", run.run_id, attempt, self.backend.name)
        main = next((m for m in manifests if m.get("kind") in _WORKLOAD_KINDS), manifests[0])
        await self.bus.emit(
            workspace=ev.workspace, run_id=run.run_id, attempt=attempt, event_type="render.applied",
            payload=RenderApplied(attempt=attempt, backend=self.backend.name, kind=str(main["kind"]),
                                  object_name=str(main["metadata"]["name"]), manifests=manifests,
                                  digest=digest),
        )

    async def retry(self, ev: Event, req: RecoveryRetrying) -> None:
        wait = req.not_before - time.time()
        if wait > 0.05:
            raise TemporaryError(f"backoff before attempt {req.attempt}", delay=min(wait, 600.0))
        run = req.run
        if run is None:
            record, _ = await runstate.get(self.bus, ev.subject)
            if record is None or record.resolved is None:
                raise TemporaryError("run record not projected yet", delay=0.5)
            run = record.resolved
        await self._delete_attempt(ev, run, req.attempt - 1, reason="superseded by a retry")
        await self.apply(ev, run, attempt=req.attempt, exclude=req.exclude_nodes, resume_from=req.resume_from)

    async def cancel(self, ev: Event) -> None:
        record, _ = await runstate.get(self.bus, ev.subject)
        if record is None:
            raise TemporaryError("run record not projected yet", delay=0.5)
        if record.state in TERMINAL:
            return
        if record.resolved is not None and record.object_name:
            await self._delete_attempt(ev, record.resolved, record.attempt, reason="cancelled")
            return
        # Nothing applied yet: no backend will ever report on this run, so finish it here.
        await self.bus.emit(workspace=ev.workspace, run_id=ev.subject, attempt=record.attempt,
                            event_type="exec.cancelled",
                            payload=ExecFinished(reason="Cancelled", message="cancelled before it was applied"))

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
