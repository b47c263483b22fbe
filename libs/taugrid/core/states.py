"""The run state machine and the run record projected into the ``run_state`` KV bucket.

Invariants: a transition is accepted only from the states listed for its event; an event for an older attempt
never moves a newer one; a terminal state is entered exactly once. The RUNS stream is the truth; this record is
a projection that ``project`` can rebuild by replaying it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from taugrid.core.contracts import ContainerReport, PodSetTopology, ResolvedRun

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


class PodView(msgspec.Struct, kw_only=True):
    """One pod of the current attempt as ``exec.progress`` last showed it: its own pod-level phases."""

    name: str
    node: str = ""
    phase: str = ""  # the pod's status.phase: Pending | Running | Succeeded | Failed
    phases: list[Phase] = msgspec.field(default_factory=list)
    containers: list[ContainerReport] = msgspec.field(default_factory=list)


class RunRecord(msgspec.Struct, kw_only=True):
    run_id: str
    workspace: str
    name: str = ""
    state: str = "new"
    attempt: int = 1
    submission_id: str = ""
    user: str = ""  # the verified submitter (the submitter checked the signature); "" until accepted
    signer: str = ""  # the public nkey that signed the submission; "" once sealed (the bundle's identity has it)
    created: float = 0.0
    updated: float = 0.0
    finished: float | None = None
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    node: str = ""
    queue: str = ""
    cluster_queue: str = ""
    cluster: str = ""  # many clusters (docs §13d): the cluster that admitted the attempt first, from dispatch.chosen
    cluster_reason: str = ""
    position: int | None = None
    cancel_requested: bool = False
    cancelled_by: str = ""  # the verified canceller, from cancel.accepted
    hint: str = ""  # what to do about a failure, in the user's words (recovery's give-up hint)
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
    pods: list[PodView] = msgspec.field(default_factory=list)
    # The current attempt's topology assignment per TAS pod set (admission.admitted), domains in rank order
    topology: list[PodSetTopology] = msgspec.field(default_factory=list)
    # An elastic run's pods after its last resize in the current attempt (exec.resized; a preemption requeues it
    # at that size), and what the resize was, in words; 0 and "" when the attempt has not been resized.
    size: int = 0
    resized: str = ""
    history: list[dict[str, Any]] = msgspec.field(default_factory=list)


# TauGrid's phase tree: our own stages, then Kueue admission, then what the pods went through; ``environment``
# (the local backend building the run's Python environment inside the started pod) comes before running.
PHASE_NAMES = ("submitted", "policy", "rendered", "admission", "raycluster", "scheduling", "image-pull", "init",
               "container-start", "environment", "running", "finished")
# ``ExecFinished.reason`` of a Job's Complete condition (``kube/translate``; a RayJob's success says Succeeded).
JOB_COMPLETED = "Completed"
# Phases a run only has when it goes through them (never filled in as skipped).
OPTIONAL_PHASES = frozenset({"environment"})
# Phases that ``exec.progress`` reports (per pod, or for the RayCluster) rather than a state transition.
PROGRESS_PHASES = ("raycluster", "scheduling", "image-pull", "init", "container-start")
POD_PHASES = PROGRESS_PHASES[1:]

_PHASE_OF = {
    "submit.requested": "submitted",
    "submit.accepted": "submitted",
    "submit.rejected": "submitted",
    "policy.approved": "policy",
    "policy.rejected": "policy",
    "render.applied": "rendered",
    "render.failed": "rendered",
    "admission.queued": "admission",
    "admission.admitted": "admission",
    "admission.preempted": "admission",
    "exec.preparing": "environment",
    "exec.running": "running",
    "exec.succeeded": "finished",
    "exec.failed": "finished",
    "exec.cancelled": "finished",
    "recovery.gave_up": "finished",
}
# How bad a phase status is, to tell one phase's story from several pods: the worst pod speaks.
_SEVERITY = {"skipped": 0, "done": 1, "pending": 2, "active": 3, "warning": 4, "failed": 5}


def allowed(record: RunRecord, event_type: str, attempt: int) -> bool:
    """Would ``event_type`` for ``attempt`` move ``record``? Duplicates and stale events answer False."""
    if record.state in TERMINAL:
        return False
    rule = TRANSITIONS.get(event_type)
    if event_type == "exec.progress":
        return attempt == record.attempt and record.state not in ("new", "submitted", "accepted", "approved")
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
    if (event_type == "exec.running" and record.state == "running" and attempt == record.attempt
            and data.get("environment")):
        # The job said running first; its pod adds what the process runs with.
        record.environment = {str(k): str(v) for k, v in data["environment"].items()}
        record.updated = at
        return True
    if event_type == "exec.resized":  # an elastic run changed size; it stays running
        if record.state not in ("admitted", "running") or attempt != record.attempt:
            return False
        record.size, record.resized = int(data.get("new_count") or 0), resize_text(data)
        if record.size < int(data.get("old_count") or 0):  # the highest indices were removed; no event says so
            record.pods = [p for p in record.pods if _pod_index(record, p.name) < record.size]
        record.updated = at
        return True
    if event_type == "dispatch.chosen":  # where the run went; the state moves with the admission watcher's events
        if record.state in TERMINAL or attempt != record.attempt or not data.get("clusters"):
            return False
        record.cluster, record.cluster_reason = str(data["clusters"][0]), str(data.get("reason") or "")
        record.updated = at
        return True
    if event_type in ("dispatch.withdrawn", "dispatch.nominated"):  # the choice reopened: its cluster lost, or it
        # preempted the run; the next dispatch.chosen names the new one
        clusters = data.get("clusters") or []
        reopened = record.cluster and (event_type == "dispatch.nominated" or record.cluster in clusters)
        if record.state in TERMINAL or attempt != record.attempt or not reopened:
            return False
        record.cluster, record.cluster_reason = "", str(data.get("reason") or "")
        record.updated = at
        return True
    if not allowed(record, event_type, attempt):
        return False
    record.updated = at
    if event_type == "cancel.accepted":
        record.cancel_requested = True
        record.cancelled_by = str(data.get("by") or "")
        return True
    if event_type == "health.degraded":
        record.message = str(data.get("message", ""))
        if attempt == record.attempt and record.state in ("running", "admitted"):
            record.failed_attempt = attempt  # recovery retries a run drained off a faulty node
        return True
    if event_type == "exec.progress":
        _apply_progress(record, data, at)
        return True
    _, target = TRANSITIONS[event_type]
    record.state = target
    if event_type in ("exec.failed", "render.failed", "admission.preempted"):
        record.failed_attempt = attempt
    if event_type == "recovery.retrying":
        record.attempt = attempt
        record.phases = [p for p in record.phases if p.name in ("submitted", "policy")]
        record.environment = {}
        record.pods, record.topology, record.size, record.resized = [], [], 0, ""
    elif event_type == "admission.preempted":  # the pods are gone; the requeued workload gets new ones
        # (an elastic run keeps its size: its Workload is requeued at the count it had, as Kueue's is)
        record.pods, record.topology = [], []
        record.phases = [p for p in record.phases if PHASE_NAMES.index(p.name) <= PHASE_NAMES.index("admission")]
    if event_type == "exec.running" and data.get("pods"):
        _gang_started(record, data["pods"], at)
    _update_phases(record, event_type, data, at)
    if event_type == "exec.preparing":
        return True  # progress lives in the phase; the run's reason and message stay as they were
    if event_type == "exec.running" and data.get("environment"):
        record.environment = {str(k): str(v) for k, v in data["environment"].items()}
    # reason and message describe the state just entered, so a finished run never keeps a queued message
    record.reason, record.message = _why(record, event_type, data)
    if event_type == "recovery.gave_up":
        record.hint = str(data.get("hint") or "")
    if "exit_code" in data:
        record.exit_code = data["exit_code"]
    if data.get("node"):
        record.node = str(data["node"])
    if event_type == "admission.queued":
        record.position = data.get("position")
    if event_type in ("admission.queued", "admission.admitted") and data.get("cluster_queue"):
        record.cluster_queue = str(data["cluster_queue"])
    if event_type == "admission.admitted":
        record.topology = _topology(data.get("topology"))
    if record.state != "queued":
        record.position = None
    if event_type == "render.applied":
        record.object_kind = str(data.get("kind", ""))
        record.object_name = str(data.get("object_name", ""))
    if event_type == "exec.succeeded" and data.get("reason") == JOB_COMPLETED:
        _pods_succeeded(record)
    if record.state in TERMINAL:
        record.finished = at
    return True


def _gang_started(record: RunRecord, pods: list[dict[str, Any]], at: float) -> None:
    """An ``exec.running`` that lists the run's pods (they started together, ``ExecRunning.pods``): each is running
    on its node with its pod-level phases through, as each pod's own started ``exec.progress`` would have said."""
    for placed in pods:
        name = str(placed.get("name", ""))
        pod = next((p for p in record.pods if p.name == name), None)
        if pod is None:
            pod = PodView(name=name)
            record.pods.append(pod)
        node = str(placed.get("node", ""))
        pod.node, pod.phase = node or pod.node, "Running"
        pod.phases = [Phase(name=n, status="done", detail=f"node {node}".strip() if n == "scheduling" else "")
                      for n in POD_PHASES]
    for name in POD_PHASES:
        told = _across_pods(record.pods, name)
        if told is not None:
            _set_phase(record, told, at)


def _pods_succeeded(record: RunRecord) -> None:
    """A Job is Complete only once every index succeeded, so each pod still shown running has succeeded: the
    local cluster's simulated pods say their end no more (issue 30: it cost a watch change and an
    ``exec.progress`` a pod), and a real pod's end that came after its Job's lands on a finished record."""
    for pod in record.pods:
        if pod.phase != "Running":
            continue
        pod.phase = "Succeeded"
        pod.containers = [msgspec.structs.replace(ct, state="terminated", reason="Completed", exit_code=0)
                          if ct.state == "running" else ct for ct in pod.containers]


def _pod_index(record: RunRecord, pod: str) -> int:
    """An Indexed Job pod's completion index from its name (``<job>-<index>-<suffix>`` on Kubernetes, ``<job>-<index>``
    or ``<job>-<index>-g<stamp>`` locally; the Job is ``<run>-a<attempt>``); -1 when the name says none."""
    head = f"{record.run_id}-a{record.attempt}-"
    token = pod[len(head):].split("-", 1)[0] if pod.startswith(head) else ""
    return int(token) if token.isdigit() else -1


def resize_text(data: dict[str, Any]) -> str:
    """An ``exec.resized`` in words: ``3 -> 2 pods, given up to run r-1 (ShrunkForPreemptor), from checkpoint step
    20``; its message, when it has one, says why (``node g2 drained: XID 79``)."""
    why = str(data.get("message") or "") or {
        "Grown": "quota freed", "ShrunkForPreemptor": f"given up to run {data.get('preemptor') or '?'}",
        "Shrunk": "asked to shrink"}.get(str(data.get("cause") or ""), "resized")
    step = data.get("checkpoint_step")
    resume = f", from checkpoint step {step}" if step is not None else ""
    return f"{data.get('old_count')} -> {data.get('new_count')} pods, {why} ({data.get('cause') or '?'}){resume}"


def _topology(raw: Any) -> list[PodSetTopology]:
    """The admission's topology assignments; one that does not fit the contract says nothing (the run moves on)."""
    try:
        return msgspec.convert(raw or [], list[PodSetTopology])
    except msgspec.ValidationError:
        return []


def _why(record: RunRecord, event_type: str, data: dict[str, Any]) -> tuple[str, str]:
    """(reason, message) of the state ``event_type`` just moved ``record`` into."""
    if event_type.endswith("rejected"):
        reasons = data.get("reasons") or []
        first = reasons[0] if reasons else {}
        field = f"{first.get('field')}: " if first.get("field") else ""
        return (f"{field}{first.get('message', '')}" if first else "rejected"), str(data.get("message") or "")
    if event_type == "exec.cancelled" and record.cancel_requested:
        return "Cancelled", f"cancelled by {record.cancelled_by or 'a user'}"
    if event_type == "recovery.gave_up" and not data.get("message"):
        return str(data.get("reason") or ""), record.message  # keep the failed attempt's own message
    return str(data.get("reason") or ""), str(data.get("message") or "")


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
        elif p.status in ("active", "pending", "warning") and not (failed and earlier in POD_PHASES):
            # reaching a later phase means this one was passed; a failure does not (a pod that never
            # started its container stays where it stopped)
            p.status, p.finished = "done", at
    phase = by_name.get(name)
    if phase is None:
        phase = Phase(name=name, started=at)
        record.phases.append(phase)
    if event_type == "exec.preparing":
        phase.status, phase.detail = "active", str(data.get("message", ""))
    elif event_type == "admission.queued":
        phase.status, phase.detail, phase.hint = "active", _queued_detail(data), queued_hint(data)
        phase.finished = None
    elif event_type == "admission.preempted":
        phase.status, phase.detail = "warning", f"preempted: {data.get('reason', '')}"
    elif failed:
        phase.status, phase.finished = "failed", at
        phase.detail = str(data.get("reason") or data.get("message") or "")
        if name == "finished":  # recovery's advice first, then the attempt's own
            phase.hint = str(data.get("hint") or "") or failure_hint(data) or phase.hint
        if event_type == "exec.cancelled" and record.cancel_requested:
            phase.detail = f"cancelled by {record.cancelled_by or 'a user'}"
    elif name == "running":
        phase.status = "active"
        phase.detail = f"node {data.get('node', '')}".strip()
    else:
        phase.status, phase.finished = "done", at
        if name == "finished":
            phase.detail = "succeeded"
        elif name == "admission":
            phase.detail = f"clusterqueue {data.get('cluster_queue', '')}".strip()
            phase.hint = ""
    record.phases.sort(key=lambda p: PHASE_NAMES.index(p.name))


def _apply_progress(record: RunRecord, data: dict[str, Any], at: float) -> None:
    """Fold one ``exec.progress`` into the pod it names, then retell each pod-level phase from all pods."""
    reports = [Phase(name=str(r.get("name", "")), status=str(r.get("status", "pending")),
                     detail=str(r.get("detail", "")), hint=str(r.get("hint", "")))
               for r in data.get("phases") or [] if r.get("name") in PROGRESS_PHASES]
    pod_name = str(data.get("pod", ""))
    if not pod_name:  # the RayCluster: one per run, not per pod
        for report in reports:
            _set_phase(record, report, at)
        return
    pod = next((p for p in record.pods if p.name == pod_name), None)
    if pod is None:
        pod = PodView(name=pod_name)
        record.pods.append(pod)
    by_name = {p.name: p for p in pod.phases}
    from_event = data.get("source") == "event"
    for report in reports:
        known = by_name.get(report.name)
        if from_event and known is not None and known.status in ("done", "failed", "skipped"):
            continue  # an Event is a warning about a moment; it never undoes what the pod's status showed
        if not from_event and known is not None and known.status == "warning" and report.status in (
                "active", "pending"):
            continue  # keep the warning until the pod gets past the phase
        by_name[report.name] = report
    pod.phases = [by_name[n] for n in POD_PHASES if n in by_name]
    if not from_event:
        pod.node = str(data.get("node", "")) or pod.node
        pod.phase = str(data.get("pod_phase", "")) or pod.phase
        pod.containers = [ContainerReport(**c) for c in data.get("containers") or []]
    for name in POD_PHASES:
        told = _across_pods(record.pods, name)
        if told is not None:
            _set_phase(record, told, at)


def _across_pods(pods: list[PodView], name: str) -> Phase | None:
    """One phase's status over every pod: the worst pod's status, detail and hint, with a count when several."""
    seen = [(pod, p) for pod in pods for p in pod.phases if p.name == name]
    if not seen:
        return None
    pod, worst = max(seen, key=lambda pp: _SEVERITY.get(pp[1].status, 0))
    if len(pods) == 1:
        return Phase(name=name, status=worst.status, detail=worst.detail, hint=worst.hint)
    through = sum(1 for _, p in seen if p.status in ("done", "skipped"))
    detail = f"{through}/{len(pods)} pods"
    if worst.status not in ("done", "skipped") and worst.detail:
        detail += f"; {pod.name}: {worst.detail}"
    return Phase(name=name, status=worst.status, detail=detail, hint=worst.hint)


def _set_phase(record: RunRecord, told: Phase, at: float) -> None:
    phase = next((p for p in record.phases if p.name == told.name), None)
    if phase is None:
        phase = Phase(name=told.name)
        record.phases.append(phase)
        record.phases.sort(key=lambda p: PHASE_NAMES.index(p.name))
    if phase.started is None and told.status != "pending":
        phase.started = at
    phase.status, phase.detail, phase.hint = told.status, told.detail, told.hint
    phase.finished = (phase.finished or at) if told.status in ("done", "failed", "skipped") else None


def failure_hint(data: dict[str, Any]) -> str:
    """What to do about a finished attempt's failure, from its reason and exit code."""
    reason = str(data.get("reason", ""))
    code = data.get("exit_code")
    if reason == "OOMKilled":
        return "the process used more memory than compute.memory allows: raise it or use less (smaller batches)"
    if reason == "DeadlineExceeded":
        return "the run hit its time limit (run.active_deadline, capped by the platform): raise it or checkpoint"
    if reason == "Hang":
        return "the run printed nothing for resilience.hang_timeout: check for a deadlock or raise the timeout"
    if reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"):
        return "the image cannot be pulled: check the image name and the namespace's imagePullSecrets"
    if reason == "CreateContainerConfigError":
        return "a Secret or ConfigMap the pod references is missing or lacks the key: create it in the namespace"
    if reason in ("Evicted", "PreemptionByScheduler", "DeletionByTaintManager", "TerminationByKubelet",
                  "NodeFailure", "GpuFault"):
        return "the node, not the code, ended the pod: recovery retries it elsewhere while retries remain"
    if reason.startswith("EnvironmentFailed"):  # the pod's 128 is no exit status of the code, which never ran
        return "the run's environment could not be built, so the code never ran: fix the requirement it names"
    if isinstance(code, int) and code != 0:
        return f"the code exited with status {code}: `tau logs RUN` shows its output"
    return ""


def _queued_detail(data: dict[str, Any]) -> str:
    parts = [str(data.get("reason", ""))]
    if isinstance(data.get("position"), int):  # runs ahead of it: shown 1-based, as `tau queue` and `tau top` do
        parts.append(f"#{data['position'] + 1} in line")
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
