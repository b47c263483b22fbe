"""The run state machine and the run record projected into the ``run_state`` KV bucket.

Invariants: a transition is accepted only from the states listed for its event; an event for an older attempt
never moves a newer one; a terminal state is entered exactly once. The RUNS stream is the truth; this record is
a projection that ``project`` can rebuild by replaying it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from taugrid.core.contracts import ResolvedRun

TERMINAL = frozenset({"succeeded", "failed", "rejected", "cancelled"})

# event type → (allowed from-states, to-state). "*" = any non-terminal state.
TRANSITIONS: dict[str, tuple[frozenset[str] | str, str]] = {
    "submit.requested": (frozenset({"new"}), "submitted"),
    "submit.accepted": (frozenset({"new", "submitted"}), "accepted"),
    "submit.rejected": (frozenset({"new", "submitted"}), "rejected"),
    "policy.approved": (frozenset({"accepted"}), "approved"),
    "policy.rejected": (frozenset({"accepted"}), "rejected"),
    "render.applied": (frozenset({"approved", "retrying"}), "rendered"),
    "render.failed": (frozenset({"approved", "retrying"}), "rendered"),
    "admission.queued": (frozenset({"rendered", "queued", "preempted"}), "queued"),
    "admission.admitted": (frozenset({"rendered", "queued", "preempted"}), "admitted"),
    "admission.preempted": (frozenset({"admitted", "running", "queued"}), "preempted"),
    # Preparing the pod (locally: building its Python environment) keeps the run admitted.
    "exec.preparing": (frozenset({"admitted"}), "admitted"),
    "exec.running": (frozenset({"rendered", "queued", "admitted"}), "running"),
    "exec.succeeded": ("*", "succeeded"),
    "exec.failed": ("*", "failing"),
    "exec.cancelled": ("*", "cancelled"),
    "recovery.retrying": (frozenset({"failing", "preempted", "rendered", "running", "admitted"}), "retrying"),
    "recovery.gave_up": ("*", "failed"),
}

# Events that belong to one attempt; stale attempts are ignored for these.
ATTEMPT_SCOPED = frozenset(
    {"render.applied", "render.failed", "admission.queued", "admission.admitted", "admission.preempted",
     "exec.preparing", "exec.running", "exec.succeeded", "exec.failed"}
)


class Phase(msgspec.Struct, kw_only=True):
    name: str
    status: str = "pending"  # pending | active | done | warning | failed | skipped
    started: float | None = None
    finished: float | None = None
    detail: str = ""
    hint: str = ""


class RunRecord(msgspec.Struct, kw_only=True):
    run_id: str
    workspace: str
    name: str = ""
    state: str = "new"
    attempt: int = 1
    submission_id: str = ""
    user: str = ""  # the verified submitter (the submitter checked the signature); "" until accepted
    signer: str = ""  # the public nkey that signed the submission
    created: float = 0.0
    updated: float = 0.0
    finished: float | None = None
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    node: str = ""
    queue: str = ""
    cluster_queue: str = ""
    position: int | None = None
    cancel_requested: bool = False
    failed_attempt: int = 0  # the latest attempt recorded as failed, preempted or degraded (a retry replaces it)
    exclude_nodes: list[str] = msgspec.field(default_factory=list)
    resolved: ResolvedRun | None = None
    object_kind: str = ""
    object_name: str = ""
    evidence_digest: str = ""
    # What the current attempt runs with, as the backend reported it (ExecRunning.environment).
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    last_seq: int = 0
    phases: list[Phase] = msgspec.field(default_factory=list)
    history: list[dict[str, Any]] = msgspec.field(default_factory=list)


PHASE_NAMES = ("submitted", "policy", "rendered", "queued", "admitted", "environment", "running", "finished")
# Phases a run only has when it goes through them (never filled in as skipped).
OPTIONAL_PHASES = frozenset({"environment"})

_PHASE_OF = {
    "submit.requested": "submitted",
    "submit.accepted": "submitted",
    "submit.rejected": "submitted",
    "policy.approved": "policy",
    "policy.rejected": "policy",
    "render.applied": "rendered",
    "render.failed": "rendered",
    "admission.queued": "queued",
    "admission.admitted": "admitted",
    "admission.preempted": "admitted",
    "exec.preparing": "environment",
    "exec.running": "running",
    "exec.succeeded": "finished",
    "exec.failed": "finished",
    "exec.cancelled": "finished",
    "recovery.gave_up": "finished",
}


def allowed(record: RunRecord, event_type: str, attempt: int) -> bool:
    """Would ``event_type`` for ``attempt`` move ``record``? Duplicates and stale events answer False."""
    if record.state in TERMINAL:
        return False
    rule = TRANSITIONS.get(event_type)
    if rule is None:  # a cancel counts once the renderer authorized it; a request alone changes nothing
        return event_type in ("cancel.accepted", "health.degraded") and not record.cancel_requested
    if event_type in ATTEMPT_SCOPED and attempt != record.attempt:
        return False
    if event_type == "recovery.retrying":
        # Only the next attempt, and only after the current one is recorded as having ended badly: a retry
        # for a healthy run is never applied, whoever claims to have sent it.
        return attempt == record.attempt + 1 and record.failed_attempt == record.attempt
    sources, _ = rule
    return sources == "*" or record.state in sources


def apply(record: RunRecord, event_type: str, attempt: int, data: dict[str, Any], at: float) -> bool:
    """Advance ``record`` in place. Returns False (and changes nothing) for an invalid or stale transition."""
    if not allowed(record, event_type, attempt):
        return False
    record.updated = at
    if event_type == "cancel.accepted":
        record.cancel_requested = True
        return True
    if event_type == "health.degraded":
        record.message = str(data.get("message", ""))
        if attempt == record.attempt and record.state in ("running", "admitted"):
            record.failed_attempt = attempt  # recovery retries a run drained off a faulty node
        return True
    _, target = TRANSITIONS[event_type]
    record.state = target
    if event_type in ("exec.failed", "render.failed", "admission.preempted"):
        record.failed_attempt = attempt
    if event_type == "recovery.retrying":
        record.attempt = attempt
        record.phases = [p for p in record.phases if p.name in ("submitted", "policy")]
        record.environment = {}
    _update_phases(record, event_type, data, at)
    if event_type == "exec.preparing":
        return True  # progress lives in the phase; the run's reason and message stay as they were
    if event_type == "exec.running" and data.get("environment"):
        record.environment = {str(k): str(v) for k, v in data["environment"].items()}
    for key in ("reason", "message"):
        if data.get(key):
            setattr(record, key, str(data[key]))
    if "exit_code" in data:
        record.exit_code = data["exit_code"]
    if data.get("node"):
        record.node = str(data["node"])
    if event_type == "admission.queued":
        record.position = data.get("position")
        record.cluster_queue = str(data.get("cluster_queue", record.cluster_queue))
    if event_type == "render.applied":
        record.object_kind = str(data.get("kind", ""))
        record.object_name = str(data.get("object_name", ""))
    if record.state in TERMINAL:
        record.finished = at
    return True


def _update_phases(record: RunRecord, event_type: str, data: dict[str, Any], at: float) -> None:
    name = _PHASE_OF.get(event_type)
    if name is None:
        return
    by_name = {p.name: p for p in record.phases}
    idx = PHASE_NAMES.index(name)
    failed = event_type.endswith(("rejected", "failed", "gave_up", "cancelled")) or event_type == "render.failed"
    for earlier in PHASE_NAMES[:idx]:
        p = by_name.get(earlier)
        if p is None and earlier in OPTIONAL_PHASES:
            continue
        if p is None:
            p = Phase(name=earlier, status="skipped", started=at, finished=at)
            record.phases.append(p)
            by_name[earlier] = p
        elif p.status == "active" and failed and earlier in OPTIONAL_PHASES:
            p.status, p.finished = "failed", at  # e.g. the environment build is what failed
        elif p.status in ("active", "pending", "warning"):
            p.status, p.finished = "done", at
    phase = by_name.get(name)
    if phase is None:
        phase = Phase(name=name, started=at)
        record.phases.append(phase)
    if event_type == "exec.preparing":
        phase.status, phase.detail = "active", str(data.get("message", ""))
    elif event_type == "admission.queued":
        phase.status, phase.detail, phase.hint = "active", _queued_detail(data), queued_hint(data)
    elif event_type == "admission.preempted":
        phase.status, phase.detail = "warning", f"preempted: {data.get('reason', '')}"
    elif failed:
        phase.status, phase.finished = "failed", at
        phase.detail = str(data.get("reason") or data.get("message") or "")
    elif name == "running":
        phase.status = "active"
        phase.detail = f"node {data.get('node', '')}".strip()
    else:
        phase.status, phase.finished = "done", at
        if name == "finished":
            phase.detail = "succeeded"
        elif name == "admitted":
            phase.detail = f"clusterqueue {data.get('cluster_queue', '')}".strip()
    record.phases.sort(key=lambda p: PHASE_NAMES.index(p.name))


def _queued_detail(data: dict[str, Any]) -> str:
    parts = [str(data.get("reason", ""))]
    if data.get("position") is not None:
        parts.append(f"position {data['position']}")
    if data.get("message"):
        parts.append(str(data["message"]))
    return " — ".join(p for p in parts if p)


def queued_hint(data: dict[str, Any]) -> str:
    """Why a run waits, in a researcher's words: which resource, which flavor, how far back in line."""
    reason = str(data.get("reason", ""))
    wf = data.get("waiting_for") or {}
    ahead = data.get("position")
    line = f"; {ahead} run(s) ahead of it" if isinstance(ahead, int) and ahead > 0 else ""
    if wf.get("resource"):
        return (f"the queue needs {wf.get('more_needed')} more {wf['resource']} in flavor {wf.get('flavor')} "
                f"free before this run fits{line}")
    if reason == "Unschedulable":
        return "no node can take it now (full, or cordoned until it passes re-validation)" + line
    if reason == "WaitingForPreemptedWorkloads":
        return "lower-priority runs are being preempted to make room" + line
    if reason in ("Backoff", "Requeued"):
        return "requeued after an eviction; it is retried after a backoff" + line
    if reason == "Inadmissible":
        return "it can never fit this queue as configured: ask the platform team or change compute.*"
    return line.removeprefix("; ")
