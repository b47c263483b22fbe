"""Kubernetes-shaped objects the local cluster publishes: Workload (kueue.x-k8s.io/v1beta2), Job, RayJob, Pod.

They carry the fields a real watch would, so the same translator reads both backends. Pure functions.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from taugrid.core.contracts import PodSetTopology
from taugrid.core.topologyassignment import encode

LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
# The same keys as ``taugrid.kube.translate``'s (this layer does not import it): our Workloads and pods carry the
# run labels, so a job's uid never needs resolving; an evicted Workload names its preemptor's run.
ANNOTATION_RUN_LABELLED = "taugrid.io/run-labelled"
ANNOTATION_PREEMPTOR_RUN = "taugrid.io/preemptor-run-id"
# An elastic Job's last resize (``kube.translate.ANNOTATION_RESIZED``, read there as ``exec.resized``).
ANNOTATION_RESIZED = "taugrid.io/resized"
# A local pod pulls no image of its own (a host process; a container engine pulls inside the environment step).
ANNOTATION_NO_IMAGE_PULL = "taugrid.io/no-image-pull"
# A simulated Job's pods start together (``kube.translate.ANNOTATION_GANG``, ``ANNOTATION_GANG_STARTED``): its first
# rank lists them all, and every one names the pod whose ``exec.running`` says that it started.
ANNOTATION_GANG = "taugrid.io/gang"
ANNOTATION_GANG_STARTED = "taugrid.io/gang-started"
TAU_LABELS = ("taugrid.io/run-id", "taugrid.io/workspace", "taugrid.io/attempt", "taugrid.io/managed-by")


def ts(at: float) -> str:
    """RFC 3339 in UTC to the second, as the API server writes timestamps (every published object carries several,
    so the text of the last few seconds is remembered)."""
    frac, second = math.modf(at)
    if round(frac * 1e6) >= 1_000_000:  # datetime rounds to the microsecond first, which can carry a second
        second += 1
    return _ts_of_second(int(second))


@functools.lru_cache(maxsize=16)
def _ts_of_second(second: int) -> str:
    return dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(obj: dict[str, Any], ctype: str, status: str, reason: str, message: str, at: float) -> None:
    conds: list[dict[str, Any]] = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c["type"] == ctype:
            if c["status"] != status:
                c["lastTransitionTime"] = ts(at)
            c.update(status=status, reason=reason, message=message)
            return
    conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                  "lastTransitionTime": ts(at)})


_ENCODE, _DECODE = msgspec.json.Encoder(), msgspec.json.Decoder()


def _copied(value: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of JSON data (a manifest read from JSON): through msgspec, about 7 times cheaper than
    ``copy.deepcopy``, which was a twentieth of the local cluster's CPU in Kueue's TAS scenario (a pod per rank)."""
    copied: dict[str, Any] = _DECODE.decode(_ENCODE.encode(value))
    return copied


def _tau_labels(owner: dict[str, Any]) -> dict[str, str]:
    labels = owner["metadata"].get("labels", {})
    return {k: v for k, v in labels.items() if k in TAU_LABELS}


def workload(owner: dict[str, Any], *, uid: str, queue: str, priority: int, priority_class: str,
             pod_sets: list[dict[str, Any]], at: float) -> dict[str, Any]:
    meta = owner["metadata"]
    kind = owner["kind"].lower()
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"{kind}-{meta['name']}"[:63],
            "namespace": meta.get("namespace", "default"),
            "uid": f"wl-{uid}",
            "labels": {LABEL_JOB_UID: uid, **_tau_labels(owner)},
            "annotations": {},
            "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"],
                                 "uid": uid, "controller": True}],
            "creationTimestamp": ts(at),
        },
        "spec": {"queueName": queue, "priority": priority, "priorityClassName": priority_class,
                 "podSets": pod_sets},
        "status": {},
    }


def admit(wl: dict[str, Any], *, cluster_queue: str, flavors: dict[str, str], pod_counts: dict[str, int],
          at: float, topology: Sequence[PodSetTopology] = ()) -> None:
    """Admitted, as Kueue records it; a TAS pod set's assignment in v1beta2's compressed form."""
    assigned = {t.pod_set: t for t in topology}
    wl["status"]["admission"] = {
        "clusterQueue": cluster_queue,
        "podSetAssignments": [
            {"name": name, "flavors": flavors, "count": n,
             **({"topologyAssignment": encode(assigned[name].levels, assigned[name].domains)}
                if name in assigned else {})}
            for name, n in pod_counts.items()],
    }
    wl["metadata"]["annotations"].pop("taugrid.io/queue-position", None)
    wl["status"].pop("requeueState", None)
    set_condition(wl, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}", at)
    set_condition(wl, "Admitted", "True", "Admitted", "The workload is admitted", at)
    set_condition(wl, "Evicted", "False", "Admitted", "", at) if _has(wl, "Evicted") else None
    set_condition(wl, "Requeued", "True", "Admitted", "", at) if _has(wl, "Requeued") else None


def pending(wl: dict[str, Any], *, reason: str, message: str, position: int | None, at: float) -> None:
    if position is not None:
        wl["metadata"]["annotations"]["taugrid.io/queue-position"] = str(position)
    set_condition(wl, "QuotaReserved", "False", reason, message, at)


def evict(wl: dict[str, Any], *, reason: str, message: str, preemptor_uid: str, at: float,
          preemptor_run: str = "") -> None:
    wl["status"].pop("admission", None)
    if preemptor_run:
        wl["metadata"]["annotations"][ANNOTATION_PREEMPTOR_RUN] = preemptor_run
    else:
        wl["metadata"]["annotations"].pop(ANNOTATION_PREEMPTOR_RUN, None)
    set_condition(wl, "Evicted", "True", "Preempted" if preemptor_uid else reason, message, at)
    if preemptor_uid:
        set_condition(wl, "Preempted", "True", reason, f"{message} (JobUID: {preemptor_uid})", at)
    set_condition(wl, "QuotaReserved", "False", "Pending", "Preempted; requeued", at)
    set_condition(wl, "Admitted", "False", "NoReservation", "The workload has no reservation", at)


def finish(wl: dict[str, Any], *, succeeded: bool, message: str, at: float) -> None:
    set_condition(wl, "Finished", "True", "Succeeded" if succeeded else "Failed", message, at)


def _has(obj: dict[str, Any], ctype: str) -> bool:
    return any(c["type"] == ctype for c in obj.get("status", {}).get("conditions", []))


def pod(owner: dict[str, Any], *, name: str, node: str, index: int, at: float, pod_set: str = "") -> dict[str, Any]:
    """A scheduled, not yet started pod, with the conditions and container statuses a kubelet would report
    (``taugrid.kube.progress`` reads its pod-level phases from them on both backends). ``pod_set``: a Ray
    cluster's ``head`` or ``workers`` (``raycluster``): its group's template, labelled as KubeRay labels them."""
    template = owner.get("spec", {}).get("template", {})
    ray: dict[str, str] = {}
    if pod_set and owner.get("kind") == "RayJob":
        cluster = owner["spec"]["rayClusterSpec"]
        group = cluster["headGroupSpec"] if pod_set == "head" else (cluster.get("workerGroupSpecs") or [{}])[0]
        template = group.get("template") or {}
        ray = {"ray.io/node-type": "head" if pod_set == "head" else "worker",
               "ray.io/group": "headgroup" if pod_set == "head" else str(group.get("groupName", pod_set))}
    spec = _copied(template.get("spec", {}))
    spec["nodeName"] = node
    labels = {**template.get("metadata", {}).get("labels", {}), **_tau_labels(owner), **ray,
              "batch.kubernetes.io/job-completion-index": str(index)}
    inits = bool(spec.get("initContainers"))
    p: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": owner["metadata"].get("namespace", "default"),
                     "uid": f"pod-{name}", "labels": labels, "creationTimestamp": ts(at),
                     "annotations": {ANNOTATION_NO_IMAGE_PULL: "true"},
                     "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                          "name": owner["metadata"]["name"],
                                          "uid": owner["metadata"].get("uid", "")}]},
        "spec": spec,
        "status": {"phase": "Pending", "conditions": []},
    }
    set_condition(p, "PodScheduled", "True", "", "", at)
    set_condition(p, "Initialized", "False" if inits else "True", "ContainersNotInitialized" if inits else "", "", at)
    set_condition(p, "ContainersReady", "False", "ContainersNotReady", "", at)
    set_condition(p, "Ready", "False", "ContainersNotReady", "", at)
    _statuses(p, init={"waiting": {"reason": "PodInitializing"}},
              app={"waiting": {"reason": "PodInitializing" if inits else "ContainerCreating"}})
    return p


def _statuses(p: dict[str, Any], *, init: dict[str, Any], app: dict[str, Any],
              main: dict[str, Any] | None = None) -> None:
    """``initContainerStatuses``/``containerStatuses`` for every container of the spec, in spec order."""
    spec = p["spec"]

    def one(ct: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        return {"name": ct.get("name", ""), "image": ct.get("image", ""), "ready": "running" in state,
                "started": "running" in state, "restartCount": 0, "state": state}

    if spec.get("initContainers"):
        p["status"]["initContainerStatuses"] = [one(ct, init) for ct in spec["initContainers"]]
    p["status"]["containerStatuses"] = [
        one(ct, main if main is not None and ct.get("name") == "main" else app)
        for ct in spec.get("containers") or [{"name": "main"}]]


def pod_waiting(p: dict[str, Any], *, reason: str, message: str) -> None:
    """The main container has not started: ``reason`` (e.g. PreparingEnvironment) and what is happening."""
    p["status"]["containerStatuses"] = [{"name": "main", "ready": False, "restartCount": 0,
                                         "state": {"waiting": {"reason": reason, "message": message}}}]


def pod_running(p: dict[str, Any], *, at: float) -> None:
    p["status"].update(phase="Running", startTime=ts(at))
    for ctype in ("Initialized", "ContainersReady", "Ready"):
        set_condition(p, ctype, "True", "", "", at)
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts(at), "finishedAt": ts(at)}}
    _statuses(p, init=done, app={"running": {"startedAt": ts(at)}})


def pod_terminated(p: dict[str, Any], *, exit_code: int, reason: str, message: str, started: float,
                   at: float) -> None:
    phase = "Succeeded" if exit_code == 0 else "Failed"
    p["status"].update(phase=phase, reason=reason if reason == "DeadlineExceeded" else None)
    if p["status"]["reason"] is None:
        del p["status"]["reason"]
    set_condition(p, "Initialized", "True", "", "", at)
    for ctype in ("ContainersReady", "Ready"):
        set_condition(p, ctype, "False", "PodCompleted" if exit_code == 0 else "PodFailed", "", at)
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts(started), "finishedAt": ts(at)}}
    main = {"terminated": {"exitCode": exit_code, "reason": reason, "message": message,
                           "startedAt": ts(started), "finishedAt": ts(at)}}
    _statuses(p, init=done, app=done, main=main)


def job_started(job: dict[str, Any], *, active: int, at: float) -> None:
    job["spec"]["suspend"] = False
    job.setdefault("status", {}).update(active=active, startTime=ts(at))
    if job["kind"] == "RayJob":  # Running once its process starts (rayjob_running), as KubeRay reports it
        job["status"].update(jobDeploymentStatus="Initializing", jobStatus="")


def job_resized(job: dict[str, Any], *, old_count: int, new_count: int, cause: str, at: float, pod_set: str,
                preemptor: str, message: str = "", checkpoint_step: int | None = None) -> None:
    """An elastic Job now runs ``new_count`` pods: its parallelism and active count, and the resize recorded
    on it as ``kube.translate`` reads it (with the checkpoint step the workers resume from, when there is one)."""
    if job["kind"] == "RayJob":  # KubeRay's autoscaler moves the worker group's replicas
        for group in job["spec"]["rayClusterSpec"].get("workerGroupSpecs") or []:
            group["replicas"] = new_count
    else:
        job["spec"]["parallelism"] = new_count
    job.setdefault("status", {})["active"] = new_count
    job["metadata"].setdefault("annotations", {})[ANNOTATION_RESIZED] = json.dumps(
        {"old_count": old_count, "new_count": new_count, "cause": cause, "preemptor": preemptor,
         "pod_set": pod_set, "at": ts(at), **({"message": message} if message else {}),
         **({"checkpoint_step": checkpoint_step} if checkpoint_step is not None else {})}, separators=(",", ":"))


def rayjob_running(job: dict[str, Any]) -> bool:
    """Mark a RayJob Running (its entrypoint started); False when it already was."""
    st = job.setdefault("status", {})
    if st.get("jobDeploymentStatus") == "Running":
        return False
    st.update(jobDeploymentStatus="Running", jobStatus="RUNNING")
    return True


def job_suspended(job: dict[str, Any]) -> None:
    job["spec"]["suspend"] = True
    # a preempted elastic run is requeued at the size it had: its last resize is history (its event was sent)
    (job["metadata"].get("annotations") or {}).pop(ANNOTATION_RESIZED, None)
    job.setdefault("status", {})["active"] = 0
    if job["kind"] == "RayJob":
        job["status"].update(jobDeploymentStatus="Suspended", jobStatus="")


def job_finished(job: dict[str, Any], *, succeeded: bool, reason: str, message: str, at: float) -> None:
    st = job.setdefault("status", {})
    st.update(active=0, completionTime=ts(at) if succeeded else None)
    if job["kind"] == "RayJob":
        st.update(jobDeploymentStatus="Complete" if succeeded else "Failed",
                  jobStatus="SUCCEEDED" if succeeded else "FAILED", message=message, endTime=ts(at),
                  reason=None if succeeded else reason)
        return
    if succeeded:
        st["succeeded"] = int(job["spec"].get("completions") or 1)
        set_condition(job, "Complete", "True", "", "", at)
    else:
        st["failed"] = 1
        set_condition(job, "Failed", "True", reason, message, at)


def workspace_of(obj: Mapping[str, Any]) -> str:
    """The run's workspace (label ``taugrid.io/workspace``); a pod without one is scoped by its namespace."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return str(labels.get("taugrid.io/workspace") or meta.get("namespace") or "default")


def gang(pods: list[dict[str, Any]], indices: list[int]) -> None:
    """Mark ``pods`` (a simulated Job's, in rank order, ``indices`` their completion indices) as one gang that starts
    together: the first lists every pod's name, node and index; each names the first."""
    first = pods[0]["metadata"]["name"]
    listed = [{"name": p["metadata"]["name"], "node": p["spec"].get("nodeName", ""), "index": i}
              for p, i in zip(pods, indices, strict=True)]
    for p in pods:
        p["metadata"].setdefault("annotations", {})[ANNOTATION_GANG_STARTED] = first
    pods[0]["metadata"]["annotations"][ANNOTATION_GANG] = json.dumps(listed, separators=(",", ":"))


def listed_by_first_rank(pod: Mapping[str, Any]) -> bool:
    """A gang's pod past its first rank (``gang``), which the first rank's change lists: name, node, index."""
    meta = pod.get("metadata") or {}
    first = (meta.get("annotations") or {}).get(ANNOTATION_GANG_STARTED)
    return bool(first) and first != meta.get("name")
