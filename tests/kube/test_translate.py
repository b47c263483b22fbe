"""translate(): realistic Kueue Workload, Job, RayJob and Pod objects → run events."""

from __future__ import annotations

import copy
from typing import Any

from taugrid.core import contracts as c
from taugrid.core.classify import classify
from taugrid.core.watched import slim
from taugrid.kube.translate import (
    ANNOTATION_PREEMPTOR_RUN,
    ANNOTATION_RESIZED,
    RunRef,
    owner_uids,
    remember_owner,
    run_ref,
    translate,
    uids_to_resolve,
)

JOB_UID = "8f6c1a52-2b0e-4f5e-9a51-0c2f4c3c9e11"
TAU_LABELS = {
    "taugrid.io/managed-by": "taugrid",
    "taugrid.io/run-id": "train-3f2a1b",
    "taugrid.io/workspace": "team-a",
    "taugrid.io/attempt": "2",
}
REF = RunRef("team-a", "train-3f2a1b", 2)
OWNERS = {JOB_UID: REF}


def workload(conditions: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-3f2a1b-a2-5c8d1",
            "namespace": "team-a",
            "uid": "wl-uid-1",
            "resourceVersion": "1001",
            "labels": {"kueue.x-k8s.io/job-uid": JOB_UID},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train-3f2a1b-a2",
                    "uid": JOB_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "queueName": "team-a-lq",
            "podSets": [{"name": "main", "count": 1, "template": {}}],
            "priority": 100,
            "active": True,
        },
        "status": {"conditions": conditions, **status},
    }


def cond(
    type_: str, status: str, reason: str, message: str = "", at: str = "2025-06-01T10:00:00Z"
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 1,
    }


ADMISSION = {
    "clusterQueue": "gpu-cq",
    "podSetAssignments": [
        {
            "name": "main",
            "count": 1,
            "flavors": {"cpu": "default-cpu", "memory": "default-cpu", "nvidia.com/gpu": "a100-80g"},
            "resourceUsage": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        }
    ],
}


def ev(obj: dict[str, Any], type_: str = "MODIFIED") -> c.WatchEvent:
    return c.WatchEvent(type=type_, object=obj, cluster="prod")


def only(out: list[Any]) -> Any:
    assert len(out) == 1, out
    return out[0]


# ---- identity


def test_run_ref_reads_tau_labels_and_attempt() -> None:
    assert run_ref({"metadata": {"labels": TAU_LABELS}}) == REF
    assert run_ref({"metadata": {"labels": {"taugrid.io/run-id": "x"}}}) is None
    assert run_ref({"metadata": {}}) is None


def test_workload_resolves_through_job_uid_owner_map() -> None:
    wl = workload([cond("QuotaReserved", "False", "Pending", "waiting")])
    assert owner_uids(wl) == [JOB_UID]
    out = only(translate(ev(wl), OWNERS))
    assert (out.workspace, out.run_id, out.attempt) == ("team-a", "train-3f2a1b", 2)


def test_workload_of_an_unknown_job_yields_nothing() -> None:
    assert translate(ev(workload([cond("QuotaReserved", "False", "Pending")])), {}) == []


def test_remember_owner_tracks_jobs_and_forgets_deleted_ones() -> None:
    owners: dict[str, RunRef] = {}
    job = {"kind": "Job", "metadata": {"uid": JOB_UID, "labels": TAU_LABELS}}
    remember_owner(ev(job, "ADDED"), owners)
    assert owners == {JOB_UID: REF}
    remember_owner(ev(job, "DELETED"), owners)
    assert owners == {}


# ---- Workload


def test_pending_workload_is_queued_with_kueue_reason_and_shortfall() -> None:
    msg = (
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor a100-80g, 1 more needed"
    )
    wl = workload([cond("QuotaReserved", "False", "Pending", msg)])
    wl["metadata"]["annotations"] = {"taugrid.io/queue-position": "3"}
    out = only(translate(ev(wl), OWNERS))
    assert out.event_type == "admission.queued"
    assert out.payload.reason == "Pending" and out.payload.message == msg
    assert out.payload.position == 3
    assert out.payload.waiting_for == {
        "queue": "team-a-lq",
        "resource": "nvidia.com/gpu",
        "flavor": "a100-80g",
        "more_needed": "1",
    }


def test_same_queued_reason_dedups_and_a_changed_one_does_not() -> None:
    a = only(translate(ev(workload([cond("QuotaReserved", "False", "Pending", "x")])), OWNERS))
    b = only(translate(ev(workload([cond("QuotaReserved", "False", "Pending", "x")])), OWNERS))
    d = only(translate(ev(workload([cond("QuotaReserved", "False", "Pending", "y")])), OWNERS))
    assert a.dedup == b.dedup and a.dedup != d.dedup and a.dedup


def test_admitted_workload_carries_cluster_queue_and_flavors() -> None:
    wl = workload(
        [cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted")],
        admission=ADMISSION,
    )
    out = only(translate(ev(wl), OWNERS))
    assert out.event_type == "admission.admitted"
    assert out.payload == c.AdmissionAdmitted(
        cluster_queue="gpu-cq",
        flavors={"cpu": "default-cpu", "memory": "default-cpu", "nvidia.com/gpu": "a100-80g"},
    )


def test_flavors_that_differ_between_podsets_are_keyed_by_podset() -> None:
    admission = copy.deepcopy(ADMISSION)
    admission["podSetAssignments"].append(
        {"name": "workers", "count": 2, "flavors": {"nvidia.com/gpu": "h100"}}
    )
    wl = workload([cond("Admitted", "True", "Admitted")], admission=admission)
    flavors = only(translate(ev(wl), OWNERS)).payload.flavors
    assert flavors["nvidia.com/gpu"] == "a100-80g" and flavors["workers/nvidia.com/gpu"] == "h100"


def test_a_tas_admission_carries_each_pod_sets_topology_assignment_uncompressed() -> None:
    """Kueue v1beta2's compressed form (a universal block, racks under a prefix, individual pod counts; the CRD's
    own example 2) for the workers, v1beta1's domains for the launcher, read into the run's admission event."""
    rack, block = "cloud.provider.com/topology-rack", "cloud.provider.com/topology-block"
    host = "kubernetes.io/hostname"
    admission = copy.deepcopy(ADMISSION)
    admission["podSetAssignments"][0]["topologyAssignment"] = {"levels": [host], "domains": [
        {"values": ["node-7"], "count": 1}]}
    admission["podSetAssignments"].append({
        "name": "workers", "count": 6, "flavors": {"nvidia.com/gpu": "a100-80g"},
        "topologyAssignment": {"levels": [block, rack], "slices": [{
            "domainCount": 2, "valuesPerLevel": [{"universal": "block-1"},
                                                 {"individual": {"prefix": "rack-", "roots": ["1", "2"]}}],
            "podCounts": {"individual": [4, 2]}}]}})
    wl = workload([cond("Admitted", "True", "Admitted")], admission=admission)
    assert only(translate(ev(wl), OWNERS)).payload.topology == [
        c.PodSetTopology(pod_set="main", levels=[host], domains=[c.TopologyDomain(values=["node-7"], count=1)]),
        c.PodSetTopology(pod_set="workers", levels=[block, rack], domains=[
            c.TopologyDomain(values=["block-1", "rack-1"], count=4),
            c.TopologyDomain(values=["block-1", "rack-2"], count=2)])]


def test_an_unreadable_topology_assignment_is_left_out_and_the_run_is_still_admitted() -> None:
    admission = copy.deepcopy(ADMISSION)
    admission["podSetAssignments"][0]["topologyAssignment"] = {"levels": ["kubernetes.io/hostname"], "slices": [
        {"domainCount": 2, "valuesPerLevel": [{"universal": "n"}], "podCounts": {"individual": [1]}}]}
    out = only(translate(ev(workload([cond("Admitted", "True", "Admitted")], admission=admission)), OWNERS))
    assert (out.event_type, out.payload.cluster_queue, out.payload.topology) == ("admission.admitted", "gpu-cq", [])


def test_quota_reserved_but_checks_pending_is_still_queued() -> None:
    wl = workload(
        [cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "False", "NoChecks")],
        admission=ADMISSION,
        admissionChecks=[
            {
                "name": "prov-req",
                "state": "Pending",
                "message": "",
                "lastTransitionTime": "2025-06-01T10:00:00Z",
            }
        ],
    )
    out = only(translate(ev(wl), OWNERS))
    assert out.event_type == "admission.queued"
    assert out.payload.reason == "WaitingForAdmissionChecks" and out.payload.cluster_queue == "gpu-cq"
    assert out.payload.waiting_for["admission_checks"] == {"prov-req": "Pending"}


def test_preempted_workload_names_the_preemptor_run() -> None:
    other_uid = "11111111-2222-3333-4444-555555555555"
    owners = {**OWNERS, other_uid: RunRef("team-b", "urgent-aa11bb", 1)}
    wl = workload(
        [
            cond("QuotaReserved", "False", "Pending", "Preempted to accommodate a higher priority Workload"),
            cond(
                "Evicted",
                "True",
                "Preempted",
                "Preempted to accommodate a higher priority Workload",
                at="2025-06-01T11:00:00Z",
            ),
            cond(
                "Preempted",
                "True",
                "InClusterQueue",
                f"Preempted to accommodate a workload (UID: abc, JobUID: {other_uid}) due to prioritization "
                "in the ClusterQueue",
            ),
            cond("Requeued", "True", "Preempted"),
        ]
    )
    out = only(translate(ev(wl), owners))
    assert out.event_type == "admission.preempted"
    assert out.payload.reason == "Preempted" and out.payload.preemptor == "urgent-aa11bb"
    assert out.payload.message.startswith("InClusterQueue: ")


def test_a_local_workload_names_its_preemptor_run_without_resolving_a_uid() -> None:
    other_uid = "11111111-2222-3333-4444-555555555555"
    wl = workload(
        [
            cond("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload"),
            cond("Preempted", "True", "InClusterQueue", f"Preempted to accommodate a workload (JobUID: {other_uid})"),
        ]
    )
    assert uids_to_resolve(wl) == [JOB_UID, other_uid]  # Kueue's: both uids go through the owners map
    wl["metadata"]["labels"].update({"taugrid.io/run-id": "train-3f2a1b", "taugrid.io/workspace": "team-a",
                                     "taugrid.io/attempt": "2"})
    wl["metadata"]["annotations"] = {ANNOTATION_PREEMPTOR_RUN: "urgent-aa11bb"}
    wl["status"]["conditions"][-1]["message"] = "Preempted to accommodate a workload (JobUID: urgent-aa11bb-a1)"
    assert uids_to_resolve(wl) == []  # the local cluster's: labelled with its run, the preemptor's run named
    out = only(translate(ev(wl), {}))
    assert out.event_type == "admission.preempted" and out.payload.preemptor == "urgent-aa11bb"


def test_eviction_for_other_reasons_is_reported_as_evicted() -> None:
    wl = workload([cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout team-a/x")])
    out = only(translate(ev(wl), OWNERS))
    assert out.event_type == "admission.preempted"
    assert out.payload.reason == "Evicted" and out.payload.message.startswith("PodsReadyTimeout: Exceeded")


def test_a_workload_kueue_deactivated_past_its_requeue_limit_fails_the_attempt() -> None:
    """Kueue v0.19.2's workload_controller_eviction_test: past waitForPodsReady's backoffLimitCount the Workload is
    Evicted with DeactivatedDueToRequeuingLimitExceeded and never admitted again; the run must not wait for it."""
    message = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
    wl = workload([cond("Evicted", "True", "DeactivatedDueToRequeuingLimitExceeded", message)])
    out = only(translate(ev(wl), OWNERS))
    assert (out.event_type, out.payload) == ("exec.failed", c.ExecFinished(
        reason="RequeuingLimitExceeded", message=message))
    assert classify("RequeuingLimitExceeded") == "evicted"  # resilience.retry_on: [Evicted] may retry it


def test_a_pods_ready_backoff_is_the_runs_queued_reason_as_kueues_requeued_condition_words_it() -> None:
    message = "Exceeded the PodsReady timeout team-a/x"
    evicted = cond("Evicted", "True", "PodsReadyTimeout", message, at="2025-06-01T11:00:00Z")
    waiting = workload([evicted, cond("Requeued", "False", "PodsReadyTimeout", message, at="2025-06-01T11:00:00Z")])
    waiting["status"]["requeueState"] = {"count": 1, "requeueAt": "2025-06-01T11:01:00Z"}
    preempted, queued = translate(ev(waiting), OWNERS)
    assert preempted.event_type == "admission.preempted"
    assert (queued.event_type, queued.payload.reason, queued.payload.message, queued.payload.waiting_for) == (
        "admission.queued", "PodsReadyTimeout", message, {"queue": "team-a-lq", "requeue_at": "2025-06-01T11:01:00Z"})
    done = workload([evicted, cond("Requeued", "True", "BackoffFinished", "The workload backoff was finished",
                                   at="2025-06-01T11:01:00Z")])
    done["status"]["requeueState"] = {"count": 1}
    again, finished = translate(ev(done), OWNERS)
    assert again.dedup == preempted.dedup and finished.payload.reason == "BackoffFinished"
    later = workload([cond("Evicted", "True", "PodsReadyTimeout", message, at="2025-06-01T12:00:00Z"),
                      cond("Requeued", "False", "PodsReadyTimeout", message, at="2025-06-01T12:00:00Z")])
    later["status"]["requeueState"] = {"count": 2, "requeueAt": "2025-06-01T12:02:00Z"}
    assert translate(ev(later), OWNERS)[1].dedup != queued.dedup  # the same words, a new backoff
    stale = workload([cond("Evicted", "True", "Preempted", at="2025-06-01T13:00:00Z"),
                      cond("Requeued", "True", "BackoffFinished", at="2025-06-01T11:01:00Z")])
    assert [o.event_type for o in translate(ev(stale), OWNERS)] == ["admission.preempted"]


def test_a_second_eviction_is_a_new_event_and_readmission_too() -> None:
    first = workload([cond("Evicted", "True", "Preempted", at="2025-06-01T11:00:00Z")])
    second = workload([cond("Evicted", "True", "Preempted", at="2025-06-01T12:00:00Z")])
    assert only(translate(ev(first), OWNERS)).dedup != only(translate(ev(second), OWNERS)).dedup
    adm1 = workload([cond("Admitted", "True", "Admitted", at="2025-06-01T10:00:00Z")], admission=ADMISSION)
    adm2 = workload(
        [
            cond("Admitted", "True", "Admitted", at="2025-06-01T13:00:00Z"),
            cond("Evicted", "False", "QuotaReserved"),
        ],
        admission=ADMISSION,
    )
    assert only(translate(ev(adm1), OWNERS)).dedup != only(translate(ev(adm2), OWNERS)).dedup


def test_requeue_backoff_is_queued_with_requeue_time() -> None:
    wl = workload(
        [cond("QuotaReserved", "False", "Pending"), cond("Requeued", "False", "Backoff")],
        requeueState={"count": 2, "requeueAt": "2025-06-01T12:00:00Z"},
    )
    out = only(translate(ev(wl), OWNERS))
    assert out.payload.reason == "Backoff" and out.payload.waiting_for["requeue_at"] == "2025-06-01T12:00:00Z"


def test_finished_and_deleted_workloads_defer_to_the_job() -> None:
    fin = workload([cond("Admitted", "True", "Admitted"), cond("Finished", "True", "Succeeded")])
    assert translate(ev(fin), OWNERS) == []
    assert translate(ev(workload([]), "DELETED"), OWNERS) == []


# ---- batch/v1 Job


def job(status: dict[str, Any], *, suspend: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train-3f2a1b-a2", "namespace": "team-a", "uid": JOB_UID, "labels": TAU_LABELS},
        "spec": {"suspend": suspend, "backoffLimit": 0, "template": {}},
        "status": status,
    }


def test_completed_job_succeeds_with_duration() -> None:
    st = {
        "startTime": "2025-06-01T10:00:00Z",
        "completionTime": "2025-06-01T10:05:30Z",
        "succeeded": 1,
        "conditions": [
            cond("SuccessCriteriaMet", "True", "CompletionsReached"),
            cond("Complete", "True", "CompletionsReached"),
        ],
    }
    out = only(translate(ev(job(st))))
    assert out.event_type == "exec.succeeded" and out.dedup == ""
    assert out.payload.exit_code == 0 and out.payload.duration_s == 330.0


def test_failed_job_reports_reason_and_exit_code_from_pod_failure_policy() -> None:
    msg = "Container main for pod team-a/train-3f2a1b-a2-xk2p9 failed with exit code 3 matching FailJob rule at index 0"
    st = {
        "startTime": "2025-06-01T10:00:00Z",
        "failed": 1,
        "conditions": [
            cond("FailureTarget", "True", "PodFailurePolicy", msg),
            cond("Failed", "True", "PodFailurePolicy", msg, at="2025-06-01T10:01:00Z"),
        ],
    }
    out = only(translate(ev(job(st))))
    assert out.event_type == "exec.failed"
    assert (out.payload.reason, out.payload.exit_code, out.payload.duration_s) == (
        "PodFailurePolicy",
        3,
        60.0,
    )


def test_deadline_and_backoff_failures_keep_kubernetes_reason() -> None:
    for reason in ("DeadlineExceeded", "BackoffLimitExceeded"):
        st = {"conditions": [cond("Failed", "True", reason, "Job was active longer than specified deadline")]}
        out = only(translate(ev(job(st))))
        assert out.payload.reason == reason and out.payload.exit_code is None


def test_suspended_or_active_job_says_nothing_itself() -> None:
    assert translate(ev(job({}, suspend=True))) == []
    assert translate(ev(job({"active": 1, "startTime": "2025-06-01T10:00:00Z"}))) == []


def test_deleting_an_unfinished_job_cancels_the_run() -> None:
    out = only(translate(ev(job({"active": 1}), "DELETED")))
    assert out.event_type == "exec.cancelled" and out.payload.reason == "Deleted"
    finished = job({"conditions": [cond("Complete", "True", "CompletionsReached")]})
    assert only(translate(ev(finished, "DELETED"))).event_type == "exec.succeeded"


# ---- ray.io/v1 RayJob


def rayjob(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": "train-3f2a1b-a2",
            "namespace": "team-a",
            "uid": "ray-uid",
            "labels": TAU_LABELS,
        },
        "spec": {"suspend": False, "shutdownAfterJobFinishes": True},
        "status": status,
    }


def test_rayjob_lifecycle() -> None:
    assert translate(ev(rayjob(jobDeploymentStatus="Initializing"))) == []
    assert (
        only(translate(ev(rayjob(jobDeploymentStatus="Running", jobStatus="RUNNING")))).event_type
        == "exec.running"
    )
    ok = only(
        translate(
            ev(
                rayjob(
                    jobDeploymentStatus="Complete",
                    jobStatus="SUCCEEDED",
                    startTime="2025-06-01T10:00:00Z",
                    endTime="2025-06-01T10:00:42Z",
                )
            )
        )
    )
    assert ok.event_type == "exec.succeeded" and ok.payload.duration_s == 42.0
    bad = only(
        translate(
            ev(
                rayjob(
                    jobDeploymentStatus="Failed",
                    jobStatus="FAILED",
                    reason="AppFailed",
                    message="Job entrypoint command failed with exit code 1",
                )
            )
        )
    )
    assert (
        bad.event_type == "exec.failed"
        and bad.payload.reason == "AppFailed"
        and "exit code 1" in bad.payload.message
    )
    stopped = only(translate(ev(rayjob(jobDeploymentStatus="Complete", jobStatus="STOPPED"))))
    assert stopped.event_type == "exec.cancelled" and stopped.payload.reason == "Stopped"
    deadline = only(translate(ev(rayjob(jobDeploymentStatus="Failed", reason="DeadlineExceeded"))))
    assert deadline.payload.reason == "DeadlineExceeded"
    invalid = only(translate(ev(rayjob(jobDeploymentStatus="ValidationFailed", message="bad spec"))))
    assert invalid.event_type == "exec.failed" and invalid.payload.reason == "ValidationFailed"
    gone = only(translate(ev(rayjob(jobDeploymentStatus="Running"), "DELETED")))
    assert gone.event_type == "exec.cancelled" and gone.payload.reason == "Deleted"


# ---- core/v1 Pod


def pod(
    phase: str,
    *,
    container: str = "main",
    cs: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if cs is not None:
        status["containerStatuses"] = [
            {"name": container, "ready": False, "restartCount": 0, "image": "img", **cs}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-3f2a1b-a2-xk2p9",
            "namespace": "team-a",
            "uid": "pod-uid",
            "labels": labels
            if labels is not None
            else {"batch.kubernetes.io/controller-uid": JOB_UID, "batch.kubernetes.io/job-name": "x"},
            "ownerReferences": [{"kind": "Job", "name": "train-3f2a1b-a2", "uid": JOB_UID}],
        },
        "spec": {"nodeName": "gpu-node-7", "containers": [{"name": container, "image": "img"}]},
        "status": status,
    }


def test_running_pod_reports_node_and_pod() -> None:
    out = only(
        translate(
            ev(pod("Running", cs={"state": {"running": {"startedAt": "2025-06-01T10:00:00Z"}}})), OWNERS
        )
    )
    assert out.event_type == "exec.running"
    assert out.payload == c.ExecRunning(node="gpu-node-7", pod="train-3f2a1b-a2-xk2p9")


def test_only_the_first_rank_of_a_gang_says_the_run_is_running() -> None:
    """Issue 30: one exec.running a run, not one a pod. Rank 0 of an Indexed Job says it (Kubernetes annotates the
    completion index; the local cluster labels it), a requeued gang's new rank 0 says it again; the other ranks and
    a Ray worker say nothing (each pod's node is in its exec.progress)."""
    running = {"state": {"running": {"startedAt": "2025-06-01T10:00:00Z"}}}

    def ranked(name: str, index: str, *, where: str = "annotations") -> dict[str, Any]:
        obj = pod("Running", cs=running)
        obj["metadata"]["name"] = name
        obj["metadata"].setdefault(where, {})["batch.kubernetes.io/job-completion-index"] = index
        return obj

    outs = [translate(ev(ranked(f"train-3f2a1b-a2-{i}-x", str(i))), OWNERS) for i in range(4)]
    assert [[o.event_type for o in out] for out in outs] == [["exec.running"], [], [], []]
    assert outs[0][0].payload == c.ExecRunning(node="gpu-node-7", pod="train-3f2a1b-a2-0-x")
    by_label = [translate(ev(ranked(f"local-{i}", str(i), where="labels")), OWNERS) for i in range(2)]
    assert [[o.payload.pod for o in out] for out in by_label] == [["local-0"], []]
    requeued = only(translate(ev(ranked("train-3f2a1b-a2-0-r1", "0")), OWNERS))
    assert requeued.event_type == "exec.running" and requeued.dedup != outs[0][0].dedup
    worker = pod("Running", cs=running, labels={"batch.kubernetes.io/controller-uid": JOB_UID,
                                                "ray.io/node-type": "worker"})
    assert translate(ev(worker), OWNERS) == []
    # a rank past the first still reports its failure, the run's end
    failed = ranked("train-3f2a1b-a2-3-x", "3")
    failed["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}
    assert only(translate(ev(failed), OWNERS)).payload == c.ExecFinished(exit_code=3, reason="Error",
                                                                         node="gpu-node-7")


def test_a_gangs_first_rank_lists_the_pods_that_started_with_it() -> None:
    """The local cluster's simulated Job: rank 0's exec.running carries every pod's name, node and rank (issue 30);
    an annotation that does not read leaves the list empty, the run still running."""
    running = {"state": {"running": {"startedAt": "2025-06-01T10:00:00Z"}}}
    first = pod("Running", cs=running)
    gang = '[{"name":"train-3f2a1b-a2-0","node":"n1"},{"name":"train-3f2a1b-a2-1","node":"n2","index":1}]'
    first["metadata"]["annotations"] = {"taugrid.io/gang": gang, "taugrid.io/gang-started": "train-3f2a1b-a2-0"}
    out = only(translate(ev(first), OWNERS))
    assert out.payload.pods == [c.GangPod(name="train-3f2a1b-a2-0", node="n1"),
                                c.GangPod(name="train-3f2a1b-a2-1", node="n2", index=1)]
    first["metadata"]["annotations"]["taugrid.io/gang"] = "[{"
    assert only(translate(ev(first), OWNERS)).payload == c.ExecRunning(node="gpu-node-7", pod="train-3f2a1b-a2-xk2p9")


def test_a_pod_preparing_its_environment_reports_progress_then_runs_with_it() -> None:
    waiting = {"waiting": {"reason": "PreparingEnvironment", "message": "installing requirements.txt with uv"}}
    out = only(translate(ev(pod("Pending", cs={"state": waiting})), OWNERS))
    assert out.event_type == "exec.preparing"
    assert out.payload == c.ExecPreparing(step="environment", message="installing requirements.txt with uv",
                                          node="gpu-node-7", pod="train-3f2a1b-a2-xk2p9")
    other = copy.deepcopy(waiting)
    other["waiting"]["message"] = "environment ready"
    assert only(translate(ev(pod("Pending", cs={"state": other})), OWNERS)).dedup != out.dedup
    running = pod("Running", cs={"state": {"running": {}}})
    running["metadata"]["annotations"] = {"environment.taugrid.io/python": "/envs/ab/bin/python",
                                          "environment.taugrid.io/python_version": "3.11.2",
                                          "taugrid.io/traceparent": "00-x"}
    got = only(translate(ev(running), OWNERS))
    assert got.payload.environment == {"python": "/envs/ab/bin/python", "python_version": "3.11.2"}


def test_oom_killed_main_container_fails_with_exit_code() -> None:
    term = {
        "terminated": {
            "exitCode": 137,
            "reason": "OOMKilled",
            "startedAt": "2025-06-01T10:00:00Z",
            "finishedAt": "2025-06-01T10:00:10Z",
        }
    }
    out = only(translate(ev(pod("Failed", cs={"state": term})), OWNERS))
    assert out.event_type == "exec.failed"
    assert (out.payload.exit_code, out.payload.reason, out.payload.node, out.payload.duration_s) == (
        137,
        "OOMKilled",
        "gpu-node-7",
        10.0,
    )


def test_disrupted_pod_reports_the_disruption_not_a_generic_error() -> None:
    term = {"terminated": {"exitCode": 143, "reason": "Error"}}
    dis = cond(
        "DisruptionTarget", "True", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute"
    )
    out = only(translate(ev(pod("Failed", cs={"state": term}, conditions=[dis])), OWNERS))
    assert out.payload.reason == "DeletionByTaintManager" and out.payload.exit_code == 143


def test_a_failed_source_fetch_fails_the_run_with_its_termination_message() -> None:
    message = ("source fetch failed: source snapshot sources/ab.tar.gz has digest sha256:ab, "
               "but this pod expects sha256:cd")
    failed = pod("Failed", cs={"state": {"waiting": {"reason": "PodInitializing"}}})
    failed["status"]["initContainerStatuses"] = [{
        "name": "tau-source-fetch", "ready": False, "restartCount": 0, "image": "taugrid",
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message + "\n",
                                 "startedAt": "2025-06-01T10:00:00Z", "finishedAt": "2025-06-01T10:00:02Z"}},
    }]
    out = only(translate(ev(failed), OWNERS))
    assert out.event_type == "exec.failed"
    assert out.payload == c.ExecFinished(
        exit_code=1, reason="InitContainerFailed", message=f"init container tau-source-fetch: {message}",
        node="gpu-node-7", duration_s=2.0,
    )


def test_image_pull_backoff_is_fatal_but_err_image_pull_is_a_hint() -> None:
    fatal = pod(
        "Pending",
        cs={
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}
        },
    )
    out = only(translate(ev(fatal), OWNERS))
    assert out.event_type == "exec.failed" and out.payload.reason == "ImagePullBackOff"
    hint = pod(
        "Pending", cs={"state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}
    )
    out = only(translate(ev(hint), OWNERS))
    assert out.event_type == "admission.queued" and out.payload.reason == "ErrImagePull"
    creating = pod("Pending", cs={"state": {"waiting": {"reason": "ContainerCreating"}}})
    assert translate(ev(creating), OWNERS) == []


def test_unschedulable_pod_is_queued_with_scheduler_message() -> None:
    msg = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    p = pod("Pending", conditions=[cond("PodScheduled", "False", "Unschedulable", msg)])
    p["spec"].pop("nodeName")
    out = only(translate(ev(p), OWNERS))
    assert out.event_type == "admission.queued" and out.payload.reason == "Unschedulable"
    assert out.payload.message == msg


def test_ray_pods_do_not_speak_for_the_run_process() -> None:
    head = pod(
        "Failed",
        container="ray-head",
        labels=TAU_LABELS,
        cs={"state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
    )
    assert translate(ev(head)) == []
    assert translate(ev(pod("Running", container="ray-head", labels=TAU_LABELS))) == []


def test_pods_with_tau_labels_need_no_owner_map() -> None:
    out = only(translate(ev(pod("Running", labels=TAU_LABELS))))
    assert (out.run_id, out.attempt) == ("train-3f2a1b", 2)


def test_objects_of_other_kinds_or_runs_are_ignored() -> None:
    assert translate(ev({"kind": "Node", "metadata": {"labels": TAU_LABELS}})) == []
    assert translate(ev(pod("Running", labels={})), {}) == []


def test_a_resize_recorded_on_a_running_job_is_exec_resized_once_per_resize() -> None:
    shrink = ('{"old_count":3,"new_count":2,"cause":"ShrunkForPreemptor","preemptor":"hi-1","pod_set":"main",'
              '"at":"2026-12-01T19:00:00Z"}')
    running = job({"active": 2})
    running["metadata"]["annotations"] = {ANNOTATION_RESIZED: shrink}
    out = only(translate(ev(slim(running))))  # as the bus carries it: no Job spec
    assert (out.event_type, out.run_id, out.attempt) == ("exec.resized", "train-3f2a1b", 2)
    assert out.payload == c.ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1",
                                        pod_set="main")
    again = copy.deepcopy(running)
    again["status"]["ready"] = 2  # another change of the same Job: the same resize, the same message id
    assert only(translate(ev(again))).dedup == out.dedup
    grown = copy.deepcopy(running)
    grown["metadata"]["annotations"][ANNOTATION_RESIZED] = shrink.replace('"at":"2026-12-01T19:00:00Z"',
                                                                          '"at":"2026-12-01T19:05:00Z"')
    assert only(translate(ev(grown))).dedup != out.dedup  # a later resize to the same size is its own event
    suspended = copy.deepcopy(running)
    suspended["status"]["conditions"] = [cond("Suspended", "True", "JobSuspended")]
    assert translate(ev(suspended)) == []  # preempted: it starts again at its admitted size
    running["metadata"]["annotations"][ANNOTATION_RESIZED] = '{"old_count":"three"}'
    assert translate(ev(running)) == []  # unreadable: logged, nothing invented
