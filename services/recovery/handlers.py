"""The retry decision on the bus. Idempotent: a decision is keyed by the failed attempt (the message id of
``recovery.retrying`` names the next attempt), and the run record's attempt guards against stale events.

An ``exec.failed`` that does not already name a platform fault is checked against the node's health record
(``health.blame``) first, so a GPU fault that killed the process is retried on another node whether the
failure or ``health.degraded`` arrives first; while the node's agent has not sampled since the failure, the
decision waits (``TemporaryError``) up to ``settle_s``, but only for a sudden death of a run on the node's GPUs
or across nodes (``blame.may_wait``): every other failure is decided as soon as it arrives.

The decision is published at once; a retry's backoff is not waited out here: ``recovery.retrying`` carries
``not_before`` and the renderer holds the next attempt until then."""

from __future__ import annotations

import datetime as dt
import time

import msgspec

from taugrid import runrecord
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.classify import classify, decide
from taugrid.core.contracts import (
    ExecFinished,
    HealthDegraded,
    RecoveryGaveUp,
    RecoveryRetrying,
    RenderFailed,
)
from taugrid.core.errors import TemporaryError
from taugrid.core.states import TERMINAL
from taugrid.health.blame import blame, may_wait
from taugrid.health.monitor import read_state

PLATFORM_FAULTS = ("gpu_fault", "node_failure")
# How often a decision that waits for the node's next sample looks again (each look is a delivery: the durable's
# max_deliver, 8, bounds how many).
SAMPLE_POLL_S = 1.0


def _event_time(ev: Event) -> float:
    try:
        return dt.datetime.fromisoformat(ev.time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


class Recovery:
    def __init__(self, bus: Bus, *, settle_s: float = 10.0) -> None:
        """``settle_s``: how long a failure waits for its node's next health sample (about two sample
        intervals of the node agent) before it is judged the run's own."""
        self.bus, self.settle_s = bus, settle_s

    async def on_event(self, ev: Event) -> None:
        if ev.type == "admission.preempted":
            return  # the queue (Kueue or the local cluster) requeues a preempted workload itself
        record, run = await runrecord.require_resolved(self.bus, ev)
        if record.state in TERMINAL or record.cancel_requested or ev.attempt < record.attempt:
            return
        node, exit_code, reason, message = "", None, "", ""
        if ev.type == "exec.failed":
            fin = ev.payload(ExecFinished)
            node, exit_code, reason, message = fin.node or record.node, fin.exit_code, fin.reason, fin.message
            cls = classify(reason, exit_code)
            if node and cls not in PLATFORM_FAULTS:
                state, _ = await read_state(self.bus, node)
                settle = self.settle_s if may_wait(run, cls) else 0.0
                b = blame(state, failed_at=_event_time(ev), now=time.time(), settle_s=settle)
                if b.verdict == "wait":
                    raise TemporaryError(f"{b.message}; deciding after its next sample", delay=SAMPLE_POLL_S)
                if b.verdict == "node":
                    reason, message = "GpuFault", f"{b.condition} on node {node}: {b.message} (the attempt ended " \
                                                  f"{fin.reason or 'failed'}: {fin.message})"
        elif ev.type == "render.failed":
            rf = ev.payload(RenderFailed)
            reason, message = "InvalidManifest" if rf.permanent else rf.reason, rf.message
            if rf.permanent:
                await self._give_up(ev, "config", reason, message, record.attempt,
                                    hint="fix the config (see the message) and submit again")
                return
        elif ev.type == "health.degraded":
            hd = ev.payload(HealthDegraded)
            node, reason, message = hd.node, "GpuFault", f"{hd.condition}: {hd.message}"
            if record.state not in ("running", "admitted"):
                return
        d = decide(reason=reason, exit_code=exit_code, attempt=ev.attempt, resilience=run.resilience,
                   event_type=ev.type)
        if not d.retry:
            await self._give_up(ev, d.classification, d.reason, message, ev.attempt, hint=d.hint)
            return
        resume = run.resilience.checkpoint_path or run.checkpoint_dir
        env = {**run.env, "TAU_RETRY_REASON": reason or d.classification, "TAU_RESUME_FROM": resume}
        exclude = sorted({*record.exclude_nodes, *([node] if d.exclude_node and node else [])})
        nxt = ev.attempt + 1
        await self.bus.emit(
            workspace=ev.workspace, run_id=ev.subject, attempt=nxt, event_type="recovery.retrying",
            payload=RecoveryRetrying(
                attempt=nxt, reason=reason or d.classification, classification=d.classification,
                delay_s=d.delay_s, not_before=time.time() + d.delay_s, resume_from=resume, exclude_nodes=exclude,
                run=msgspec.structs.replace(run, env=env),
            ),
        )

    async def _give_up(self, ev: Event, cls: str, reason: str, message: str, attempts: int, *,
                       hint: str = "") -> None:
        await self.bus.emit(workspace=ev.workspace, run_id=ev.subject, attempt=ev.attempt,
                            event_type="recovery.gave_up",
                            payload=RecoveryGaveUp(reason=reason, classification=cls, attempts=attempts,
                                                   message=message, hint=hint))

