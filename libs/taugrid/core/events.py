"""The event catalogue: which ``<stage>.<outcome>`` exists, what payload it carries, and where it is published.

Subjects: ``run.<workspace>.<run_id>.<stage>.<outcome>``. The CloudEvents type adds a version suffix
(``io.taugrid.run.policy.approved.v1``); versions live in the type, never in the subject.

Priority lanes: the events that the stages before admission consume (``LANED_EVENTS``) of a run in the high
lane carry a sixth token, ``run.<workspace>.<run_id>.<stage>.<outcome>.high``, so each of those stages reads
them with a durable of its own and a high-priority run never waits behind a low-priority backlog. Every other
event of the run (and every event of a run in the default lane) has the five tokens. On the embedded stack the
local cluster does the same for the watch changes of a high-lane run's objects (``k8s.….<change>.high``), which
the admission watcher turns into ``admission.admitted``.
"""

from __future__ import annotations

import msgspec

from taugrid.core import contracts as c
from taugrid.core.ids import token

CE_PREFIX = "io.taugrid."

RUN_EVENTS: dict[str, type[msgspec.Struct]] = {
    "submit.requested": c.SubmitRequested,
    "submit.accepted": c.SubmitAccepted,
    "submit.rejected": c.Rejected,
    "policy.approved": c.PolicyApproved,
    "policy.rejected": c.Rejected,
    "render.applied": c.RenderApplied,
    "render.failed": c.RenderFailed,
    "admission.queued": c.AdmissionQueued,
    "admission.admitted": c.AdmissionAdmitted,
    "admission.preempted": c.AdmissionPreempted,
    "exec.preparing": c.ExecPreparing,
    "exec.running": c.ExecRunning,
    "exec.progress": c.ExecProgress,
    "exec.resized": c.ExecResized,
    "exec.succeeded": c.ExecFinished,
    "exec.failed": c.ExecFinished,
    "exec.cancelled": c.ExecFinished,
    "cancel.requested": c.CancelRequested,
    "cancel.accepted": c.CancelDecision,
    "cancel.refused": c.CancelDecision,
    "recovery.retrying": c.RecoveryRetrying,
    "recovery.gave_up": c.RecoveryGaveUp,
    "health.degraded": c.HealthDegraded,
    "evidence.sealed": c.EvidenceSealed,
    # the dispatcher across clusters (docs §13d): where a run's copies went, which cluster won, what was withdrawn
    "dispatch.nominated": c.DispatchStep,
    "dispatch.chosen": c.DispatchStep,
    "dispatch.withdrawn": c.DispatchStep,
    "dispatch.granted": c.DispatchStep,  # one cluster at a time may preempt for the run: this one now
}

# Events after which a run never changes state again (evidence.sealed follows them).
TERMINAL_EVENTS = frozenset(
    {"submit.rejected", "policy.rejected", "exec.succeeded", "exec.cancelled", "recovery.gave_up"}
)


HIGH_LANE = "high"
# What the stages before admission consume (submitter, policy, renderer): only these travel in a lane.
LANED_EVENTS = frozenset({"submit.requested", "submit.accepted", "policy.approved"})


def run_subject(workspace: str, run_id: str, event_type: str, *, lane: str = "") -> str:
    """The subject of a run event; ``lane`` (``HIGH_LANE`` or "") only for ``LANED_EVENTS``."""
    base = f"run.{token(workspace)}.{token(run_id)}.{event_type}"
    if not lane:
        return base
    if lane != HIGH_LANE or event_type not in LANED_EVENTS:
        raise ValueError(f"no lane {lane!r} for {event_type}: only {sorted(LANED_EVENTS)} travel in the "
                         f"{HIGH_LANE!r} lane")
    return f"{base}.{lane}"


def parse_run_subject(subject: str) -> tuple[str, str, str]:
    """``run.ws.id.stage.outcome[.high]`` → (workspace, run_id, "stage.outcome")."""
    parts = subject.split(".")
    if parts[0] != "run" or not (len(parts) == 5 or (len(parts) == 6 and parts[5] == HIGH_LANE)):
        raise ValueError(f"not a run subject: {subject!r}")
    return parts[1], parts[2], f"{parts[3]}.{parts[4]}"


# Tokens of a subject in the high lane, per family: run.<ws>.<run>.<family>.<type>.high,
# backend.<cluster>.<verb>.high and k8s.<cluster>.<kind>.<namespace>.<name>.<change>.high.
_LANED_LENGTH = {"run": 6, "backend": 4, "k8s": 7}


def lane_of(subject: str) -> str:
    """The lane a run event's, backend request's or watch change's subject travels in: ``HIGH_LANE`` or "" (the
    default lane)."""
    parts = subject.split(".")
    return HIGH_LANE if len(parts) == _LANED_LENGTH.get(parts[0]) and parts[-1] == HIGH_LANE else ""


def ce_type(event_type: str, *, family: str = "run", version: int = 1) -> str:
    return f"{CE_PREFIX}{family}.{event_type}.v{version}"


def short_type(ce: str) -> str:
    """``io.taugrid.run.policy.approved.v1`` → ``policy.approved``."""
    body = ce.removeprefix(CE_PREFIX)
    parts = body.split(".")
    if parts and parts[-1].startswith("v") and parts[-1][1:].isdigit():
        parts = parts[:-1]
    return ".".join(parts[1:]) if len(parts) > 2 else ".".join(parts)


def k8s_subject(cluster: str, kind: str, namespace: str, name: str, change: str, *, lane: str = "") -> str:
    """A watch change's subject; the local cluster appends ``HIGH_LANE`` for the objects of a high-lane run, so
    the admission watcher reads them (``admission.admitted`` above all) on a durable of their own."""
    base = f"k8s.{token(cluster)}.{token(kind.lower())}.{token(namespace or '_')}.{token(name)}.{change.lower()}"
    if lane and lane != HIGH_LANE:
        raise ValueError(f"no lane {lane!r}: the only lane is {HIGH_LANE!r}")
    return f"{base}.{lane}" if lane else base


def node_subject(node: str, what: str) -> str:
    return f"node.{token(node)}.{what}"


def log_subject(workspace: str, run_id: str, attempt: int) -> str:
    return f"log.{token(workspace)}.{token(run_id)}.{attempt}"


def backend_subject(cluster: str, verb: str) -> str:
    return f"backend.{token(cluster)}.{verb}"


def message_id(run_id: str, attempt: int, event_type: str, *, suffix: str = "") -> str:
    """Deterministic ``Nats-Msg-Id``: a redelivered handler that publishes again is deduplicated."""
    base = f"{run_id}.{attempt}.{event_type}"
    return f"{base}.{suffix}" if suffix else base
