"""Kubernetes-shaped watch events → run lifecycle events (``admission.*``, ``exec.*``).

Pure: no I/O, no clock, no state of its own. Used by both backends, because the embedded local backend
publishes exactly Kubernetes-shaped objects (Workload, Job, RayJob, Pod).

Which run an object belongs to:
  * Job, RayJob (and our pods, whose template the renderer labels) carry the tau labels
    ``taugrid.io/run-id``, ``taugrid.io/workspace``, ``taugrid.io/attempt`` — ``run_ref(obj)`` reads them.
  * A real Kueue Workload does NOT copy our labels. It carries ``kueue.x-k8s.io/job-uid`` and an
    ownerReference to the Job/RayJob. So ``translate`` takes ``owners``: job uid → RunRef, which the caller
    fills from Job/RayJob events (``remember_owner(ev, owners)`` does exactly that). Pods without tau labels
    resolve the same way through their ownerReferences / ``controller-uid`` labels. ``awaits_owner`` tells
    a caller whose map lacks the owner of one of our Workloads to wait for it rather than drop the event.

Trace: ``traceparent_of(obj)`` reads the run's ``taugrid.io/traceparent`` annotation (stamped by the renderer
service on objects and pod templates; a Workload has it on the pod templates Kueue copied).

Invariants:
  * Same object state ⇒ same output, including ``dedup``; a changed fact (a new queue reason, a new
    admission after eviction) ⇒ a new ``dedup``. ``dedup`` is the suffix of the deterministic Nats-Msg-Id.
  * Terminal events (``exec.succeeded|failed|cancelled``) and ``exec.running`` use ``dedup=""``: one per
    attempt, whichever source (pod or job) reports it first wins; the pod usually does, with the exit code.
    A pod's ``exec.running`` is the exception (``dedup`` its name: a requeued gang's new pods run again), and
    only the job's first rank says it (``first_rank``): one per run, not one per pod (issue 30); every pod's
    node is in its ``exec.progress``.
  * Succeeded comes only from the Job/RayJob (one pod of a multi-node job finishing is not the run
    finishing); failed may come from a pod, since the renderer sets ``backoffLimit: 0`` (retries are
    recovery's business, per run attempt).
  * Only a container named ``main`` speaks for the run's process; Ray head/worker/submitter pods report
    scheduling and image problems only (the RayJob status speaks for the Ray job).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, MutableMapping
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from taugrid.core import contracts as c
from taugrid.core import topologyassignment
from taugrid.core.states import JOB_COMPLETED

log = logging.getLogger("taugrid.kube.translate")

LABEL_RUN_ID = "taugrid.io/run-id"
LABEL_WORKSPACE = "taugrid.io/workspace"
LABEL_ATTEMPT = "taugrid.io/attempt"
LABEL_MANAGED_BY = "taugrid.io/managed-by"
# Stamped by the renderer service on what it applies (objects and pod templates); same key as
# ``taugrid.render.TRACEPARENT_ANNOTATION``, repeated here so this module stays free of the renderer.
ANNOTATION_TRACEPARENT = "taugrid.io/traceparent"
ANNOTATION_QUEUE_POSITION = "taugrid.io/queue-position"
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
# On a Job/RayJob: its Workload and pods carry the run labels themselves (the local cluster's do; Kueue's
# Workloads never), so no replica ever needs its uid resolved: the admission watcher does not record it in KV.
ANNOTATION_RUN_LABELLED = "taugrid.io/run-labelled"
# On an evicted Workload: the run whose job preempted it (the local cluster knows it; Kueue names only the job
# uid, which the admission watcher resolves through the ``bridge`` KV bucket).
ANNOTATION_PREEMPTOR_RUN = "taugrid.io/preemptor-run-id"
# On an elastic Job/RayJob: its last resize, as whoever carried it out recorded it (the local cluster; the kube
# bridge when it changes a Job's parallelism): JSON ``{"old_count", "new_count", "cause", "preemptor", "pod_set",
# "at", "message"}``, read as ``exec.resized`` while the job runs (``at`` makes each resize its own event).
ANNOTATION_RESIZED = "taugrid.io/resized"
# Kueue's Evicted reason once waitForPodsReady's requeue limit deactivates a Workload (reason DueTo cause).
_DEACTIVATED_BY_LIMIT = "DeactivatedDueToRequeuingLimitExceeded"
_BACKOFF_REASONS = ("PodsReadyTimeout", "BackoffFinished")  # Requeued's reasons during a waitForPodsReady backoff
MAIN_CONTAINER = "main"

# Waiting reasons that will not fix themselves within one attempt.
FATAL_WAITING = frozenset(
    {"ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"}
)
# Waiting reasons that are just a pod starting; not worth an event.
BENIGN_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
# The local backend prepares a pod's Python environment before its process starts; its waiting message is the
# progress, published as ``exec.preparing``.
WAITING_ENVIRONMENT = "PreparingEnvironment"
# A pod's rank in its Indexed Job (Kubernetes sets the annotation, and since 1.28 the label; the local cluster both).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# A KubeRay pod's role: only its head (or a Job's first rank) says the run is running.
RAY_NODE_TYPE = "ray.io/node-type"
# Pods that started together (the local cluster's simulated Job): the first rank lists them all, JSON
# ``[{"name", "node", "index"}]`` (read as ``ExecRunning.pods``), and each names the first, whose ``exec.running``
# says it started (``progress`` sends no started report of its own for it; issue 30).
ANNOTATION_GANG = "taugrid.io/gang"
ANNOTATION_GANG_STARTED = "taugrid.io/gang-started"
# What only the local cluster says about its own objects. On a real cluster anyone who may annotate a pod or a
# Workload could set these, and this module would carry a forged gang list (who ran where) or preemptor into the
# run's record and evidence: the kube bridge drops them from every object before it publishes the change.
LOCAL_CLUSTER_ANNOTATIONS = frozenset({ANNOTATION_GANG, ANNOTATION_GANG_STARTED, ANNOTATION_PREEMPTOR_RUN})
# Pod annotations ``environment.taugrid.io/<key>`` say what the process runs with (ExecRunning.environment).
ENVIRONMENT_ANNOTATION_PREFIX = "environment.taugrid.io/"

_EXIT_CODE_IN_MESSAGE = re.compile(r"exit code (\d+)")
_PREEMPTOR_JOB_UID = re.compile(r"JobUID: ([0-9a-fA-F-]+)")
_OUR_OBJECT_NAME = re.compile(r"-a\d+$")  # render.object_name: <run>-a<attempt>
_INSUFFICIENT = re.compile(r"insufficient (?:unused )?quota for (\S+) in flavor (\S+), (\S+) more needed")


class RunRef(NamedTuple):
    workspace: str
    run_id: str
    attempt: int


class RunEventOut(msgspec.Struct, frozen=True):
    """One run event to publish on ``run.<workspace>.<run_id>.<event_type>`` with id suffix ``dedup``."""

    workspace: str
    run_id: str
    attempt: int
    event_type: str
    payload: msgspec.Struct
    dedup: str = ""


def run_ref(obj: Mapping[str, Any]) -> RunRef | None:
    """The run an object is labelled with, or None when it carries no (complete) tau labels."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    run_id, workspace = labels.get(LABEL_RUN_ID), labels.get(LABEL_WORKSPACE)
    if not run_id or not workspace:
        return None
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, 1))
    except ValueError:
        attempt = 1
    return RunRef(workspace=workspace, run_id=run_id, attempt=attempt)


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    """Uids of the objects this one hangs off: Kueue's job-uid label, ownerReferences, Job pod labels."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    uids = [
        labels[k]
        for k in (LABEL_JOB_UID, "batch.kubernetes.io/controller-uid", "controller-uid")
        if k in labels
    ]
    uids += [ref["uid"] for ref in meta.get("ownerReferences") or [] if ref.get("uid")]
    return list(dict.fromkeys(uids))


def remember_owner(ev: c.WatchEvent, owners: MutableMapping[str, RunRef]) -> None:
    """Keep ``owners`` (uid → RunRef) current from a Job/RayJob (or any tau-labelled) watch event."""
    uid = (ev.object.get("metadata") or {}).get("uid")
    ref = run_ref(ev.object)
    if not uid or ref is None:
        return
    if ev.type == "DELETED":
        owners.pop(uid, None)
    else:
        owners[uid] = ref


def pod_templates(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod templates a Workload copied from its job (``spec.podSets[*].template``)."""
    podsets = (obj.get("spec") or {}).get("podSets") or []
    templates = [ps.get("template") for ps in podsets if isinstance(ps, Mapping)]
    return [t for t in templates if isinstance(t, Mapping)]


def traceparent_of(obj: Mapping[str, Any]) -> str:
    """The run's W3C ``traceparent`` an object carries: its own annotation or, for a Workload, the one on
    the pod templates Kueue copied from our Job/RayJob; "" when it has none."""
    for meta in [obj.get("metadata") or {}, *(t.get("metadata") or {} for t in pod_templates(obj))]:
        value = (meta.get("annotations") or {}).get(ANNOTATION_TRACEPARENT)
        if value:
            return str(value)
    return ""


def looks_managed(obj: Mapping[str, Any]) -> bool:
    """Whether an object without tau labels (a real Kueue Workload) belongs to a job we rendered: its
    copied pod templates carry our managed-by label, or it hangs off a Job/RayJob named ``<run>-a<n>``."""
    if any(
        ((t.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED_BY) == "taugrid"
        for t in pod_templates(obj)
    ):
        return True
    return any(
        ref.get("kind") in ("Job", "RayJob") and _OUR_OBJECT_NAME.search(str(ref.get("name", "")))
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


def awaits_owner(ev: c.WatchEvent, owners: Mapping[str, RunRef]) -> bool:
    """True when ``ev`` is one of our Workloads whose owning job is not in ``owners`` yet, and knowing it
    would produce run events: the caller should wait for the Job/RayJob event rather than drop this one."""
    obj = ev.object
    if obj.get("kind") != "Workload" or resolve(obj, owners) is not None or not looks_managed(obj):
        return False
    uids = owner_uids(obj)
    if not uids:
        return False
    stand_in = RunRef(workspace="?", run_id="?", attempt=0)
    return bool(translate(ev, {**owners, **{uid: stand_in for uid in uids}}))


def run_labelled(obj: Mapping[str, Any]) -> bool:
    """Whether a Job/RayJob says its Workload and pods carry the run labels (``ANNOTATION_RUN_LABELLED``)."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RUN_LABELLED) == "true"


def uids_to_resolve(obj: Mapping[str, Any]) -> list[str]:
    """The job uids ``translate`` may look up for a Workload: its owner's, unless the Workload is labelled with
    its run; its preemptor's, unless the preemptor's run is annotated. [] for one that resolves by itself."""
    uids = owner_uids(obj) if run_ref(obj) is None else []
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    preemptor = "" if annotations.get(ANNOTATION_PREEMPTOR_RUN) else preemptor_uid(obj)
    return [*uids, preemptor] if preemptor else uids


def preemptor_uid(obj: Mapping[str, Any]) -> str:
    """The job uid Kueue names in a Workload's ``Preempted`` condition, or ""."""
    preempted = _conditions(obj).get("Preempted") or {}
    match = _PREEMPTOR_JOB_UID.search(preempted.get("message", ""))
    return match.group(1) if match else ""


def resolve(obj: Mapping[str, Any], owners: Mapping[str, RunRef]) -> RunRef | None:
    ref = run_ref(obj)
    if ref is not None:
        return ref
    for uid in owner_uids(obj):
        if uid in owners:
            return owners[uid]
    return None


def translate(ev: c.WatchEvent, owners: Mapping[str, RunRef] | None = None) -> list[RunEventOut]:
    """The run events one watch event implies; [] for objects of no run or changes that mean nothing."""
    owners = owners or {}
    ref = resolve(ev.object, owners)
    if ref is None:
        return []
    kind = ev.object.get("kind", "")
    handler = _HANDLERS.get(kind)
    if handler is None:
        return []
    return [
        RunEventOut(ref.workspace, ref.run_id, ref.attempt, event_type, payload, dedup)
        for event_type, payload, dedup in handler(ev, owners)
    ]


_Out = list[tuple[str, msgspec.Struct, str]]


# ---------------------------------------------------------------- Workload (kueue.x-k8s.io)


def _workload(ev: c.WatchEvent, owners: Mapping[str, RunRef]) -> _Out:
    if ev.type == "DELETED":
        return []  # the Job/RayJob's own deletion says whether the run was cancelled
    obj = ev.object
    status = obj.get("status") or {}
    conds = _conditions(obj)
    finished = conds.get("Finished")
    if finished and finished.get("status") == "True":
        return []  # the Job/RayJob reports the outcome, with exit code and reason
    evicted = conds.get("Evicted")
    if evicted and evicted.get("status") == "True":
        if evicted.get("reason") == _DEACTIVATED_BY_LIMIT:
            # Kueue's waitForPodsReady gave up (requeuingStrategy.backoffLimitCount passed): it set the Workload
            # inactive and admits it no more, so this attempt has failed (the Job stays suspended)
            gave_up = c.ExecFinished(reason="RequeuingLimitExceeded", message=evicted.get("message", ""))
            return [("exec.failed", gave_up, "")]
        return [_preempted(obj, evicted, conds.get("Preempted"), owners), *_backoff(obj, evicted, conds)]
    admission = status.get("admission") or {}
    cluster_queue = admission.get("clusterQueue", "")
    admitted = conds.get("Admitted")
    if admitted and admitted.get("status") == "True":
        payload = c.AdmissionAdmitted(cluster_queue=cluster_queue, flavors=_flavors(admission),
                                      topology=_topology(admission))
        return [("admission.admitted", payload, _digest(admitted.get("lastTransitionTime"), cluster_queue))]
    reserved = conds.get("QuotaReserved")
    if reserved and reserved.get("status") == "True":
        checks = {ch.get("name", ""): ch.get("state", "") for ch in status.get("admissionChecks") or []}
        pending = {name: state for name, state in checks.items() if state != "Ready"}
        return [
            _queued(
                obj,
                "WaitingForAdmissionChecks",
                _check_message(pending),
                cluster_queue,
                {"admission_checks": pending} if pending else {},
            )
        ]
    requeued = conds.get("Requeued")
    if requeued and requeued.get("status") == "False":
        requeue_at = (status.get("requeueState") or {}).get("requeueAt")
        return [
            _queued(
                obj,
                requeued.get("reason") or "Requeued",
                requeued.get("message", ""),
                cluster_queue,
                {"requeue_at": requeue_at} if requeue_at else {},
            )
        ]
    if reserved and reserved.get("status") == "False":
        message = reserved.get("message", "")
        return [
            _queued(obj, reserved.get("reason") or "Pending", message, cluster_queue, _waiting_for(message))
        ]
    if not conds:
        return [_queued(obj, "Pending", "waiting for Kueue to consider the workload", cluster_queue, {})]
    return []


def _backoff(obj: Mapping[str, Any], evicted: Mapping[str, Any], conds: Mapping[str, Mapping[str, Any]]) -> _Out:
    """After a waitForPodsReady eviction the Workload stays ``Evicted`` until it is admitted again, while its
    ``Requeued`` condition says where its backoff is (``PodsReadyTimeout``, with ``requeueState.requeueAt``; then
    ``BackoffFinished``): that is the run's queued reason. Only a ``Requeued`` set at or after this eviction
    counts (one left from an earlier backoff says nothing about a later preemption)."""
    requeued = conds.get("Requeued")
    if not requeued or requeued.get("reason") not in _BACKOFF_REASONS:
        return []
    if str(requeued.get("lastTransitionTime") or "") < str(evicted.get("lastTransitionTime") or ""):
        return []  # RFC 3339 in UTC to the second: the text orders as the time does
    state = (obj.get("status") or {}).get("requeueState") or {}
    requeue_at = state.get("requeueAt")
    event_type, payload, _ = _queued(obj, requeued.get("reason") or "", requeued.get("message", ""), "",
                                     {"requeue_at": requeue_at} if requeue_at else {})
    # the same words come back at every eviction: the requeue count and time tell them apart
    return [(event_type, payload, _digest(requeued.get("reason"), state.get("count"), requeue_at,
                                          requeued.get("lastTransitionTime")))]


def _preempted(
    obj: Mapping[str, Any],
    evicted: Mapping[str, Any],
    preempted: Mapping[str, Any] | None,
    owners: Mapping[str, RunRef],
) -> tuple[str, msgspec.Struct, str]:
    kueue_reason = evicted.get("reason") or "Evicted"
    message = evicted.get("message", "")
    preemptor = ""
    if kueue_reason == "Preempted":
        reason = "Preempted"
        if preempted and preempted.get("status") == "True":
            message = f"{preempted.get('reason', '')}: {preempted.get('message') or message}".strip(": ")
            annotated = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PREEMPTOR_RUN)
            match = _PREEMPTOR_JOB_UID.search(preempted.get("message", ""))
            if annotated:  # the local cluster names the run itself (its job uids are not Kubernetes uids)
                preemptor = str(annotated)
            elif match:
                by = owners.get(match.group(1))
                preemptor = by.run_id if by else match.group(1)
    else:
        # PodsReadyTimeout, AdmissionCheck, ClusterQueueStopped, Deactivated, NodeFailures, ...
        reason = "Evicted"
        message = f"{kueue_reason}: {message}".strip(": ")
    payload = c.AdmissionPreempted(reason=reason, message=message, preemptor=preemptor)
    return "admission.preempted", payload, _digest(evicted.get("lastTransitionTime"), kueue_reason)


def _queued(
    obj: Mapping[str, Any], reason: str, message: str, cluster_queue: str, waiting_for: dict[str, Any]
) -> tuple[str, msgspec.Struct, str]:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    position: int | None = None
    raw = annotations.get(ANNOTATION_QUEUE_POSITION)
    if raw is not None:
        try:
            position = int(raw)
        except ValueError:
            position = None
    queue = (obj.get("spec") or {}).get("queueName")
    if queue and obj.get("kind") == "Workload":
        waiting_for = {"queue": queue, **waiting_for}
    payload = c.AdmissionQueued(
        reason=reason,
        message=message,
        cluster_queue=cluster_queue,
        position=position,
        waiting_for=waiting_for,
    )
    return "admission.queued", payload, _digest(reason, message, position, cluster_queue)


def _flavors(admission: Mapping[str, Any]) -> dict[str, str]:
    """resource → flavor; a resource assigned different flavors in different podsets is keyed podset/resource."""
    out: dict[str, str] = {}
    for psa in admission.get("podSetAssignments") or []:
        for resource, flavor in (psa.get("flavors") or {}).items():
            if out.get(resource, flavor) != flavor:
                out[f"{psa.get('name', '')}/{resource}"] = flavor
            else:
                out[resource] = flavor
    return out


def _topology(admission: Mapping[str, Any]) -> list[c.PodSetTopology]:
    """Each TAS pod set's ``topologyAssignment`` (v1beta2's compressed slices or v1beta1's domains), uncompressed.
    One Kueue wrote malformed is left out and logged: the admission itself still stands."""
    out = []
    for psa in admission.get("podSetAssignments") or []:
        if psa.get("topologyAssignment"):
            name = str(psa.get("name") or "main")
            try:
                out.append(topologyassignment.decode(name, psa["topologyAssignment"]))
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("pod set %s: unreadable topologyAssignment left out: %s", name, exc)
    return out


def _waiting_for(message: str) -> dict[str, Any]:
    match = _INSUFFICIENT.search(message)
    if not match:
        return {}
    return {"resource": match.group(1), "flavor": match.group(2), "more_needed": match.group(3)}


def _check_message(pending: Mapping[str, str]) -> str:
    if not pending:
        return "quota reserved; waiting for admission checks"
    return "quota reserved; waiting for admission checks: " + ", ".join(
        f"{k}={v}" for k, v in pending.items()
    )


# ---------------------------------------------------------------- batch/v1 Job


def _job(ev: c.WatchEvent, owners: Mapping[str, RunRef]) -> _Out:
    obj = ev.object
    status = obj.get("status") or {}
    conds = _conditions(obj)
    complete, failed = conds.get("Complete"), conds.get("Failed")
    if complete and complete.get("status") == "True":
        end = status.get("completionTime") or complete.get("lastTransitionTime")
        payload = c.ExecFinished(
            exit_code=0, reason=JOB_COMPLETED, duration_s=_duration(status.get("startTime"), end)
        )
        return [("exec.succeeded", payload, "")]
    if failed and failed.get("status") == "True":
        message = failed.get("message", "")
        match = _EXIT_CODE_IN_MESSAGE.search(message)
        payload = c.ExecFinished(
            exit_code=int(match.group(1)) if match else None,
            reason=failed.get("reason")
            or "Failed",  # BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy
            message=message,
            duration_s=_duration(status.get("startTime"), failed.get("lastTransitionTime")),
        )
        return [("exec.failed", payload, "")]
    if ev.type == "DELETED":
        return [_deleted(obj)]
    return _resized(obj)  # suspended → the Workload reports the queue; active → the pods report running


def _resized(obj: Mapping[str, Any]) -> _Out:
    """The job's last resize (``ANNOTATION_RESIZED``) as ``exec.resized``; nothing while it is suspended (a
    preempted elastic run is requeued at the size it had: no new resize) or when the annotation does not parse."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESIZED)
    suspended = _conditions(obj).get("Suspended") or {}
    if not raw or suspended.get("status") == "True":  # the watch carries no Job spec (watched.slim)
        return []
    try:  # the record is the event's payload plus ``at``, which only the digest needs (unknown fields are skipped)
        payload = msgspec.json.decode(raw.encode(), type=c.ExecResized)
    except (msgspec.ValidationError, msgspec.DecodeError):
        log.warning("job %s: unreadable %s annotation %r", (obj.get("metadata") or {}).get("name"),
                    ANNOTATION_RESIZED, raw[:200])
        return []
    return [("exec.resized", payload, _digest(raw))]


# ---------------------------------------------------------------- ray.io/v1 RayJob


def _rayjob(ev: c.WatchEvent, owners: Mapping[str, RunRef]) -> _Out:
    obj = ev.object
    status = obj.get("status") or {}
    deployment = status.get("jobDeploymentStatus", "")
    job_status = status.get("jobStatus", "")
    message = status.get("message", "")
    duration = _duration(status.get("startTime"), status.get("endTime"))
    if deployment == "Complete" or (deployment == "Failed" and job_status == "STOPPED"):
        if job_status == "SUCCEEDED":
            return [
                (
                    "exec.succeeded",
                    c.ExecFinished(exit_code=0, reason="Succeeded", message=message, duration_s=duration),
                    "",
                )
            ]
        if job_status == "STOPPED":
            return [
                ("exec.cancelled", c.ExecFinished(reason="Stopped", message=message, duration_s=duration), "")
            ]
    if deployment in ("Complete", "Failed", "ValidationFailed"):
        reason = status.get("reason") or (
            "ValidationFailed" if deployment == "ValidationFailed" else "AppFailed"
        )
        return [("exec.failed", c.ExecFinished(reason=reason, message=message, duration_s=duration), "")]
    if ev.type == "DELETED":
        return [_deleted(obj)]
    # an elastic RayJob's worker group resized (the local cluster's Ray cluster records it as on a Job, maybe
    # before its head runs); each later change of the RayJob repeats it, with the same digest
    if deployment == "Running":
        return [("exec.running", c.ExecRunning(environment=_environment(obj)), ""), *_resized(obj)]
    if deployment in ("Suspending", "Suspended"):
        return []
    return _resized(obj)  # New/Initializing/Retrying/Waiting: the Workload and pods tell more


def _deleted(obj: Mapping[str, Any]) -> tuple[str, msgspec.Struct, str]:
    name = (obj.get("metadata") or {}).get("name", "")
    message = f"{obj.get('kind', 'object')} {name} was deleted before it finished"
    return "exec.cancelled", c.ExecFinished(reason="Deleted", message=message), ""


# ---------------------------------------------------------------- core/v1 Pod


def _pod(ev: c.WatchEvent, owners: Mapping[str, RunRef]) -> _Out:
    if ev.type == "DELETED":
        return []  # a deleted pod is replaced or its Job reports the outcome
    obj = ev.object
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    pod, node = meta.get("name", ""), spec.get("nodeName", "")
    has_main = any(ct.get("name") == MAIN_CONTAINER for ct in spec.get("containers") or [])
    statuses = list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])
    main = next(
        (cs for cs in status.get("containerStatuses") or [] if cs.get("name") == MAIN_CONTAINER), None
    )
    phase = status.get("phase", "")
    conds = _conditions(obj)

    if phase == "Failed" and has_main:
        init_failure = _init_failure(status)
        if init_failure is not None and not ((main or {}).get("state") or {}).get("terminated"):
            return [("exec.failed", msgspec.structs.replace(init_failure, node=node), "")]
        return [("exec.failed", _pod_failure(status, main, conds, node), "")]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason == WAITING_ENVIRONMENT:
            message = str(waiting.get("message", ""))
            payload: msgspec.Struct = c.ExecPreparing(step="environment", message=message, node=node, pod=pod)
            return [("exec.preparing", payload, _digest(pod, message))]
        if reason in FATAL_WAITING:
            message = f"container {cs.get('name', '')}: {waiting.get('message', '')}".rstrip(": ")
            return [("exec.failed", c.ExecFinished(reason=reason, message=message, node=node), "")]
        if reason and reason not in BENIGN_WAITING:
            hint = {"pod": pod, "container": cs.get("name", ""), "node": node}
            payload = c.AdmissionQueued(reason=reason, message=waiting.get("message", ""), waiting_for=hint)
            return [("admission.queued", payload, _digest(reason, pod, cs.get("name")))]
    if phase == "Running" and has_main:
        if not first_rank(obj):
            return []  # the run is running once its first rank is; this pod's node is in its exec.progress
        payload = c.ExecRunning(node=node, pod=pod, environment=_environment(obj), pods=_gang(obj))
        return [("exec.running", payload, _digest(pod))]  # a requeued pod runs again
    scheduled = conds.get("PodScheduled")
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        message = scheduled.get("message", "")
        payload = c.AdmissionQueued(reason="Unschedulable", message=message, waiting_for={"pod": pod})
        return [("admission.queued", payload, _digest("Unschedulable", message))]
    return []


def first_rank(obj: Mapping[str, Any]) -> bool:
    """Whether a pod speaks for its run's start: an Indexed Job's rank 0 (a Job of one pod has no index), not a
    Ray worker. Each other pod's ``exec.running`` told the projection nothing (the run was running already, the
    environment the same) and cost a run event, its projection and its AUDIT copy: about 2 of the 17 run events
    of a run in Kueue's TAS scenario (2, 4 or 8 pods)."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(RAY_NODE_TYPE) == "worker":
        return False
    index = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX, "0"))
    return str(index) == "0"


def _gang(obj: Mapping[str, Any]) -> list[c.GangPod]:
    """The pods that started with this one (``ANNOTATION_GANG``); [] when it names none or cannot be read."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GANG)
    if not raw:
        return []
    try:
        return msgspec.json.decode(str(raw).encode(), type=list[c.GangPod])
    except (msgspec.ValidationError, msgspec.DecodeError):
        log.warning("pod %s: unreadable %s annotation %r", (obj.get("metadata") or {}).get("name"), ANNOTATION_GANG,
                    str(raw)[:200])
        return []


def _init_failure(status: Mapping[str, Any]) -> c.ExecFinished | None:
    """The first init container that failed (e.g. the source fetch refusing a snapshot whose digest does not
    match): the pod never ran its main container, and the init container's termination message says why."""
    for cs in status.get("initContainerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode", 0) != 0:
            message = (terminated.get("message") or "").strip()
            return c.ExecFinished(
                exit_code=terminated.get("exitCode"),
                reason="InitContainerFailed",
                message=f"init container {cs.get('name', '')}: {message or terminated.get('reason') or 'failed'}",
                duration_s=_duration(terminated.get("startedAt"), terminated.get("finishedAt")),
            )
    return None


def _pod_failure(
    status: Mapping[str, Any],
    main: Mapping[str, Any] | None,
    conds: Mapping[str, Mapping[str, Any]],
    node: str,
) -> c.ExecFinished:
    terminated = ((main or {}).get("state") or {}).get("terminated") or {}
    if not terminated:  # restarted containers keep the failure in lastState
        terminated = ((main or {}).get("lastState") or {}).get("terminated") or {}
    disruption = conds.get("DisruptionTarget")
    reason = terminated.get("reason") or status.get("reason") or "Error"  # OOMKilled, Error, Evicted, ...
    message = terminated.get("message") or status.get("message") or ""
    if disruption and disruption.get("status") == "True" and reason in ("Error", ""):
        # PreemptionByScheduler, DeletionByTaintManager, TerminationByKubelet: the node, not the code
        reason, message = disruption.get("reason") or reason, disruption.get("message") or message
    return c.ExecFinished(
        exit_code=terminated.get("exitCode"),
        reason=reason,
        message=message,
        node=node,
        duration_s=_duration(terminated.get("startedAt"), terminated.get("finishedAt")),
    )


# ---------------------------------------------------------------- helpers


def _environment(obj: Mapping[str, Any]) -> dict[str, str]:
    """What the process runs with, from ``environment.taugrid.io/<key>`` annotations."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return {
        k.removeprefix(ENVIRONMENT_ANNOTATION_PREFIX): str(v)
        for k, v in annotations.items()
        if k.startswith(ENVIRONMENT_ANNOTATION_PREFIX)
    }


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {cond.get("type", ""): cond for cond in (obj.get("status") or {}).get("conditions") or []}


def _duration(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (_ts(end) - _ts(start)).total_seconds()
    except ValueError:
        return None


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)  # Python 3.11 parses the trailing Z


def _digest(*parts: object) -> str:
    return hashlib.sha256(
        msgspec.json.encode([str(p) if p is not None else None for p in parts])
    ).hexdigest()[:12]


_HANDLERS = {"Workload": _workload, "Job": _job, "RayJob": _rayjob, "Pod": _pod}
