"""The admission watcher reads a run's ``run_state`` record only on doubt (``runs.RunGate``), against a real
nats-server: once when it first sees a run and before the events that decide its fate, never again for the
steps in between; a finished run or a superseded attempt still gets nothing, after a restart too; the local
cluster's jobs leave nothing in the ``bridge`` bucket."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import msgspec
import nats.js.errors

from taugrid import runrecord
from taugrid.bus import Bus, kv
from taugrid.bus.envelope import Event, from_message
from taugrid.core.contracts import WatchEvent
from taugrid.core.events import run_subject
from taugrid.core.states import RunRecord
from taugrid.kube.translate import ANNOTATION_RUN_LABELLED
from taugrid_services.admission_watcher.handlers import AdmissionWatcher

WORKSPACE = "team-gate"


def fresh() -> str:
    return f"gate-{uuid.uuid4().hex[:8]}"


def labels(run_id: str, attempt: int) -> dict[str, str]:
    return {"taugrid.io/run-id": run_id, "taugrid.io/workspace": WORKSPACE, "taugrid.io/attempt": str(attempt)}


def event(ev_type: str, obj: dict[str, Any], run_id: str, *, at: str = "") -> Event:
    meta = obj["metadata"]
    return Event(id=f"{meta['uid']}.{uuid.uuid4().hex[:6]}", type=f"{obj['kind'].lower()}.{ev_type.lower()}",
                 source="/svc/local-cluster", subject=run_id, time=at,
                 data=msgspec.json.encode(WatchEvent(type=ev_type, object=obj, cluster="local")))


def job(run_id: str, attempt: int = 1, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{run_id}-a{attempt}", "namespace": WORKSPACE, "uid": f"{run_id}-a{attempt}",
                         "labels": labels(run_id, attempt), "annotations": {ANNOTATION_RUN_LABELLED: "true"}},
            "spec": {"template": {"spec": {"containers": [{"name": "main"}]}}}, "status": status}


def complete(run_id: str) -> dict[str, Any]:
    done = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:09Z"}
    return job(run_id, conditions=[done], startTime="2026-01-01T00:00:01Z", completionTime="2026-01-01T00:00:09Z")


def workload(run_id: str, *, admitted: bool) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if admitted:
        status = {"admission": {"clusterQueue": "cq", "podSetAssignments": []},
                  "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                                 for t in ("QuotaReserved", "Admitted")]}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{run_id}-a1", "namespace": WORKSPACE, "uid": f"wl-{run_id}-a1",
                         "labels": {"kueue.x-k8s.io/job-uid": f"{run_id}-a1", **labels(run_id, 1)}, "annotations": {}},
            "spec": {"queueName": "lq"}, "status": status}


def pod(run_id: str, phase: str, attempt: int = 1) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T00:00:02Z"}} if phase == "Running" else {
        "terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-01-01T00:00:02Z",
                       "finishedAt": "2026-01-01T00:00:03Z"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{run_id}-a{attempt}-pod", "namespace": WORKSPACE, "uid": f"pod-{run_id}-{attempt}",
                         "labels": labels(run_id, attempt)},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": "main", "state": state}]}}


async def record(bus: Bus, run_id: str, *, state: str, attempt: int = 1) -> None:
    await kv.put(bus, runrecord.BUCKET, runrecord.key(WORKSPACE, run_id),
                 RunRecord(run_id=run_id, workspace=WORKSPACE, state=state, attempt=attempt, user="alice"))


async def stored(bus: Bus, run_id: str, event_type: str) -> list[str]:
    """The attempt (``ce-attempt``, 1 when the stored event leaves it out) of the last ``event_type`` stored for the
    run ([] when there is none)."""
    try:
        msg = await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, run_id, event_type))
    except nats.js.errors.NotFoundError:
        return []
    return [str(from_message(msg.subject, msg.headers, msg.data).attempt)]


async def test_a_runs_record_is_read_when_first_seen_and_before_its_end_only(bus: Bus) -> None:
    run_id = fresh()
    await record(bus, run_id, state="rendered")
    watcher = AdmissionWatcher(bus)
    for ev in [event("ADDED", job(run_id), run_id), event("ADDED", workload(run_id, admitted=False), run_id),
               event("MODIFIED", workload(run_id, admitted=True), run_id),
               event("MODIFIED", pod(run_id, "Running"), run_id), event("MODIFIED", complete(run_id), run_id)]:
        await watcher.on_event(ev)
    assert watcher.runs.reads == 2  # the queued event (first sight) and exec.succeeded (decisive)
    for event_type in ("admission.queued", "admission.admitted", "exec.progress", "exec.running", "exec.succeeded"):
        assert await stored(bus, run_id, event_type) == ["1"], event_type
    msg = await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, run_id, "exec.running"))
    assert msg.headers["ce-tauuser"] == "alice"  # the user the first read found
    # the local cluster's job says its Workload carries the run: no owner entry for its uid
    assert await kv.get(bus, "bridge", f"owner.{run_id}-a1") is None


async def test_after_its_own_end_the_watcher_emits_nothing_more_for_the_attempt(bus: Bus) -> None:
    run_id = fresh()
    await record(bus, run_id, state="running")
    watcher = AdmissionWatcher(bus)
    await watcher.on_event(event("MODIFIED", complete(run_id), run_id))
    late = event("MODIFIED", pod(run_id, "Running"), run_id)  # a pod change delivered after the Job's end
    await watcher.on_event(late)
    assert watcher.runs.reads == 1
    assert await stored(bus, run_id, "exec.running") == []


async def test_a_restarted_watcher_never_adds_to_a_finished_run(bus: Bus) -> None:
    run_id = fresh()
    await record(bus, run_id, state="succeeded")
    restarted = AdmissionWatcher(bus)
    await restarted.on_event(event("MODIFIED", pod(run_id, "Running"), run_id))  # redelivered after a restart
    await restarted.on_event(event("MODIFIED", workload(run_id, admitted=True), run_id))
    assert restarted.runs.reads == 1  # then known finished: no more reads
    assert await stored(bus, run_id, "exec.running") == [] and await stored(bus, run_id, "admission.admitted") == []


async def test_an_old_attempts_job_deleted_after_a_retry_never_cancels_the_run(bus: Bus) -> None:
    """The watcher trusts what it read for the steps of a run, but a run's end (here exec.cancelled, which is
    not tied to an attempt) is always checked: recovery retried the run meanwhile, without the watcher seeing it."""
    run_id = fresh()
    await record(bus, run_id, state="rendered")
    watcher = AdmissionWatcher(bus)
    await watcher.on_event(event("MODIFIED", workload(run_id, admitted=True), run_id))
    await record(bus, run_id, state="retrying", attempt=2)
    await watcher.on_event(event("DELETED", job(run_id), run_id))
    assert await stored(bus, run_id, "exec.cancelled") == []
    await watcher.on_event(event("MODIFIED", pod(run_id, "Running"), run_id))  # attempt 1: superseded, known now
    assert watcher.runs.reads == 2 and await stored(bus, run_id, "exec.running") == []


async def test_after_its_own_failure_event_the_watcher_reads_until_the_attempt_changes(bus: Bus) -> None:
    run_id = fresh()
    await record(bus, run_id, state="running")
    watcher = AdmissionWatcher(bus)
    await watcher.on_event(event("MODIFIED", pod(run_id, "Failed"), run_id))  # exec.progress, then exec.failed
    assert watcher.runs.reads == 2 and await stored(bus, run_id, "exec.failed") == ["1"]
    await record(bus, run_id, state="retrying", attempt=2)  # recovery retried
    running = copy.deepcopy(pod(run_id, "Running"))
    running["metadata"]["name"] += "-r1"
    await watcher.on_event(event("MODIFIED", running, run_id))  # attempt 1 still: read once, both outputs dropped
    assert watcher.runs.reads == 3 and await stored(bus, run_id, "exec.running") == []


async def test_run_events_keep_the_time_the_cluster_saw_the_change(bus: Bus) -> None:
    """A run's running time is measured between its exec.running and its end: stamped when this replica got to
    the watch events, a backlog ahead of the first and none ahead of the second shortened it (CI: a 2 s run
    counted 1.874 s). Each run event keeps its watch event's time; one without a time is stamped by the store
    (no ce-time: issue 27)."""
    run_id = fresh()
    await record(bus, run_id, state="admitted")
    watcher = AdmissionWatcher(bus)
    await watcher.on_event(event("MODIFIED", pod(run_id, "Running"), run_id, at="2026-01-01T00:00:02.250Z"))
    await watcher.on_event(event("MODIFIED", complete(run_id), run_id, at="2026-01-01T00:00:09.500Z"))
    times = {}
    for event_type in ("exec.running", "exec.succeeded"):
        msg = await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, run_id, event_type))
        times[event_type] = msg.headers["ce-time"]
    assert times == {"exec.running": "2026-01-01T00:00:02.250Z", "exec.succeeded": "2026-01-01T00:00:09.500Z"}
    other = fresh()
    await record(bus, other, state="admitted")
    await watcher.on_event(event("MODIFIED", pod(other, "Running"), other))
    msg = await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, other, "exec.running"))
    assert "ce-time" not in msg.headers
    ev = from_message(msg.subject, msg.headers, msg.data, stored=msg.time.timestamp())
    assert ev.time.startswith(time.strftime("%Y-%m-%dT", time.gmtime()))
    assert 0 <= msg.time.timestamp() - ev.happened < 0.001  # the store's time, to the millisecond
