"""Kubernetes-shaped Pod, Event and RayJob watch events → ``exec.progress`` run events (the pod-level phases).

Pure, like ``translate``: no I/O, no clock. ``translate`` says where a run *is* (queued, admitted, running,
finished); this module says how far its pods got on the way to running, in TauGrid's phase order:
``raycluster`` (RayJobs only) → ``scheduling`` → ``image-pull`` → ``init`` → ``container-start``, each
``pending|active|done|warning|failed|skipped`` with a detail and, for a problem, a hint saying what to do.

Sources:
  * a Pod's status (conditions, ``initContainerStatuses``/``containerStatuses``): the whole picture of that
    pod (``source="pod"``); both backends publish it (the local cluster's objects carry the same fields);
  * a core/v1 (or events.k8s.io/v1) Event about one of our pods (FailedScheduling, image pull failures,
    back-off restarting, failed mounts): a warning only (``source="event"``); it resolves to a run through
    the pod's uid in ``owners``, which the caller fills from the pods it has seen (``remember_owner``);
  * a RayJob's ``jobDeploymentStatus`` and ``rayClusterStatus`` (``source="rayjob"``): the RayCluster phase.

Invariants: the same object state gives the same event, ``dedup`` included (a digest of the report), so
redeliveries and relists publish nothing new; a changed fact (a new restart count, a new reason) gives a new
``dedup``. Deleted objects report nothing: the Job/RayJob and the Workload say what happened to the run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from taugrid.core import contracts as c
from taugrid.kube.translate import ANNOTATION_GANG_STARTED, WAITING_ENVIRONMENT, RunEventOut, RunRef, resolve

EVENT_TYPE = "exec.progress"

IMAGE_FAILED = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
IMAGE_RETRYING = frozenset({"ErrImagePull", "RegistryUnavailable", "SignatureValidationFailed"})
START_FAILED = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
# Set by the local cluster on its pods (``local/objects``, which does not import this layer): no image is pulled.
ANNOTATION_NO_IMAGE_PULL = "taugrid.io/no-image-pull"
_PULL_IMAGE = re.compile(r'(?:pull(?:ing)? image|image) "([^"]+)"', re.IGNORECASE)


def progress(ev: c.WatchEvent, owners: Mapping[str, RunRef] | None = None) -> list[RunEventOut]:
    """The ``exec.progress`` event one watch event implies; [] when it says nothing about a run's pods."""
    if ev.type == "DELETED":
        return []
    owners = owners or {}
    obj = ev.object
    kind = obj.get("kind", "")
    if kind == "Event":
        involved = _involved(obj)
        ref = owners.get(str(involved.get("uid", ""))) if involved.get("kind") == "Pod" else None
        report = event_report(obj) if ref is not None else None
    elif kind in ("Pod", "RayJob"):
        ref = resolve(obj, owners)
        report = (pod_report(obj) if kind == "Pod" else rayjob_report(obj)) if ref is not None else None
    else:
        return []
    if ref is None or report is None or started_with_gang(obj, report):
        return []
    dedup = hashlib.sha256(msgspec.json.encode(report)).hexdigest()[:12]
    return [RunEventOut(ref.workspace, ref.run_id, ref.attempt, EVENT_TYPE, report, dedup)]


def started_with_gang(obj: Mapping[str, Any], report: c.ExecProgress) -> bool:
    """A running pod of a gang whose first rank's ``exec.running`` lists it (``translate.ANNOTATION_GANG``): that
    event says it started, on which node, so its own started report would tell the record nothing new. What it
    says later (a failure) is reported as for any pod."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(ANNOTATION_GANG_STARTED)) and report.pod_phase == "Running"


# ---------------------------------------------------------------- Pod status


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {cond.get("type", ""): cond for cond in (obj.get("status") or {}).get("conditions") or []}


def pod_report(pod: Mapping[str, Any]) -> c.ExecProgress:
    """Every pod-level phase of one pod, from its conditions and container states."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    conds = _conditions(pod)
    node = str(spec.get("nodeName") or "")
    images = {ct.get("name", ""): ct.get("image", "") for ct in
              [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]}
    inits = list(status.get("initContainerStatuses") or [])
    apps = list(status.get("containerStatuses") or [])
    scheduling = _scheduling(conds, node)
    scheduled = scheduling.status == "done"
    app_started = any(_state(cs, "running") or _state(cs, "terminated") for cs in apps)
    init = _init(spec, conds, inits, scheduled, app_started=app_started)
    no_pull = (meta.get("annotations") or {}).get(ANNOTATION_NO_IMAGE_PULL) == "true"
    # the same tree on both backends: the image-pull phase is through at once where nothing is pulled
    image = c.PhaseReport(name="image-pull", status="done") if no_pull else _image_pull(
        [*inits, *apps], images, scheduled)
    start = _start(apps, conds, scheduled and image.status == "done", init_done=init.status in ("done", "skipped"))
    phases = [scheduling, image, init, start]
    containers = [_container(cs, "init") for cs in inits] + [_container(cs, "app") for cs in apps]
    return c.ExecProgress(source="pod", pod=str(meta.get("name", "")), node=node,
                          pod_phase=str(status.get("phase", "")), phases=phases, containers=containers)


def _scheduling(conds: Mapping[str, Mapping[str, Any]], node: str) -> c.PhaseReport:
    scheduled = conds.get("PodScheduled") or {}
    if scheduled.get("status") == "True" or node:
        return c.PhaseReport(name="scheduling", status="done", detail=f"node {node}".strip())
    if scheduled.get("status") == "False":
        message = str(scheduled.get("message", ""))
        reason = str(scheduled.get("reason") or "Unschedulable")
        return c.PhaseReport(name="scheduling", status="warning", detail=f"{reason}: {message}".rstrip(": "),
                             hint=scheduling_hint(message))
    return c.PhaseReport(name="scheduling", status="active", detail="waiting for the scheduler")


def _image_pull(statuses: list[Mapping[str, Any]], images: Mapping[str, str], scheduled: bool) -> c.PhaseReport:
    for cs in statuses:
        waiting = _state(cs, "waiting")
        reason = str(waiting.get("reason", ""))
        if reason in IMAGE_FAILED or reason in IMAGE_RETRYING:
            name = str(cs.get("name", ""))
            image = str(cs.get("image") or images.get(name, ""))
            detail = f"container {name}: {reason}: {waiting.get('message', '')}".rstrip(": ")
            return c.PhaseReport(name="image-pull", status="failed" if reason in IMAGE_FAILED else "warning",
                                 detail=detail, hint=image_hint(image, reason))
    if any(_state(cs, "running") or _state(cs, "terminated") or _last_terminated(cs) or cs.get("imageID")
           or _state(cs, "waiting").get("reason") == WAITING_ENVIRONMENT  # the local backend: no image
           for cs in statuses):
        return c.PhaseReport(name="image-pull", status="done")
    if not scheduled:
        return c.PhaseReport(name="image-pull", status="pending")
    pulling = sorted({image for image in images.values() if image})
    return c.PhaseReport(name="image-pull", status="active", detail=f"pulling {', '.join(pulling)}" if pulling
                         else "waiting for the kubelet")


def _init(spec: Mapping[str, Any], conds: Mapping[str, Mapping[str, Any]], statuses: list[Mapping[str, Any]],
          scheduled: bool, *, app_started: bool) -> c.PhaseReport:
    wanted = [ct.get("name", "") for ct in spec.get("initContainers") or []]
    if not wanted:
        return c.PhaseReport(name="init", status="skipped")
    total = len(wanted)
    for cs in statuses:
        term = _state(cs, "terminated") or _last_terminated(cs)
        crashing = _state(cs, "waiting").get("reason") == "CrashLoopBackOff"
        if (term and term.get("exitCode") not in (0, None)) or crashing:
            name = str(cs.get("name", ""))
            code, reason = term.get("exitCode"), term.get("reason") or "Error"
            detail = f"init container {name} exited {code} ({reason})"
            if term.get("message"):
                detail += f": {term['message']}"
            return c.PhaseReport(
                name="init", status="failed", detail=detail,
                hint=f"init container {name} failed before the run's code started: `tau logs RUN` shows its "
                     "output; a source fetch that fails means the snapshot is missing or does not match")
    finished = sum(1 for cs in statuses if _state(cs, "terminated").get("exitCode") == 0)
    if (conds.get("Initialized") or {}).get("status") == "True" or finished >= total or app_started:
        return c.PhaseReport(name="init", status="done", detail=f"{total}/{total} init containers")
    if not scheduled:
        return c.PhaseReport(name="init", status="pending")
    running = next((str(cs.get("name", "")) for cs in statuses if _state(cs, "running")), "")
    detail = f"{finished}/{total} init containers" + (f"; {running} running" if running else "")
    return c.PhaseReport(name="init", status="active", detail=detail)


def _start(statuses: list[Mapping[str, Any]], conds: Mapping[str, Mapping[str, Any]], pulled: bool, *,
           init_done: bool) -> c.PhaseReport:
    for cs in statuses:
        waiting = _state(cs, "waiting")
        reason = str(waiting.get("reason", ""))
        name = str(cs.get("name", ""))
        if reason in START_FAILED:
            return c.PhaseReport(name="container-start", status="failed",
                                 detail=f"container {name}: {reason}: {waiting.get('message', '')}".rstrip(": "),
                                 hint=start_hint(reason))
        if reason == "CrashLoopBackOff":
            last = _last_terminated(cs)
            why = f"last exit {last.get('exitCode')} ({last.get('reason', '')})" if last else "restarting"
            return c.PhaseReport(name="container-start", status="warning",
                                 detail=f"container {name}: CrashLoopBackOff, {cs.get('restartCount', 0)} "
                                        f"restarts, {why}", hint=start_hint(reason, last.get("reason", "")))
    if statuses and all(_state(cs, "running") or _state(cs, "terminated")
                        or _state(cs, "waiting").get("reason") == WAITING_ENVIRONMENT for cs in statuses):
        return c.PhaseReport(name="container-start", status="done")
    if not pulled or not init_done:
        return c.PhaseReport(name="container-start", status="pending")
    if (conds.get("ContainersReady") or {}).get("status") == "True":
        return c.PhaseReport(name="container-start", status="done")
    return c.PhaseReport(name="container-start", status="active", detail="creating containers")


def _container(cs: Mapping[str, Any], kind: str) -> c.ContainerReport:
    state_name, state = next(((k, v) for k, v in (cs.get("state") or {}).items() if v is not None), ("", None))
    state = state or {}
    return c.ContainerReport(name=str(cs.get("name", "")), kind=kind, state=state_name,
                             reason=str(state.get("reason", "")), message=str(state.get("message", "")),
                             exit_code=state.get("exitCode"), restarts=int(cs.get("restartCount") or 0))


def _state(cs: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    return ((cs.get("state") or {}).get(which)) or {}


def _last_terminated(cs: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((cs.get("lastState") or {}).get("terminated")) or {}


# ---------------------------------------------------------------- Events


def _involved(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("involvedObject") or obj.get("regarding") or {}


def event_report(event: Mapping[str, Any]) -> c.ExecProgress | None:
    """A warning from a Kubernetes Event about a pod; None for events that do not slow a pod down."""
    reason = str(event.get("reason", ""))
    message = str(event.get("message") or event.get("note") or "")
    lowered = message.lower()
    if reason == "FailedScheduling":
        phase = c.PhaseReport(name="scheduling", status="warning", detail=f"{reason}: {message}",
                              hint=scheduling_hint(message))
    elif reason in ("Failed", "BackOff") and ("image" in lowered or "ErrImagePull" in message):
        match = _PULL_IMAGE.search(message)
        phase = c.PhaseReport(name="image-pull", status="warning", detail=f"{reason}: {message}",
                              hint=image_hint(match.group(1) if match else "", reason))
    elif reason == "BackOff" and "restarting failed container" in lowered:
        phase = c.PhaseReport(name="container-start", status="warning", detail=f"CrashLoopBackOff: {message}",
                              hint=start_hint("CrashLoopBackOff"))
    elif reason in ("FailedMount", "FailedAttachVolume", "FailedCreatePodSandBox"):
        phase = c.PhaseReport(name="container-start", status="warning", detail=f"{reason}: {message}",
                              hint=start_hint(reason))
    else:
        return None
    return c.ExecProgress(source="event", pod=str(_involved(event).get("name", "")), phases=[phase])


# ---------------------------------------------------------------- RayJob → RayCluster


def rayjob_report(job: Mapping[str, Any]) -> c.ExecProgress | None:
    """The RayCluster phase of a RayJob; None while the RayJob is suspended in the queue."""
    status = job.get("status") or {}
    deployment = str(status.get("jobDeploymentStatus", ""))
    cluster = status.get("rayClusterStatus") or {}
    name = str(status.get("rayClusterName", ""))
    label = f"RayCluster {name}".strip()
    ready = cluster.get("readyWorkerReplicas", cluster.get("availableWorkerReplicas"))
    desired = cluster.get("desiredWorkerReplicas")
    workers = f"; {ready or 0}/{desired} workers ready" if desired is not None else ""
    conds = {cd.get("type", ""): cd for cd in cluster.get("conditions") or []}
    failure = conds.get("ReplicaFailure") or {}
    if cluster.get("state") == "ready" or deployment in ("Running", "Complete") or (
        deployment == "Failed" and status.get("jobStatus") not in ("", None, "PENDING")
    ):
        phase = c.PhaseReport(name="raycluster", status="done", detail=f"{label} ready")
    elif deployment == "Failed" or deployment == "ValidationFailed":
        reason = str(status.get("reason") or deployment)
        phase = c.PhaseReport(name="raycluster", status="failed",
                              detail=f"{reason}: {status.get('message', '')}".rstrip(": "),
                              hint=raycluster_hint(reason))
    elif failure.get("status") == "True":
        phase = c.PhaseReport(name="raycluster", status="warning",
                              detail=f"{failure.get('reason', 'ReplicaFailure')}: {failure.get('message', '')}",
                              hint=raycluster_hint("ReplicaFailure"))
    elif deployment in ("Initializing", "Retrying"):
        head = conds.get("HeadPodReady") or {}
        waiting = "head pod not ready" if head.get("status") == "False" else "provisioning"
        what = "retrying with a fresh RayCluster" if deployment == "Retrying" else waiting
        phase = c.PhaseReport(name="raycluster", status="active", detail=f"{label}: {what}{workers}")
    else:
        return None  # "", New, Suspending, Suspended, Waiting: the Workload tells the queue story
    return c.ExecProgress(source="rayjob", phases=[phase])


# ---------------------------------------------------------------- hints (a researcher's next step)


def image_hint(image: str, reason: str) -> str:
    shown = f"image '{image}'" if image else "the image"
    if reason == "InvalidImageName":
        return f"{shown} is not a valid image reference: fix the image in tau.yaml (or the compute profile's)"
    if reason == "ErrImageNeverPull":
        return f"{shown} is not on the node and the pod's imagePullPolicy is Never: use IfNotPresent or Always"
    return f"{shown} cannot be pulled: check the image name and the namespace's imagePullSecrets"


def scheduling_hint(message: str) -> str:
    lowered = message.lower()
    if "insufficient" in lowered:
        return ("Kueue admitted the run against quota, but no node has the free capacity right now "
                "(or the quota promises more than the nodes hold): it starts when capacity frees up")
    if "node affinity" in lowered or "node selector" in lowered or "didn't match" in lowered:
        return "no node matches the pod's node selector (the ResourceFlavor's nodeLabels): ask the platform team"
    if "taint" in lowered:
        return ("the free nodes carry a taint the pod does not tolerate (taugrid.io/unhealthy: cordoned by "
                "the health monitor until it passes re-validation)")
    if "persistentvolumeclaim" in lowered or "volume" in lowered:
        return "a volume the pod needs is not bound or not reachable from any node"
    return "the scheduler cannot place the pod now; it retries as nodes change"


def start_hint(reason: str, last_reason: str = "") -> str:
    if reason == "CreateContainerConfigError":
        return ("a Secret or ConfigMap the pod references (env secretKeyRef/configMapKeyRef) is missing or "
                "lacks the key: create it in the run's namespace")
    if reason == "RunContainerError" or reason == "CreateContainerError":
        return "the container could not start: check that the entrypoint command exists in the image"
    if reason == "CrashLoopBackOff":
        if last_reason == "OOMKilled":
            return "the container is killed for memory again and again: raise compute.memory"
        return "the container keeps exiting and restarting: `tau logs RUN` shows why"
    if reason in ("FailedMount", "FailedAttachVolume"):
        return "a volume (PVC, Secret, ConfigMap) the pod mounts is missing or not attachable on the node"
    return "the container runtime could not set the pod up on its node"


def raycluster_hint(reason: str) -> str:
    if reason == "PreRunningDeadlineExceeded":
        return "the RayCluster did not become ready in time: check the head and worker pods below"
    if reason == "ReplicaFailure":
        return "KubeRay cannot create some Ray pods: check quota, the image and the pods below"
    if reason == "ValidationFailed":
        return "KubeRay rejected the RayJob spec: check the message and the rendered manifest (tau run --dry-run)"
    return "the Ray job could not start on its RayCluster: check the message and the pods below"
