"""The run state machine and the retry decision (pure)."""

from __future__ import annotations

from taugrid.core import states
from taugrid.core.classify import classify, decide
from taugrid.core.contracts import Resilience


def _record() -> states.RunRecord:
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.admitted",
              "exec.running"):
        assert states.apply(r, t, 1, {}, 1.0), t
    return r


def test_a_run_reaches_a_terminal_state_exactly_once() -> None:
    r = _record()
    assert states.apply(r, "exec.succeeded", 1, {"exit_code": 0}, 2.0)
    assert r.state == "succeeded" and r.finished == 2.0
    assert not states.apply(r, "exec.succeeded", 1, {}, 3.0)  # duplicate
    assert not states.apply(r, "exec.cancelled", 1, {}, 3.0)  # a racing terminal event loses
    assert r.state == "succeeded" and r.finished == 2.0


def test_events_of_a_superseded_attempt_are_ignored() -> None:
    r = _record()
    assert states.apply(r, "exec.failed", 1, {"reason": "Error", "exit_code": 1}, 2.0)
    assert states.apply(r, "recovery.retrying", 2, {}, 3.0) and r.attempt == 2
    assert not states.apply(r, "exec.running", 1, {}, 4.0)  # the old attempt's pod
    assert not states.apply(r, "recovery.retrying", 2, {}, 4.0)  # redelivered decision
    assert states.apply(r, "render.applied", 2, {}, 5.0)


def test_out_of_order_queue_event_after_running_does_not_move_the_run_back() -> None:
    r = _record()
    assert not states.apply(r, "admission.queued", 1, {"reason": "Pending"}, 2.0)
    assert r.state == "running"


def test_queued_phase_explains_what_the_run_waits_for() -> None:
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved", "render.applied"):
        states.apply(r, t, 1, {}, 1.0)
    states.apply(r, "admission.queued", 1, {"reason": "Pending", "position": 2, "waiting_for": {
        "resource": "nvidia.com/gpu", "flavor": "a100", "more_needed": "2"}}, 2.0)
    queued = next(p for p in r.phases if p.name == "admission")
    assert queued.status == "active" and "2 more nvidia.com/gpu in flavor a100" in queued.hint
    assert "2 run(s) ahead" in queued.hint


def test_classification_of_failures() -> None:
    assert classify("OOMKilled", 137) == "oom"
    assert classify("Error", 1) == "app_error"
    assert classify("DeadlineExceeded") == "timeout"
    assert classify("", 3) == "app_error"
    assert classify("InCohortReclamation") == "preempted"
    assert classify("anything", event_type="health.degraded") == "gpu_fault"


def test_retry_decision_follows_retry_on_and_backs_off_exponentially() -> None:
    res = Resilience(max_retries=3, retry_on=["Error"], backoff_initial_s=10, backoff_max_s=25)
    first = decide(reason="Error", exit_code=1, attempt=1, resilience=res)
    second = decide(reason="Error", exit_code=1, attempt=2, resilience=res)
    third = decide(reason="Error", exit_code=1, attempt=3, resilience=res)
    assert (first.retry, first.delay_s) == (True, 10) and second.delay_s == 20 and third.delay_s == 25
    assert not decide(reason="Error", exit_code=1, attempt=4, resilience=res).retry
    oom = decide(reason="OOMKilled", exit_code=137, attempt=1, resilience=res)
    assert not oom.retry and "not in resilience.retry_on" in oom.reason


def test_platform_faults_retry_elsewhere_even_if_not_listed() -> None:
    res = Resilience(max_retries=1, retry_on=[])
    d = decide(reason="GpuFault", exit_code=None, attempt=1, resilience=res, event_type="health.degraded")
    assert d.retry and d.exclude_node and d.classification == "gpu_fault"
    assert not decide(reason="Cancelled", exit_code=None, attempt=1, resilience=Resilience(max_retries=5,
                                                                                           retry_on=["Any"])).retry


def _admitted() -> states.RunRecord:
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.admitted"):
        assert states.apply(r, t, 1, {}, 1.0), t
    return r


def test_environment_phase_shows_progress_and_the_interpreter_is_recorded() -> None:
    r = _admitted()
    assert states.apply(r, "exec.preparing", 1, {"message": "installing requirements.txt with uv"}, 2.0)
    env = next(p for p in r.phases if p.name == "environment")
    assert r.state == "admitted" and env.status == "active" and env.detail == "installing requirements.txt with uv"
    assert r.message == ""  # progress is the phase's, not the run's message
    assert states.apply(r, "exec.running", 1, {"environment": {"python": "/e/bin/python"}}, 3.0)
    assert env.status == "done" and env.finished == 3.0 and r.environment == {"python": "/e/bin/python"}
    assert [p.name for p in r.phases][-2:] == ["environment", "running"]


def test_a_run_without_an_environment_build_has_no_environment_phase() -> None:
    assert "environment" not in [p.name for p in _record().phases]


def test_a_failed_environment_build_marks_the_phase_failed_and_is_not_retried() -> None:
    r = _admitted()
    states.apply(r, "exec.preparing", 1, {"message": "installing"}, 2.0)
    assert states.apply(r, "exec.failed", 1, {"reason": "EnvironmentFailed", "message": "uv failed"}, 3.0)
    assert next(p for p in r.phases if p.name == "environment").status == "failed"
    assert classify("EnvironmentFailed", 1) == "config"
    # the pod's exit status 128 is the local cluster's, not the code's: the summary never says the code exited
    assert states.apply(r, "recovery.gave_up", 1, {"reason": "EnvironmentFailed: not retryable", "exit_code": 128},
                        4.0)
    finished = next(p for p in r.phases if p.name == "finished")
    assert "exited with status" not in finished.hint and "code never ran" in finished.hint
    decision = decide(reason="EnvironmentFailed", exit_code=1, attempt=1,
                      resilience=Resilience(max_retries=3, retry_on=["Any"]))
    assert decision == type(decision)(False, "config", 0.0, "EnvironmentFailed: not retryable", False)


def test_a_finished_run_carries_its_terminal_reason_not_a_queued_message() -> None:
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved", "render.applied"):
        states.apply(r, t, 1, {}, 1.0)
    states.apply(r, "admission.queued", 1, {"reason": "Pending", "message": "waiting for Kueue to consider the "
                                            "workload", "cluster_queue": ""}, 1.5)
    states.apply(r, "admission.admitted", 1, {"cluster_queue": "local"}, 2.0)
    assert r.message == "" and r.cluster_queue == "local" and r.position is None
    states.apply(r, "exec.failed", 1, {"reason": "Error", "exit_code": 1}, 3.0)
    states.apply(r, "recovery.gave_up", 1, {"reason": "Error: not in resilience.retry_on (Preempted, Evicted)",
                                            "hint": "add Error to resilience.retry_on to retry crashes"}, 4.0)
    assert (r.state, r.reason, r.message, r.hint, r.cluster_queue) == (
        "failed", "Error: not in resilience.retry_on (Preempted, Evicted)", "",
        "add Error to resilience.retry_on to retry crashes", "local")


def test_a_cancelled_run_says_who_cancelled_it() -> None:
    r = _record()
    assert states.apply(r, "cancel.accepted", 1, {"reason": "cancelled by user", "by": "ada"}, 2.0)
    states.apply(r, "exec.cancelled", 1, {"reason": "Deleted", "message": "Job was deleted before it finished"}, 3.0)
    assert (r.state, r.reason, r.message, r.phases[-1].detail) == (
        "cancelled", "Cancelled", "cancelled by ada", "cancelled by ada")


def test_a_rejected_run_carries_its_first_reason() -> None:
    r = states.RunRecord(run_id="r1", workspace="ws")
    states.apply(r, "submit.requested", 1, {}, 1.0)
    states.apply(r, "submit.accepted", 1, {}, 1.0)
    states.apply(r, "policy.rejected", 1, {"reasons": [
        {"field": "policy.workspace", "message": "unknown workspace 'nowhere'"},
        {"field": "compute.gpus", "message": "too many"}], "message": "all of it"}, 2.0)
    assert (r.state, r.reason, r.message) == ("rejected", "policy.workspace: unknown workspace 'nowhere'",
                                              "all of it")


def test_giving_up_on_a_crash_says_how_to_retry_crashes() -> None:
    wanted = decide(reason="Error", exit_code=1, attempt=1, resilience=Resilience(max_retries=1))
    assert not wanted.retry and wanted.hint == "add Error to resilience.retry_on to retry crashes"
    none_allowed = decide(reason="Error", exit_code=1, attempt=1, resilience=Resilience(max_retries=0))
    assert none_allowed.hint == "the script raised or exited non-zero: fix the error in its output (`tau logs RUN`)"
    oom = decide(reason="OOMKilled", exit_code=137, attempt=1, resilience=Resilience(max_retries=2))
    assert oom.hint == "add OOMKilled to resilience.retry_on to retry oom failures"


def test_a_pods_environment_arrives_after_the_job_already_said_running() -> None:
    r = _record()
    assert states.apply(r, "exec.running", 1, {"environment": {"python": "/e/bin/python"}}, 2.0)
    assert r.state == "running" and r.environment == {"python": "/e/bin/python"}
    assert not states.apply(r, "exec.running", 1, {}, 3.0)  # nothing new: still a duplicate


def test_an_elastic_runs_resize_is_recorded_kept_across_a_preemption_and_forgotten_on_a_retry() -> None:
    r = _record()
    shrunk = {"old_count": 3, "new_count": 2, "cause": "ShrunkForPreemptor", "preemptor": "hi-1"}
    assert states.apply(r, "exec.resized", 1, shrunk, 2.0)
    assert (r.state, r.size, r.resized) == ("running", 2, "3 -> 2 pods, given up to run hi-1 (ShrunkForPreemptor)")
    assert not states.apply(r, "exec.resized", 2, {"old_count": 2, "new_count": 3, "cause": "Grown"}, 3.0)  # stale
    assert states.apply(r, "exec.resized", 1, {"old_count": 2, "new_count": 3, "cause": "Grown"}, 3.0)
    assert (r.size, r.resized) == (3, "2 -> 3 pods, quota freed (Grown)")
    assert states.apply(r, "exec.resized", 1, shrunk, 3.5)
    assert states.apply(r, "admission.preempted", 1, {"reason": "Preempted"}, 4.0)
    assert (r.size, r.pods) == (2, [])  # requeued at the size it had, as Kueue requeues its Workload
    assert not states.apply(r, "exec.resized", 1, shrunk, 5.0)  # not running: nothing to resize
    assert states.apply(r, "recovery.retrying", 2, {}, 6.0)
    assert (r.size, r.resized) == (0, "")  # a new attempt: a new Job at the written size


def test_a_resize_with_a_message_says_why_in_its_words() -> None:
    drained = {"old_count": 4, "new_count": 2, "cause": "Shrunk", "message": "node g2 drained: XID 79"}
    assert states.resize_text(drained) == "4 -> 2 pods, node g2 drained: XID 79 (Shrunk)"


def test_a_resize_names_the_checkpoint_step_the_workers_resume_from() -> None:
    shrunk = {"old_count": 3, "new_count": 2, "cause": "ShrunkForPreemptor", "preemptor": "hi-1", "checkpoint_step": 0}
    assert states.resize_text(shrunk) == (
        "3 -> 2 pods, given up to run hi-1 (ShrunkForPreemptor), from checkpoint step 0")


def test_a_shrink_drops_the_removed_pods_from_the_record_and_a_growth_adds_the_new_ones_by_their_progress() -> None:
    """No event says a pod was deleted; the shrink removed the highest indices (the names are the Indexed Job's:
    ``<job>-<index>-<suffix>`` on Kubernetes, ``<job>-<index>`` or ``<job>-<index>-g<stamp>`` locally)."""
    r = _record()
    for name in ("r1-a1-0", "r1-a1-1-x7k2p", "r1-a1-2"):
        assert states.apply(r, "exec.progress", 1, {"source": "pod", "pod": name, "pod_phase": "Running"}, 2.0)
    assert states.apply(r, "exec.resized", 1, {"old_count": 3, "new_count": 2, "cause": "Shrunk"}, 3.0)
    assert [p.name for p in r.pods] == ["r1-a1-0", "r1-a1-1-x7k2p"]
    assert states.apply(r, "exec.progress", 1, {"source": "pod", "pod": "r1-a1-2-g6118", "pod_phase": "Running"}, 4.0)
    assert states.apply(r, "exec.resized", 1, {"old_count": 2, "new_count": 3, "cause": "Grown"}, 4.1)
    assert [p.name for p in r.pods] == ["r1-a1-0", "r1-a1-1-x7k2p", "r1-a1-2-g6118"]


def _running_pods(r: states.RunRecord, names: list[str]) -> None:
    main = {"name": "main", "kind": "app", "state": "running"}
    for name in names:
        assert states.apply(r, "exec.progress", 1, {"source": "pod", "pod": name, "node": f"n-{name[-1]}",
                                                   "pod_phase": "Running", "containers": [main]}, 2.0)


def test_a_completed_job_says_each_pod_still_shown_running_succeeded() -> None:
    """The local cluster's simulated pods do not publish their ends (issue 30); a Job is Complete only once every
    index succeeded, so its exec.succeeded ends each pod the record still shows running, in its node."""
    r = _record()
    _running_pods(r, ["r1-a1-0", "r1-a1-1"])
    assert states.apply(r, "exec.succeeded", 1, {"exit_code": 0, "reason": "Completed"}, 3.0)
    assert [(p.name, p.node, p.phase, [(c.state, c.reason, c.exit_code) for c in p.containers]) for p in r.pods] == [
        ("r1-a1-0", "n-0", "Succeeded", [("terminated", "Completed", 0)]),
        ("r1-a1-1", "n-1", "Succeeded", [("terminated", "Completed", 0)])]


def test_a_rayjobs_success_says_nothing_of_how_its_pods_ended() -> None:
    r = _record()
    _running_pods(r, ["r1-a1-head"])
    assert states.apply(r, "exec.succeeded", 1, {"exit_code": 0, "reason": "Succeeded"}, 3.0)
    assert [(p.phase, p.containers[0].state) for p in r.pods] == [("Running", "running")]


def test_an_exec_running_that_lists_the_gang_shows_each_pod_running_on_its_node() -> None:
    """The local cluster's simulated pods send no started report each (issue 30): their first rank's exec.running
    lists them, and the record shows each pod and the pod-level phases through, as their reports would have."""
    r = states.RunRecord(run_id="r1", workspace="ws")
    for t in ("submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.admitted"):
        assert states.apply(r, t, 1, {}, 1.0), t
    gang = [{"name": "r1-a1-0", "node": "n1"}, {"name": "r1-a1-1", "node": "n2", "index": 1}]
    assert states.apply(r, "exec.running", 1, {"node": "n1", "pod": "r1-a1-0", "pods": gang}, 2.0)
    assert r.state == "running" and r.node == "n1"
    assert [(p.name, p.node, p.phase) for p in r.pods] == [("r1-a1-0", "n1", "Running"), ("r1-a1-1", "n2", "Running")]
    assert [(p.name, p.status, p.detail) for p in r.phases if p.name in states.POD_PHASES] == [
        ("scheduling", "done", "2/2 pods"), ("image-pull", "done", "2/2 pods"), ("init", "done", "2/2 pods"),
        ("container-start", "done", "2/2 pods")]
    assert states.apply(r, "exec.succeeded", 1, {"exit_code": 0, "reason": "Completed"}, 3.0)
    assert [p.phase for p in r.pods] == ["Succeeded", "Succeeded"]
