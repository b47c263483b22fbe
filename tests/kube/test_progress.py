"""Pod-level phases (``exec.progress``) from Kubernetes-shaped objects as a real cluster reports them, and the
phase tree the run-state machine builds from them.

The objects are shaped after what the API server returns (kubectl get -o json) for each situation: a pod in
ImagePullBackOff, a FailedScheduling Event, an init container that failed (Init:Error), an OOMKilled
container, a RayJob whose RayCluster is still being provisioned.
"""

from __future__ import annotations

from typing import Any

import msgspec

from taugrid.core import contracts as c
from taugrid.core import states
from taugrid.kube.progress import progress
from taugrid.kube.translate import RunRef, remember_owner, translate

LABELS = {"taugrid.io/run-id": "r1", "taugrid.io/workspace": "ws", "taugrid.io/attempt": "1",
          "taugrid.io/managed-by": "taugrid", "batch.kubernetes.io/controller-uid": "job-uid-1",
          "job-name": "r1-a1"}
REF = RunRef("ws", "r1", 1)


def pod(status: dict[str, Any], *, node: str = "gpu-node-3", init: bool = False, image: str = "ghcr.io/lab/train:1"
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": image}], "restartPolicy": "Never"}
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = [{"name": "fetch-source", "image": "ghcr.io/taugrid/taugrid:0.4"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "r1-a1-0-x7k2p", "namespace": "team-a", "uid": "pod-uid-1",
                         "labels": LABELS, "resourceVersion": "811"},
            "spec": spec, "status": status}


def watch(obj: dict[str, Any], kind: str = "MODIFIED") -> c.WatchEvent:
    return c.WatchEvent(type=kind, object=obj, cluster="prod")


def only(obj: dict[str, Any], owners: dict[str, RunRef] | None = None) -> c.ExecProgress:
    outs = progress(watch(obj), owners or {})
    assert len(outs) == 1 and outs[0].event_type == "exec.progress", outs
    assert (outs[0].workspace, outs[0].run_id, outs[0].attempt) == ("ws", "r1", 1)
    payload = outs[0].payload
    assert isinstance(payload, c.ExecProgress)
    return payload


def shape(report: c.ExecProgress) -> list[tuple[str, str]]:
    return [(p.name, p.status) for p in report.phases]


SCHEDULED = {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
             "lastTransitionTime": "2026-11-30T10:01:02Z"}

IMAGE_PULL_BACKOFF = {
    "phase": "Pending",
    "conditions": [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-11-30T10:01:04Z"},
        {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-30T10:01:02Z"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
         "message": "containers with unready status: [main]", "lastTransitionTime": "2026-11-30T10:01:02Z"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
         "message": "containers with unready status: [main]", "lastTransitionTime": "2026-11-30T10:01:02Z"},
        SCHEDULED,
    ],
    "hostIP": "10.0.4.17", "podIP": "10.244.3.9", "startTime": "2026-11-30T10:01:02Z", "qosClass": "Guaranteed",
    "containerStatuses": [{
        "name": "main", "image": "ghcr.io/lab/trian:1", "imageID": "", "ready": False, "restartCount": 0,
        "started": False, "lastState": {},
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": 'Back-off pulling image "ghcr.io/lab/trian:1"'}}}],
}


def test_image_pull_backoff_fails_the_image_pull_phase_with_the_image_and_what_to_check() -> None:
    report = only(pod(IMAGE_PULL_BACKOFF, image="ghcr.io/lab/trian:1"))
    assert shape(report) == [("scheduling", "done"), ("image-pull", "failed"), ("init", "skipped"),
                             ("container-start", "pending")]
    image = report.phases[1]
    assert image.detail == 'container main: ImagePullBackOff: Back-off pulling image "ghcr.io/lab/trian:1"'
    assert image.hint == ("image 'ghcr.io/lab/trian:1' cannot be pulled: check the image name and the "
                          "namespace's imagePullSecrets")
    assert report.node == "gpu-node-3" and report.pod_phase == "Pending"
    assert report.containers == [c.ContainerReport(name="main", kind="app", state="waiting",
                                                   reason="ImagePullBackOff",
                                                   message='Back-off pulling image "ghcr.io/lab/trian:1"')]


def test_err_image_pull_is_a_warning_while_the_kubelet_still_retries() -> None:
    status = {**IMAGE_PULL_BACKOFF, "containerStatuses": [{
        **IMAGE_PULL_BACKOFF["containerStatuses"][0],
        "state": {"waiting": {"reason": "ErrImagePull", "message": "rpc error: code = NotFound desc = failed to "
                              'pull and unpack image "ghcr.io/lab/trian:1": not found'}}}]}
    assert shape(only(pod(status)))[1] == ("image-pull", "warning")


FAILED_SCHEDULING_EVENT = {
    "apiVersion": "v1", "kind": "Event",
    "metadata": {"name": "r1-a1-0-x7k2p.1811e7a3c2d4e5f6", "namespace": "team-a", "uid": "ev-uid-9",
                 "resourceVersion": "902"},
    "involvedObject": {"kind": "Pod", "namespace": "team-a", "name": "r1-a1-0-x7k2p", "uid": "pod-uid-1",
                       "apiVersion": "v1", "resourceVersion": "811"},
    "reason": "FailedScheduling",
    "message": "0/4 nodes are available: 1 node(s) had untolerated taint {taugrid.io/unhealthy: }, "
               "3 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: 1 Preemption is not "
               "helpful for scheduling, 3 No preemption victims found for incoming pod.",
    "source": {"component": "default-scheduler"}, "reportingComponent": "default-scheduler",
    "firstTimestamp": None, "lastTimestamp": None, "eventTime": "2026-11-30T10:01:03.412345Z",
    "type": "Warning", "count": 1, "action": "Scheduling",
}

UNSCHEDULABLE = {"phase": "Pending", "qosClass": "Guaranteed", "conditions": [{
    "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
    "lastTransitionTime": "2026-11-30T10:01:03Z", "message": FAILED_SCHEDULING_EVENT["message"]}]}


def test_failed_scheduling_event_warns_on_the_scheduling_phase_of_the_pod_it_names() -> None:
    owners: dict[str, RunRef] = {}
    remember_owner(watch(pod(UNSCHEDULABLE, node="")), owners)  # the pod seen first tells whose it is
    assert owners["pod-uid-1"] == REF
    report = only(FAILED_SCHEDULING_EVENT, owners)
    assert report.source == "event" and report.pod == "r1-a1-0-x7k2p"
    assert shape(report) == [("scheduling", "warning")]
    assert report.phases[0].detail.startswith("FailedScheduling: 0/4 nodes are available")
    assert "no node has the free capacity right now" in report.phases[0].hint
    assert progress(watch(FAILED_SCHEDULING_EVENT), {}) == []  # a pod nobody saw is nobody's


def test_an_unschedulable_pod_warns_from_its_own_condition_too() -> None:
    report = only(pod(UNSCHEDULABLE, node=""))
    assert shape(report) == [("scheduling", "warning"), ("image-pull", "pending"), ("init", "skipped"),
                             ("container-start", "pending")]
    assert report.phases[0].detail.startswith("Unschedulable: 0/4 nodes")


INIT_ERROR = {
    "phase": "Failed",
    "conditions": [
        {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
         "message": "containers with incomplete status: [fetch-source]",
         "lastTransitionTime": "2026-11-30T10:01:02Z"},
        {"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": "2026-11-30T10:01:09Z"},
        SCHEDULED,
    ],
    "initContainerStatuses": [{
        "name": "fetch-source", "image": "ghcr.io/taugrid/taugrid:0.4",
        "imageID": "ghcr.io/taugrid/taugrid@sha256:4f1c", "ready": False, "restartCount": 0, "started": False,
        "lastState": {},
        "state": {"terminated": {"exitCode": 2, "reason": "Error",
                                 "message": "source digest mismatch: sha256:aa != sha256:bb",
                                 "startedAt": "2026-11-30T10:01:05Z", "finishedAt": "2026-11-30T10:01:08Z",
                                 "containerID": "containerd://9e1a"}}}],
    "containerStatuses": [{
        "name": "main", "image": "ghcr.io/lab/train:1", "imageID": "", "ready": False, "restartCount": 0,
        "started": False, "lastState": {}, "state": {"waiting": {"reason": "PodInitializing"}}}],
}


def test_init_error_fails_the_init_phase_and_the_container_never_starts() -> None:
    report = only(pod(INIT_ERROR, init=True))
    assert shape(report) == [("scheduling", "done"), ("image-pull", "done"), ("init", "failed"),
                             ("container-start", "pending")]
    assert report.phases[2].detail == ("init container fetch-source exited 2 (Error): source digest mismatch: "
                                       "sha256:aa != sha256:bb")
    assert "`tau logs RUN` shows its output" in report.phases[2].hint
    assert [(ct.kind, ct.name, ct.state, ct.exit_code) for ct in report.containers] == [
        ("init", "fetch-source", "terminated", 2), ("app", "main", "waiting", None)]


OOM_KILLED = {
    "phase": "Failed",
    "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-30T10:01:02Z"},
                   {"type": "Ready", "status": "False", "reason": "PodFailed",
                    "lastTransitionTime": "2026-11-30T10:09:41Z"}, SCHEDULED],
    "containerStatuses": [{
        "name": "main", "image": "ghcr.io/lab/train:1", "imageID": "ghcr.io/lab/train@sha256:77e0",
        "ready": False, "restartCount": 0, "started": False, "lastState": {},
        "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-11-30T10:01:06Z",
                                 "finishedAt": "2026-11-30T10:09:41Z", "containerID": "containerd://51bc"}}}],
}


def test_oom_killed_pod_passed_every_start_phase_and_finishes_with_a_memory_hint() -> None:
    ev = watch(pod(OOM_KILLED))
    report = only(ev.object)
    assert shape(report) == [("scheduling", "done"), ("image-pull", "done"), ("init", "skipped"),
                             ("container-start", "done")]
    assert report.containers[0].reason == "OOMKilled" and report.containers[0].exit_code == 137
    record = _running_record()
    for out in [*progress(ev), *translate(ev)]:
        assert states.apply(record, out.event_type, 1, msgspec.to_builtins(out.payload), 20.0)
    finished = _phase(record, "finished")
    assert (finished.status, finished.detail) == ("failed", "OOMKilled")
    assert "raise it" in finished.hint and "compute.memory" in finished.hint


RAYJOB_PROVISIONING = {
    "apiVersion": "ray.io/v1", "kind": "RayJob",
    "metadata": {"name": "r1-a1", "namespace": "team-a", "uid": "rayjob-uid-1", "labels": LABELS,
                 "resourceVersion": "1204"},
    "spec": {"suspend": False, "shutdownAfterJobFinishes": True, "entrypoint": "python train.py"},
    "status": {
        "jobDeploymentStatus": "Initializing", "jobStatus": "", "jobId": "r1-a1-7xq2m",
        "rayClusterName": "r1-a1-raycluster-8kd2n", "startTime": "2026-11-30T10:01:00Z",
        "rayClusterStatus": {
            "desiredWorkerReplicas": 2, "availableWorkerReplicas": 0, "readyWorkerReplicas": 0,
            "desiredCPU": "9", "desiredMemory": "36Gi", "desiredGPU": "2", "desiredTPU": "0",
            "maxWorkerReplicas": 2, "minWorkerReplicas": 2, "observedGeneration": 1,
            "conditions": [
                {"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotFound",
                 "lastTransitionTime": "2026-11-30T10:01:01Z"},
                {"type": "RayClusterProvisioned", "status": "False", "reason": "RayClusterPodsProvisioning",
                 "lastTransitionTime": "2026-11-30T10:01:01Z"}],
        },
        "observedGeneration": 2,
    },
}


def test_rayjob_with_its_raycluster_provisioning_shows_the_raycluster_phase_active() -> None:
    report = only(RAYJOB_PROVISIONING)
    assert report.source == "rayjob" and report.pod == ""
    assert shape(report) == [("raycluster", "active")]
    assert report.phases[0].detail == "RayCluster r1-a1-raycluster-8kd2n: head pod not ready; 0/2 workers ready"
    ready = {**RAYJOB_PROVISIONING, "status": {**RAYJOB_PROVISIONING["status"], "jobDeploymentStatus": "Running",
                                               "jobStatus": "RUNNING"}}
    assert shape(only(ready)) == [("raycluster", "done")]
    suspended = {**RAYJOB_PROVISIONING, "status": {"jobDeploymentStatus": "Suspended"}}
    assert progress(watch(suspended)) == []


def test_same_state_gives_the_same_dedup_and_a_changed_state_a_new_one() -> None:
    first, again = progress(watch(pod(IMAGE_PULL_BACKOFF))), progress(watch(pod(IMAGE_PULL_BACKOFF)))
    assert first[0].dedup == again[0].dedup
    assert progress(watch(pod(OOM_KILLED)))[0].dedup != first[0].dedup
    assert progress(watch(pod(OOM_KILLED), "DELETED")) == []


# ---------------------------------------------------------------- the tree the state machine builds


def _running_record() -> states.RunRecord:
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved"):
        states.apply(r, t, 1, {}, 1.0)
    states.apply(r, "render.applied", 1, {"kind": "Job", "object_name": "r1-a1"}, 2.0)
    states.apply(r, "admission.admitted", 1, {"cluster_queue": "team-a"}, 3.0)
    return r


def _phase(record: states.RunRecord, name: str) -> states.Phase:
    return next(p for p in record.phases if p.name == name)


def _tree(record: states.RunRecord) -> list[tuple[str, str]]:
    return [(p.name, p.status) for p in record.phases]


def _feed(record: states.RunRecord, obj: dict[str, Any], owners: dict[str, RunRef] | None = None,
          at: float = 10.0) -> None:
    ev = watch(obj)
    for out in [*progress(ev, owners or {}), *translate(ev, owners or {})]:
        states.apply(record, out.event_type, out.attempt, msgspec.to_builtins(out.payload), at)


def test_image_pull_backoff_run_tree_stops_at_image_pull_with_the_hint() -> None:
    record = _running_record()
    _feed(record, pod(IMAGE_PULL_BACKOFF))
    assert record.state == "failing" and record.reason == "ImagePullBackOff"
    assert _tree(record) == [("submitted", "done"), ("policy", "done"), ("rendered", "done"),
                             ("admission", "done"), ("raycluster", "skipped"), ("scheduling", "done"),
                             ("image-pull", "failed"), ("init", "skipped"), ("container-start", "pending"),
                             ("running", "skipped"), ("finished", "failed")]
    assert _phase(record, "image-pull").hint.startswith("image 'ghcr.io/lab/trian:1' cannot be pulled")
    assert record.pods[0].name == "r1-a1-0-x7k2p" and record.pods[0].containers[0].reason == "ImagePullBackOff"


def test_an_event_warns_but_never_undoes_what_the_pod_status_showed() -> None:
    record = _running_record()
    owners: dict[str, RunRef] = {}
    waiting = pod(UNSCHEDULABLE, node="")
    remember_owner(watch(waiting), owners)
    _feed(record, waiting, owners)
    _feed(record, FAILED_SCHEDULING_EVENT, owners)
    scheduling = _phase(record, "scheduling")
    assert scheduling.status == "warning" and scheduling.detail.startswith("FailedScheduling: 0/4 nodes")
    _feed(record, pod(OOM_KILLED | {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "x"}}}]}), owners)
    _feed(record, FAILED_SCHEDULING_EVENT, owners)  # a late copy of the old event
    assert _phase(record, "scheduling").status == "done"
    assert record.state == "running"


def test_several_pods_tell_one_phase_by_the_slowest_pod() -> None:
    record = _running_record()
    two = pod(OOM_KILLED | {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "x"}}}]})
    other = pod(IMAGE_PULL_BACKOFF | {"containerStatuses": [{**IMAGE_PULL_BACKOFF["containerStatuses"][0],
                                                             "state": {"waiting": {"reason": "ContainerCreating"}}}]})
    other["metadata"] = {**other["metadata"], "name": "r1-a1-1-q9z8w", "uid": "pod-uid-2"}
    for obj in (two, other):
        for out in progress(watch(obj)):
            states.apply(record, out.event_type, 1, msgspec.to_builtins(out.payload), 5.0)
    image = _phase(record, "image-pull")
    assert (image.status, image.detail) == ("active", "1/2 pods; r1-a1-1-q9z8w: pulling ghcr.io/lab/train:1")
    assert [p.name for p in record.pods] == ["r1-a1-0-x7k2p", "r1-a1-1-q9z8w"]


def test_progress_of_an_old_attempt_or_a_finished_run_changes_nothing() -> None:
    record = _running_record()
    data = msgspec.to_builtins(only(pod(IMAGE_PULL_BACKOFF)))
    assert not states.apply(record, "exec.progress", 2, data, 5.0)
    states.apply(record, "exec.succeeded", 1, {"exit_code": 0}, 6.0)
    assert not states.apply(record, "exec.progress", 1, data, 7.0)
    assert record.pods == []


def test_a_preemption_forgets_the_pods_and_their_phases() -> None:
    record = _running_record()
    _feed(record, pod(OOM_KILLED | {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "x"}}}]}))
    assert record.state == "running" and record.pods
    assert states.apply(record, "admission.preempted", 1, {"reason": "Preempted"}, 30.0)
    assert record.pods == []
    assert _tree(record)[-1] == ("admission", "warning")


def test_a_running_pod_of_a_gang_leaves_its_start_to_its_first_ranks_exec_running() -> None:
    """Issue 30: the local cluster's simulated Job pods start together and name the pod whose ``exec.running`` lists
    them all; their own started report would tell the record nothing new. A failure is still reported."""
    started = {"running": {"startedAt": "2026-11-30T10:01:05Z"}}
    running = {"phase": "Running", "conditions": [SCHEDULED], "containerStatuses": [
        {"name": "main", "ready": True, "restartCount": 0, "state": started}]}
    member = pod(running)
    member["metadata"]["annotations"] = {"taugrid.io/gang-started": "r1-a1-0"}
    assert progress(watch(member, "ADDED"), {}) == []
    assert only(pod(running)).pod_phase == "Running"  # no gang: reported as before
    failed = pod({"phase": "Failed", "conditions": [SCHEDULED], "containerStatuses": [
        {"name": "main", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]})
    failed["metadata"]["annotations"] = {"taugrid.io/gang-started": "r1-a1-0"}
    assert only(failed).pod_phase == "Failed"
