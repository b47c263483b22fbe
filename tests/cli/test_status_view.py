"""`tau status` views of a run whose image cannot be pulled: the human tree with its tip and pods, and JSON."""

from __future__ import annotations

import msgspec

from taugrid.bus.envelope import Event
from taugrid.cli.views import event_line, phase_tree, stage_line, status_json
from taugrid.core.contracts import ExecResized, WatchEvent
from taugrid.core.states import apply
from taugrid.kube.progress import progress
from tests.kube.test_progress import IMAGE_PULL_BACKOFF, RAYJOB_PROVISIONING, _feed, _running_record, pod


def test_human_tree_names_the_phase_that_stopped_the_run_and_what_to_check() -> None:
    record = _running_record()
    _feed(record, pod(IMAGE_PULL_BACKOFF))
    assert phase_tree(record).splitlines() == [  # not a TTY here: no colour
        "run r1  (?, workspace ws)  state failing  attempt 1",
        "  ✔ submitted           0.0s",
        "  ✔ policy              0.0s",
        "  ✔ rendered            0.0s",
        "  ✔ kueue admission     0.0s  clusterqueue team-a",  # a Job has no RayCluster line
        "  ✔ scheduling          0.0s  node gpu-node-3",
        '  ✘ image pull          0.0s  container main: ImagePullBackOff: Back-off pulling image '
        '"ghcr.io/lab/trian:1"',
        "      tip: image 'ghcr.io/lab/trian:1' cannot be pulled: check the image name and the namespace's "
        "imagePullSecrets",
        "  - init                0.0s",
        "  ○ container start",
        "  - running             0.0s",
        "  ✘ finished            0.0s  ImagePullBackOff",
        "      tip: the image cannot be pulled: check the image name and the namespace's imagePullSecrets",
        "  pods:",
        "    r1-a1-0-x7k2p  Pending  node gpu-node-3",
        "      app  main             waiting (ImagePullBackOff)",
        '  reason: ImagePullBackOff — container main: Back-off pulling image "ghcr.io/lab/trian:1"',
    ]


def test_raycluster_phase_is_shown_for_a_rayjob() -> None:
    record = _running_record()
    record.object_kind = "RayJob"
    _feed(record, RAYJOB_PROVISIONING)
    line = next(line for line in phase_tree(record).splitlines() if "raycluster" in line)
    assert line.strip().startswith("● raycluster") and line.endswith("head pod not ready; 0/2 workers ready")


def test_json_status_carries_phases_and_pods_with_their_containers() -> None:
    record = _running_record()
    _feed(record, pod(IMAGE_PULL_BACKOFF))
    data = status_json(record)
    assert data["schemaVersion"] == "taugrid.io/status/v1" and "history" not in data
    assert [(p["name"], p["status"]) for p in data["phases"]][6] == ("image-pull", "failed")
    assert data["pods"] == [{
        "name": "r1-a1-0-x7k2p", "node": "gpu-node-3", "phase": "Pending",
        "phases": [msgspec.to_builtins(p) for p in record.pods[0].phases],
        "containers": [{"name": "main", "kind": "app", "state": "waiting", "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "ghcr.io/lab/trian:1"', "exit_code": None,
                        "restarts": 0}]}]
    assert [p["status"] for p in data["pods"][0]["phases"]] == ["done", "failed", "skipped", "pending"]


def test_follow_line_of_a_progress_event_says_where_the_pod_stopped() -> None:
    report = progress(WatchEvent(type="MODIFIED", object=pod(IMAGE_PULL_BACKOFF), cluster="prod"))[0].payload
    ev = Event(id="r1.1.exec.progress.x", type="exec.progress", source="/svc/admission-watcher", subject="r1",
               time="2026-11-30T10:01:09Z", data=msgspec.json.encode(report))
    assert event_line(ev).endswith(
        'exec.progress        /svc/admission-watcher   r1-a1-0-x7k2p: image-pull failed container main: '
        'ImagePullBackOff: Back-off pulling image "ghcr.io/lab/trian:1"')


def test_follow_prints_one_progress_line_per_change_and_no_image_pull_for_a_local_pod(
        capsys: object, monkeypatch: object) -> None:
    """Issue 23 item 6: a local pod (a host process) pulls no image, so it never says "pulling images"; a pod's
    status changes more often than where it is, and --follow prints a line only when that line changes."""
    import asyncio
    from typing import Any

    from taugrid.cli import console
    from taugrid.core.contracts import ExecProgress
    from taugrid.core.states import RunRecord
    from taugrid.local import objects

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "r1-a1", "namespace": "ws", "uid": "u"},
           "spec": {"template": {"metadata": {"labels": {"taugrid.io/run-id": "r1", "taugrid.io/workspace": "ws",
                                                         "taugrid.io/attempt": "1"}},
                                 "spec": {"containers": [{"name": "main", "image": "python:3.11-slim"}]}}}}
    created = objects.pod(job, name="r1-a1-pod", node="n1", index=0, at=1.0)
    reports = [progress(WatchEvent(type="ADDED", object=created, cluster="local"))[0].payload]
    assert isinstance(reports[0], ExecProgress)
    assert [(p.name, p.status) for p in reports[0].phases][:2] == [("scheduling", "done"), ("image-pull", "done")]
    objects.pod_running(created, at=2.0)
    running = progress(WatchEvent(type="MODIFIED", object=created, cluster="local"))[0].payload
    reports += [running, msgspec.structs.replace(running, pod_phase="Running"), running]

    class Client:
        async def console(self, run_id: str) -> Any:
            for i, report in enumerate(reports):
                yield Event(id=f"r1.1.exec.progress.{i}", type="exec.progress", source="/svc/admission-watcher",
                            subject="r1", time="2026-11-30T10:01:09Z", data=msgspec.json.encode(report))

        async def settled(self, run_id: str) -> RunRecord:
            return RunRecord(run_id="r1", workspace="ws", state="succeeded")

    async def no_listing(client: object, record: object) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(console, "listing", no_listing)  # type: ignore[attr-defined]
    monkeypatch.setattr(console, "summary_lines", lambda found: [])  # type: ignore[attr-defined]
    asyncio.run(console.follow_run(Client(), "r1", "text"))
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    lines = [line for line in out.splitlines() if "exec.progress" in line]
    assert [line.split("] ", 1)[1] for line in lines] == [
        "exec.progress        r1-a1-pod: container-start active creating containers",
        "exec.progress        r1-a1-pod: started"]
    assert "pulling" not in out


def test_the_topology_assignment_is_recorded_at_admission_shown_by_rank_and_cleared_on_preemption() -> None:
    from taugrid.core import states
    from taugrid.core.contracts import AdmissionAdmitted, AdmissionPreempted, PodSetTopology, TopologyDomain
    from taugrid.core.states import RunRecord

    rack = "cloud.provider.com/topology-rack"
    topology = [PodSetTopology(pod_set="main", levels=["kubernetes.io/hostname"], domains=[
        TopologyDomain(values=["b1"], count=1), TopologyDomain(values=["b2"], count=3)])]
    record = RunRecord(run_id="r1", workspace="ws", state="queued")
    admitted = msgspec.to_builtins(AdmissionAdmitted(cluster_queue="team", topology=topology))
    assert states.apply(record, "admission.admitted", 1, admitted, at=1.0)
    assert record.topology == topology
    assert phase_tree(record).splitlines()[-3:] == [
        "  topology (main): kubernetes.io/hostname", "    b1  rank 0", "    b2  ranks 1-3"]
    assert status_json(record)["topology"] == [{"pod_set": "main", "levels": ["kubernetes.io/hostname"],
                                                "domains": [{"values": ["b1"], "count": 1},
                                                            {"values": ["b2"], "count": 3}]}]
    assert states.apply(record, "admission.preempted", 1,
                        msgspec.to_builtins(AdmissionPreempted(reason="Preempted")), at=2.0)
    assert record.topology == []
    racks = {"cluster_queue": "team", "topology": [{"pod_set": "main", "levels": [rack],
                                                     "domains": [{"values": ["r2"], "count": 2}]}]}
    assert states.apply(record, "admission.admitted", 1, racks, at=3.0)
    assert phase_tree(record).splitlines()[-2:] == [f"  topology (main): {rack}", "    r2  ranks 0-1"]


def test_an_elastic_runs_resize_shows_in_the_follow_line_and_the_status_tree() -> None:
    record = _running_record()
    resized = ExecResized(old_count=3, new_count=2, cause="ShrunkForPreemptor", preemptor="hi-1", pod_set="main")
    ev = Event(id="r1.1.exec.resized.x", type="exec.resized", source="/svc/admission-watcher", subject="r1",
               time="2026-11-30T10:01:09Z", data=msgspec.json.encode(resized))
    assert stage_line(ev) == "exec.resized         3 -> 2 pods, given up to run hi-1 (ShrunkForPreemptor)"
    assert apply(record, "exec.resized", 1, ev.as_dict(), 2.0)
    assert "  size: 2 pods (last resize: 3 -> 2 pods, given up to run hi-1 (ShrunkForPreemptor))" in \
        phase_tree(record).splitlines()
    assert (status_json(record)["size"], status_json(record)["resized"]) == (2, record.resized)
