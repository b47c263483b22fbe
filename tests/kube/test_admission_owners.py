"""admission-watcher's job uid → run map lives in the ``bridge`` KV bucket, so a real Kueue Workload (which
names its job only by uid) resolves on any replica, or after a restart, against a real nats-server."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import nats.js.errors
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, kv
from taugrid.bus.envelope import Event, from_message
from taugrid.core.contracts import AdmissionAdmitted, ResolvedRun, WatchEvent
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.events import run_subject
from taugrid.core.states import RunRecord
from taugrid_services.admission_watcher.handlers import AdmissionWatcher

WORKSPACE = "team-a"


def event(ev_type: str, obj: dict[str, Any]) -> Event:
    meta = obj["metadata"]
    return Event(
        id=f"{meta['uid']}.{meta['resourceVersion']}", type=f"{obj['kind'].lower()}.{ev_type.lower()}",
        source="/svc/kube-bridge", subject=meta["uid"], time="",
        data=msgspec.json.encode(WatchEvent(type=ev_type, object=obj, cluster="c1")),
    )


def job(run_id: str, uid: str) -> dict[str, Any]:
    labels = {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run_id,
              "taugrid.io/workspace": WORKSPACE, "taugrid.io/attempt": "1"}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{run_id}-a1", "namespace": WORKSPACE, "uid": uid, "resourceVersion": "10",
                     "labels": {**labels, "kueue.x-k8s.io/queue-name": "team-a-lq"}},
        "spec": {"suspend": True, "template": {"metadata": {"labels": labels}, "spec": {}}},
        "status": {},
    }


def admitted_workload(
    owner: dict[str, Any], *, template_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """Shaped like Kueue's: only the job uid label, an ownerReference and the copied pod template."""
    meta = owner["metadata"]
    template = owner["spec"]["template"]
    if template_labels is not None:
        template = {"metadata": {"labels": template_labels}}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"job-{meta['name']}-5d2f1", "namespace": meta["namespace"],
                     "uid": str(uuid.uuid4()), "resourceVersion": "12",
                     "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": owner["kind"],
                                          "name": meta["name"], "uid": meta["uid"], "controller": True}]},
        "spec": {"queueName": "team-a-lq", "podSets": [{"name": "main", "count": 1, "template": template}]},
        "status": {
            "admission": {"clusterQueue": "lab",
                          "podSetAssignments": [{"name": "main", "flavors": {"cpu": "default"}}]},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2025-01-01T00:00:01Z"},
                {"type": "Admitted", "status": "True", "lastTransitionTime": "2025-01-01T00:00:01Z"},
            ],
        },
    }


async def admitted(bus: Bus, run_id: str) -> Any:
    try:
        return await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, run_id, "admission.admitted"))
    except nats.js.errors.NotFoundError:
        return None


async def placed(bus: Bus, run_id: str, namespace: str = WORKSPACE) -> None:
    """The run's record once the policy placed it in ``namespace`` (what a real cluster's object is checked against)."""
    await kv.put(bus, runrecord.BUCKET, runrecord.key(WORKSPACE, run_id),
                 RunRecord(run_id=run_id, workspace=WORKSPACE, state="rendered", attempt=1, user="alice",
                           resolved=ResolvedRun(run_id=run_id, submission_id="s", workspace=WORKSPACE,
                                                 namespace=namespace, name="train")))


async def fresh_placed(bus: Bus) -> tuple[str, str]:
    run_id, uid = fresh()
    await placed(bus, run_id)
    return run_id, uid


def fresh() -> tuple[str, str]:
    return f"train-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())


async def test_a_workload_seen_by_another_replica_is_admitted_for_the_jobs_run(bus: Bus) -> None:
    run_id, uid = await fresh_placed(bus)
    a, b = AdmissionWatcher(bus), AdmissionWatcher(bus)
    owner = job(run_id, uid)

    await a.on_event(event("ADDED", owner))
    await b.on_event(event("MODIFIED", admitted_workload(owner)))

    msg = await admitted(bus, run_id)
    assert msg is not None and from_message(msg.subject, msg.headers, msg.data).attempt == 1
    assert msgspec.json.decode(msg.data, type=AdmissionAdmitted).cluster_queue == "lab"
    assert b.owners[uid].run_id == run_id  # now cached in memory too
    stored = await (await bus.kv("bridge")).get(f"owner.{uid}")
    assert msgspec.json.decode(stored.value) == {"workspace": WORKSPACE, "run_id": run_id, "attempt": 1}


async def test_a_workload_that_beats_its_job_is_retried_until_the_owner_is_recorded(bus: Bus) -> None:
    run_id, uid = await fresh_placed(bus)
    a, b = AdmissionWatcher(bus), AdmissionWatcher(bus)
    owner = job(run_id, uid)
    workload = event("ADDED", admitted_workload(owner))

    with pytest.raises(TemporaryError) as waited:
        await b.on_event(workload)
    assert waited.value.delay == 0.5 and uid in str(waited.value)
    assert await admitted(bus, run_id) is None

    await a.on_event(event("ADDED", owner))
    await b.on_event(workload)  # the redelivery
    assert await admitted(bus, run_id) is not None


async def test_a_restarted_replica_resolves_from_kv_and_the_first_record_wins(bus: Bus) -> None:
    run_id, uid = await fresh_placed(bus)
    owner = job(run_id, uid)
    await AdmissionWatcher(bus).on_event(event("ADDED", owner))
    relabelled = job("someone-else", uid)  # a uid never changes run: the write-once entry stays
    await AdmissionWatcher(bus).on_event(event("MODIFIED", relabelled))

    restarted = AdmissionWatcher(bus)
    await restarted.on_event(event("ADDED", admitted_workload(owner)))
    assert await admitted(bus, run_id) is not None
    assert restarted.owners[uid].run_id == run_id


async def test_a_workload_whose_job_never_shows_up_lands_in_dlq_with_the_reason(bus: Bus) -> None:
    run_id, uid = fresh()
    watcher = AdmissionWatcher(bus, max_tries=3)
    workload = event("ADDED", admitted_workload(job(run_id, uid)))
    for _ in range(2):
        with pytest.raises(TemporaryError):
            await watcher.on_event(workload)
    with pytest.raises(PermanentError) as gave_up:
        await watcher.on_event(workload)
    assert uid in str(gave_up.value) and "never seen" in str(gave_up.value)


async def test_a_workload_of_someone_elses_job_is_dropped_without_retries(bus: Bus) -> None:
    foreign = job("etl", str(uuid.uuid4()))
    foreign["metadata"]["name"] = "nightly-etl"
    workload = admitted_workload(foreign, template_labels={"app": "etl"})
    await AdmissionWatcher(bus).on_event(event("ADDED", workload))  # no TemporaryError: not ours


async def stored(bus: Bus, run_id: str, event_type: str) -> Any:
    try:
        return await bus.js.get_last_msg("RUNS", run_subject(WORKSPACE, run_id, event_type))
    except nats.js.errors.NotFoundError:
        return None
