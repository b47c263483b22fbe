"""The local cluster's controller on its own, against the real nats-server of the test session: backend
requests in, pods run through the kubelet, Kubernetes-shaped watch events and log chunks out."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from taugrid.bus import Bus, kv, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import connect
from taugrid.bus.replay import replay
from taugrid.bus.topology import SOURCES_STORE
from taugrid.core.contracts import BackendApply, BackendDelete, LogChunk, WatchEvent
from taugrid.core.errors import TemporaryError
from taugrid.kube.translate import translate
from taugrid.local.cleanup import remove_finished_pods
from taugrid.local.containers import ENGINE_ANNOTATION
from taugrid.local.controller import BUCKET, FINISHED_MARKER_TTL_S, PENDING_REFRESH_S, LocalCluster
from taugrid.local.jobpods import COMPLETION_INDEX
from taugrid.local.objects import ANNOTATION_GANG, ANNOTATION_GANG_STARTED
from taugrid.local.podspec import secret_volumes_dir
from taugrid.local.runtime import Failed, Preparing, Ready
from taugrid.local.secrets import write_secret
from taugrid.local.state import LocalWorkload
from taugrid.settings import Settings
from taugrid.stack import natsserver
from tests.inprocess import one_node_cluster, stop_server
from tests.platforms import lab_platform, workspace

PLATFORM = lab_platform(workspaces=[workspace(output_root="/tmp")])


def job(name: str, container: dict[str, Any], *, pods: int = 1, **pod_spec: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"suspend": True, "backoffLimit": 0, "completions": pods, "parallelism": pods,
                            "template": {"metadata": {"labels": {}},
                                         "spec": {"restartPolicy": "Never", "containers": [container], **pod_spec}}}
    if pods > 1:
        spec["completionMode"] = "Indexed"
        spec["template"]["spec"]["subdomain"] = f"{name}-headless"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": name[:-3],
                                    "taugrid.io/workspace": "default", "taugrid.io/attempt": "1"}},
            "spec": spec}


def main(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": "python:3.11-slim", "command": command,
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}, **extra}


def config_error_waiting(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The first container ``waiting`` state with reason CreateContainerConfigError among a pod's events."""
    return next(cs["state"]["waiting"] for ev in events for cs in ev["status"].get("containerStatuses", [])
                if cs["state"].get("waiting", {}).get("reason") == "CreateContainerConfigError")


def run_id() -> str:
    return f"ctl-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def cluster(bus: Bus, tmp_path: Path) -> AsyncIterator[LocalCluster]:
    await platformstore.put_text(bus, PLATFORM)
    c = await one_node_cluster(bus, tmp_path)
    yield c
    await c.kubelet.close()


async def until_finished(c: LocalCluster, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await c.tick()
        if name not in c.wls:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} did not finish: {c.wls[name].state} {[p.phase for p in c.wls[name].pods]}")


async def logs(bus: Bus, rid: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for msg in await replay(bus, stream="LOGS", subject=f"log.default.{rid}.1"):
        chunk = msgspec.json.decode(msg.data, type=LogChunk)
        out.setdefault(chunk.pod, []).extend(chunk.lines)
    return out


async def pod_events(bus: Bus, pod: str) -> list[dict[str, Any]]:
    msgs = await replay(bus, stream="K8S", subject=f"k8s.local.pod.default.{pod}.>")
    return [msgspec.json.decode(m.data, type=WatchEvent).object for m in msgs]


async def test_a_two_pod_indexed_job_expands_its_completion_index_and_rendezvous_on_loopback(
        bus: Bus, cluster: LocalCluster) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    index_env = {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    container = main(["python3", "-c", "import os, sys; print(*sys.argv[1:], os.environ['MASTER_ADDR'])",
                      "--node_rank=$(JOB_COMPLETION_INDEX)", f"--rdzv_endpoint={name}-0.{name}-headless:29500"],
                     env=[index_env])
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, container, pods=2)]))
    while cluster.wls[name].state == "pending":
        await cluster.tick()
        await asyncio.sleep(0.05)
    port = cluster.wls[name].rdzv_port
    assert port > 0
    await until_finished(cluster, name)
    got = await logs(bus, rid)
    assert got == {f"{name}-0": [f"--node_rank=0 --rdzv_endpoint=127.0.0.1:{port} 127.0.0.1"],
                   f"{name}-1": [f"--node_rank=1 --rdzv_endpoint=127.0.0.1:{port} 127.0.0.1"]}


async def test_the_project_reaches_the_source_volume_and_the_runtime_chooses_the_interpreter(
        bus: Bus, cluster: LocalCluster) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        # Paths inside a program are not rewritten (only command, args, env and workingDir are): it reads its
        # project relative to the working directory and the init container's note through an env variable.
        body = b"import os; print(open('hello.txt').read().strip(), open(os.environ['NOTE']).read().strip())\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    source = f"sources/{hashlib.sha256(archive.getvalue()).hexdigest()}.tar.gz"  # named by its digest
    await (await bus.objects(SOURCES_STORE)).put(source, archive.getvalue())

    class SlowRuntime:
        calls = 0

        def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing | Ready:
            SlowRuntime.calls += 1
            assert (project / "train.py").exists()  # the snapshot is in place before the runtime looks
            if SlowRuntime.calls < 3:
                return Preparing("building the environment")
            return Ready(python=sys.executable, environment={"python": sys.executable})

        def forget(self, pod: str) -> None:
            return None

    cluster.podsync.runtime = SlowRuntime()
    mounts = [{"name": "tau-source", "mountPath": "/tau/source"}, {"name": "scratch", "mountPath": "/scratch"}]
    container = main(["python3", "train.py"], workingDir="/tau/source", volumeMounts=mounts,
                     env=[{"name": "NOTE", "value": "/scratch/note"}])
    fetch = {"name": "tau-source-fetch", "image": "taugrid", "command": ["python", "-m", "taugrid.sources.fetch"]}
    note = {"name": "note", "image": "busybox", "command": ["/bin/sh", "-c", "echo from-init > /scratch/note"],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    manifest = job(name, container, initContainers=[fetch, note],
                   volumes=[{"name": "tau-source", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}])
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[manifest],
                                     source_object=source))
    await until_finished(cluster, name)
    assert (await logs(bus, rid)) == {f"{name}-pod": ["hello from-init"]}
    events = await pod_events(bus, f"{name}-pod")
    waiting = [cs["state"]["waiting"] for ev in events for cs in ev["status"].get("containerStatuses", [])
               if "waiting" in cs["state"]]
    assert {"reason": "PreparingEnvironment", "message": "building the environment"} in waiting
    final = events[-1]
    assert final["status"]["phase"] == "Succeeded"
    # The controller fetched in the fetch container's place before the kubelet ran the pod's own init container.
    assert [(c["name"], c["state"]["terminated"]["exitCode"]) for c in final["status"]["initContainerStatuses"]] == [
        ("tau-source-fetch", 0), ("note", 0)]
    assert [c["name"] for c in (cluster.kubelet.pods.manifest(f"{name}-pod") or {})["spec"]["initContainers"]] == [
        "note"]
    assert final["metadata"]["annotations"]["environment.taugrid.io/python"] == sys.executable


async def test_a_preparation_that_began_and_ended_between_two_looks_is_still_said_once(
        bus: Bus, cluster: LocalCluster) -> None:
    """The runtime's last progress rides on its outcome: a build that finished (or failed) before the controller
    looked again is said once, before the pod starts (or fails), so the run's story keeps its environment phase."""

    class QuickRuntime:
        def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Ready | Failed:
            if wl.run_id.endswith("bad"):
                return Failed("EnvironmentFailed", "uv failed", progress="installing torch with uv")
            return Ready(python=sys.executable, environment={"env_cached": "false"},
                         progress="installing numpy with uv")

        def forget(self, pod: str) -> None:
            return None

    cluster.podsync.runtime = QuickRuntime()
    for rid, said, phase in ((f"{run_id()}-good", "installing numpy with uv", "Succeeded"),
                             (f"{run_id()}-bad", "installing torch with uv", "Failed")):
        name = f"{rid}-a1"
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                         manifests=[job(name, main(["python3", "-c", "print(1)"]))]))
        await until_finished(cluster, name)
        events = await pod_events(bus, f"{name}-pod")
        preparing = [i for i, ev in enumerate(events) for cs in ev["status"].get("containerStatuses", [])
                     if cs["state"].get("waiting", {}).get("reason") == "PreparingEnvironment"]
        assert [events[i]["status"]["containerStatuses"][0]["state"]["waiting"]["message"] for i in preparing] == [
            said]  # once
        assert all(ev["status"].get("phase") not in ("Running", "Succeeded", "Failed") for ev in events[:preparing[0]])
        assert events[-1]["status"]["phase"] == phase


async def test_a_missing_secret_fails_the_pod_naming_the_secrets_file(bus: Bus, cluster: LocalCluster,
                                                                      tmp_path: Path) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    # another workspace's file holds it: this workspace must not see it
    write_secret(tmp_path / "secrets", "team-b", "hf-credentials", {"token": "not-yours-123"})
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-credentials", "key": "token"}}}]
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["python3", "-c", "print(1)"], env=env))]))
    await until_finished(cluster, name)
    events = await pod_events(bus, f"{name}-pod")
    waiting = config_error_waiting(events)
    assert waiting["message"] == ('containers[main].env[TOKEN].valueFrom.secretKeyRef: secret "hf-credentials" not '
                                  f"found: locally, add hf-credentials.token (secret.key) to "
                                  f"{tmp_path / 'secrets' / 'default.yaml'} (mode 0600)")
    assert events[-1]["status"]["phase"] == "Failed"
    jobs = await replay(bus, stream="K8S", subject=f"k8s.local.job.default.{name}.>")
    status = msgspec.json.decode(jobs[-1].data, type=WatchEvent).object["status"]
    assert status["failed"] == 1


async def test_watch_changes_carry_no_message_id_and_a_finished_workload_leaves_no_marker_for_ever(
        bus: Bus, cluster: LocalCluster) -> None:
    """issue 27: each watch change is its object's next resourceVersion, so its ce-id never repeats and it goes
    without ``Nats-Msg-Id`` (~48 bytes a message, and no id for the stream to hold); the finished workload's key
    is purged with a marker the server removes after ``FINISHED_MARKER_TTL_S``, not deleted for ever."""
    rid = run_id()
    name = f"{rid}-a1"
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["python3", "-c", "print(1)"]))]))
    await until_finished(cluster, name)
    changes = [m for m in await replay(bus, stream="K8S", subject="k8s.local.>") if rid in m.subject]
    assert len(changes) >= 3  # the job, its pod and its workload, at least once each
    for m in changes:
        meta = msgspec.json.decode(m.data, type=WatchEvent).object["metadata"]
        assert m.headers["ce-id"] == f"{meta['uid']}.{meta['resourceVersion']}"
        assert "Nats-Msg-Id" not in m.headers
    marker = await bus.js.get_last_msg("KV_local_cluster", f"$KV.local_cluster.wl.{name}")
    assert (marker.headers or {}).get("KV-Operation") == "PURGE"
    assert (marker.headers or {}).get("Nats-TTL") == str(int(FINISHED_MARKER_TTL_S))
    assert await kv.get(bus, BUCKET, f"wl.{name}") is None

async def test_the_settings_the_service_hands_down_choose_the_secrets_store_and_the_simulated_pool(
        bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service passes its settings (``given``); the environment the cluster runs in is not read again."""
    await platformstore.put_text(bus, PLATFORM)
    monkeypatch.setenv("TAU_SECRETS_DIR", str(tmp_path / "not-this-one"))
    given = Settings.from_env({"TAU_SECRETS_DIR": str(tmp_path / "vault")})
    cluster = LocalCluster(bus, data_dir=tmp_path, node="node-1", capacity={"cpu": 4.0, "memory": float(8 << 30)},
                           gpu_count=0, given=given)
    await cluster.load()
    try:
        assert cluster.simulate is False
        rid = run_id()
        name = f"{rid}-a1"
        env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-credentials", "key": "token"}}}]
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                         manifests=[job(name, main(["python3", "-c", "print(1)"], env=env))]))
        await until_finished(cluster, name)
        waiting = config_error_waiting(await pod_events(bus, f"{name}-pod"))
        assert waiting["message"].endswith(f"to {tmp_path / 'vault' / 'default.yaml'} (mode 0600)")
    finally:
        await cluster.kubelet.close()
    simulated = LocalCluster(bus, data_dir=tmp_path / "sim", node="node-1", capacity={"cpu": 1.0}, gpu_count=0,
                             given=Settings.from_env({"TAU_LOCAL_SIMULATE": "on"}))
    assert simulated.simulate is True
    await simulated.kubelet.close()


async def test_a_secret_volume_lives_in_memory_0600_and_goes_with_the_pod(
        bus: Bus, cluster: LocalCluster, tmp_path: Path) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    value = f"key-{uuid.uuid4().hex}"
    write_secret(tmp_path / "secrets", "default", "ssh", {"id_ed25519": value})
    script = ("import hashlib, os, stat; p = '/keys/id_ed25519'; "
              "print(hashlib.sha256(open(p).read().encode()).hexdigest(), oct(stat.S_IMODE(os.stat(p).st_mode)))")
    pod_spec = {"volumes": [{"name": "keys", "secret": {"secretName": "ssh"}}]}
    container = main(["python3", "-c", script], volumeMounts=[{"name": "keys", "mountPath": "/keys"}])
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, container, **pod_spec)]))
    await until_finished(cluster, name)
    assert (await logs(bus, rid))[f"{name}-pod"][:1] == [f"{hashlib.sha256(value.encode()).hexdigest()} 0o600"]
    pod_dir = tmp_path / "pods" / f"{name}-pod"
    in_memory = secret_volumes_dir(pod_dir)
    assert in_memory.is_relative_to(Path("/dev/shm"))  # this machine has one, as every Linux host does
    assert (in_memory / "keys" / "id_ed25519").read_text() == value
    assert oct(in_memory.stat().st_mode & 0o777) == "0o700"
    assert [p for p in pod_dir.rglob("*") if p.is_file() and value.encode() in p.read_bytes()] == []
    assert remove_finished_pods(tmp_path / "pods", rid) == [f"{name}-pod"]
    assert not in_memory.exists() and not pod_dir.exists()


async def test_a_secret_too_short_to_redact_fails_the_pod_naming_it(
        bus: Bus, cluster: LocalCluster, tmp_path: Path) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    write_secret(tmp_path / "secrets", "default", "db", {"pin": "123"})
    env = [{"name": "PIN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pin"}}}]
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["python3", "-c", "print(1)"], env=env))]))
    await until_finished(cluster, name)
    events = await pod_events(bus, f"{name}-pod")
    waiting = config_error_waiting(events)
    assert waiting["message"] == ("secret 'db' key 'pin' is 3 bytes: values shorter than 4 bytes cannot be "
                                  "redacted from logs; use a longer value")
    assert events[-1]["status"]["phase"] == "Failed"


async def test_a_workspace_secret_reaches_only_the_process_never_disk_logs_or_events(
        bus: Bus, cluster: LocalCluster, tmp_path: Path) -> None:
    rid = run_id()
    name = f"{rid}-a1"
    value = f"hf_{uuid.uuid4().hex}"
    path = write_secret(tmp_path / "secrets", "default", "hf-credentials", {"token": value})
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-credentials", "key": "token"}}}]
    script = ("import os, hashlib; t = os.environ['HF_TOKEN']; print('token', t); "
              "print(hashlib.sha256(t.encode()).hexdigest())")
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["python3", "-c", script], env=env))]))
    await until_finished(cluster, name)
    lines = (await logs(bus, rid))[f"{name}-pod"]
    assert lines[:2] == ["token [REDACTED]", hashlib.sha256(value.encode()).hexdigest()]
    on_disk = [p for p in (tmp_path / "pods").rglob("*") if p.is_file() and value.encode() in p.read_bytes()]
    assert on_disk == []
    for stream in ("K8S", "LOGS"):
        subject = f"log.default.{rid}.>" if stream == "LOGS" else "k8s.local.>"
        for msg in await replay(bus, stream=stream, subject=subject):
            assert value.encode() not in msg.data


async def test_a_restarted_controller_readopts_a_running_pod_and_runs_it_once(bus: Bus, tmp_path: Path) -> None:
    await platformstore.put_text(bus, PLATFORM)
    kw: dict[str, Any] = {"data_dir": tmp_path, "node": "node-1", "gpu_count": 0,
                          "capacity": {"cpu": 4.0, "memory": float(8 << 30)}}
    first = LocalCluster(bus, **kw)
    await first.load()
    rid = run_id()
    name = f"{rid}-a1"
    script = "import time; print('started', flush=True); time.sleep(2); print('done')"
    await first.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                   manifests=[job(name, main(["python3", "-c", script]))]))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (first.wls[name].pods and first.wls[name].pods[0].phase == "Running"):
        await first.tick()
        await asyncio.sleep(0.1)
    await first.kubelet.close()  # the controller goes away; the pod's shim does not
    second = LocalCluster(bus, **kw)
    await second.load()
    assert second.wls[name].pods[0].phase == "Running"
    await until_finished(second, name)
    await second.kubelet.close()
    assert (await logs(bus, rid)) == {f"{name}-pod": ["started", "done"]}
    kv = await bus.kv(BUCKET)
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(f"wl.{name}")


async def test_a_submission_on_an_idle_cluster_is_admitted_by_its_wake_up_not_the_safety_timer(
        cluster: LocalCluster) -> None:
    stopping = asyncio.Event()
    loop = asyncio.create_task(cluster.admission_loop(stopping, safety_s=3600))  # the timer never fires here
    await asyncio.sleep(0.05)  # the loop is now waiting for work
    cycles = cluster.cycles
    rid = run_id()
    name = f"{rid}-a1"
    cluster.simulate = True
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["true"]))]))
    assert cluster.work.is_set()  # the apply woke the admission loop
    await asyncio.wait_for(_until(lambda: cluster.wls[name].state == "running"), timeout=10)
    stopping.set()
    cluster.wake()
    await loop
    assert cluster.cycles - cycles == 2  # one cycle admitted it, the next found nothing more; then it slept


async def test_a_burst_on_one_cluster_queue_is_admitted_one_head_per_cycle_back_to_back(
        cluster: LocalCluster) -> None:
    cluster.simulate = True
    names = []
    for _ in range(5):
        rid = run_id()
        names.append(f"{rid}-a1")
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                         manifests=[job(names[-1], main(["true"]))]))
    cycles = cluster.cycles
    await cluster.tick()
    assert [cluster.wls[n].state for n in names] == ["running"] * 5
    assert cluster.cycles - cycles == 6  # five cycles of one admission each (one ClusterQueue), then an empty one


async def test_a_run_admitted_soon_is_queued_once_and_one_left_untried_for_seconds_gets_its_place(
        bus: Bus, cluster: LocalCluster) -> None:
    """Issue 30: a housekeeping pass that falls between a run's apply and the cycle that admits it publishes no
    "Waiting for the next scheduling cycle" (its Workload's ADDED said it waits; a 300-run burst queued a fifth
    of its runs twice), while a run no cycle has considered for as long as a position is refreshed gets that
    reason and its place."""
    cluster.simulate = True
    quick, slow = f"{run_id()}-a1", f"{run_id()}-a1"
    for name in (quick, slow):
        await cluster.apply(BackendApply(run_id=name[:-3], workspace="default", attempt=1,
                                         manifests=[job(name, main(["true"]))]))
    now = time.time()
    cluster.wls[quick].created = now  # just applied
    cluster.wls[slow].created = now - PENDING_REFRESH_S  # left untried as long as a position is refreshed
    cluster._pending_at = 0.0  # this pass works out the waiting runs' reasons
    await cluster.housekeep()  # before any cycle: both are untried
    assert (cluster.wls[quick].last_pending, cluster.wls[slow].last_pending) == (
        "", "Pending|Waiting for the next scheduling cycle|1")
    await until_finished(cluster, quick)
    await until_finished(cluster, slow)
    changes: dict[str, list[WatchEvent]] = {quick: [], slow: []}
    for m in await replay(bus, stream="K8S", subject="k8s.local.>"):
        name = next((n for n in changes if n in m.subject), None)
        if name is not None:
            changes[name].append(msgspec.json.decode(m.data, type=WatchEvent))
    seen = {name: [(ev.object["kind"], ev.type, [(out.event_type, getattr(out.payload, "message", ""),
                                                    getattr(out.payload, "position", None))
                                                   for out in translate(ev)])
                   for ev in evs] for name, evs in changes.items()}
    admitted = [("Workload", "MODIFIED", [("admission.admitted", "", None)]),
                ("Pod", "ADDED", [("exec.running", "", None)]),
                ("Job", "MODIFIED", [("exec.succeeded", "", None)])]
    added = ("Workload", "ADDED", [("admission.queued", "waiting for Kueue to consider the workload", None)])
    assert seen[quick] == [added, *admitted]
    assert seen[slow] == [added, ("Workload", "MODIFIED", [
        ("admission.queued", "Waiting for the next scheduling cycle", 1)]), *admitted]


async def test_every_waiting_run_has_one_reason_and_the_place_tau_queue_shows(cluster: LocalCluster) -> None:
    """Issue 23 item 6: a cycle that admits nothing has tried one head; the heads behind it are tried in the same
    wake, so every waiting run says WaitingForQuota (not the first few), and its recorded position (runs ahead
    of it) is the one `tau queue` prints from the queue snapshot."""
    cluster.simulate = True
    names = []
    for _ in range(12):  # 8 CPUs of quota (less the node's room), one CPU each: the last few wait
        rid = run_id()
        names.append(f"{rid}-a1")
        big = main(["true"], resources={"requests": {"cpu": "1", "memory": "64Mi"}})
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[job(names[-1], big)]))
    await cluster.tick()
    waiting = [n for n in names if cluster.wls[n].state == "pending"]
    assert len(waiting) >= 4
    reserved = [next(c for c in cluster.wls[n].workload["status"]["conditions"] if c["type"] == "QuotaReserved")
                for n in waiting]
    assert {c["reason"] for c in reserved} == {"WaitingForQuota"}
    positions = [int(cluster.wls[n].workload["metadata"]["annotations"]["taugrid.io/queue-position"])
                 for n in waiting]
    await cluster._publish_queues(time.time())
    entry = await kv.get(cluster.bus, BUCKET, "queues")
    assert entry is not None
    snap = msgspec.json.decode(entry.value)
    [lab] = snap["queues"]
    assert [(p["workload"], p["position"]) for p in lab["pending"]] == list(zip(waiting, positions, strict=True))
    assert positions == list(range(len(waiting)))


async def test_a_waiting_run_holds_its_job_as_json_and_a_started_one_as_the_job_it_runs(
        bus: Bus, cluster: LocalCluster, tmp_path: Path) -> None:
    """What a burst leaves the local cluster holding (issue 30 item 5): a waiting workload's Job and Workload are
    their JSON alone, the record and a restarted controller read the same Job, and once admitted the Job is
    started and saved as it now is (a simulated one then runs holding JSON again)."""
    cluster.simulate = True
    for left in list(cluster.wls):  # runs an earlier test left waiting on the session's bus: out of the way first
        await until_finished(cluster, left)
    names = []
    for _ in range(12):  # 8 CPUs of quota (less the node's room), one CPU each: the last few wait
        rid = run_id()
        names.append(f"{rid}-a1")
        big = main(["true"], resources={"requests": {"cpu": "1", "memory": "64Mi"}},
                   env=[{"name": "SIMULATED_DURATION", "value": "600"}])
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[job(names[-1], big)]))
    try:
        assert not any(cluster.wls[n].job_decoded or cluster.wls[n].workload_decoded for n in names)
        cluster._pending_at = 0.0  # the waiting runs' reasons go out in this tick (the ticks above may have just sent)
        await cluster.tick()
        waiting = [n for n in names if cluster.wls[n].state == "pending"]
        running = [n for n in names if cluster.wls[n].state == "running"]
        assert len(waiting) >= 4 and running
        # every waiting run's reason went out this tick (a Workload update each) and it waits as JSON again; a
        # started simulated Job, announced, runs holding its Job, Workload and pods as JSON too until its pods end
        # (the lab's waitForPodsReady marked it PodsReady, kept in its Workload's JSON for its next change)
        assert not any(cluster.wls[n].decoded for n in names)
        assert [c["status"] for c in cluster.wls[running[0]].workload_view()["status"]["conditions"]
                if c["type"] == "PodsReady"] == ["True"]
        assert [p.obj["status"]["phase"] for p in cluster.wls[running[0]].pods] == ["Running"]
        assert {cluster.wls[n].workload_view()["status"]["conditions"][-1]["reason"] for n in waiting} == {
            "WaitingForQuota"}
        first = cluster.wls[waiting[0]].job_view()
        assert first["metadata"]["uid"] == waiting[0]
        assert first["spec"]["suspend"] is True and "status" not in first
        started = await kv.get(bus, BUCKET, f"wl.{running[0]}")
        assert started is not None
        assert msgspec.json.decode(started.value)["job"] == cluster.wls[running[0]].job
        assert cluster.wls[running[0]].job["spec"]["suspend"] is False
        again = await one_node_cluster(bus, tmp_path)
        assert again.wls[waiting[0]].job == first
        assert not again.wls[waiting[-1]].job_decoded
        await again.kubelet.close()
    finally:  # the session's bus outlives the test: leave no workload holding the quota
        for n in names:
            await cluster.delete(BackendDelete(run_id=n.removesuffix("-a1"), workspace="default", attempt=1,
                                               kind="Job", namespace="default", name=n))
        for n in names:
            await until_finished(cluster, n, timeout=10)


async def test_a_simulated_pod_ends_when_its_duration_is_up_without_a_housekeeping_tick(
        cluster: LocalCluster) -> None:
    cluster.simulate = True
    rid = run_id()
    name = f"{rid}-a1"
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
        job(name, main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]))]))
    wl = cluster.wls[name]  # the apply made it known; taken now, since under load it may end within the tick
    await cluster.tick()  # admitted and started; no further tick is called below
    await asyncio.wait_for(_until(lambda: name not in cluster.wls), timeout=10)  # finished and forgotten
    assert wl.state == "finished"
    assert not wl.decoded  # gone: held as JSON (a batch of ends holds its workloads until the batch is done)
    assert [p.phase for p in wl.pods] == ["Succeeded"]
    assert wl.job["status"]["conditions"][-1]["type"] == "Complete"


async def test_finished_workloads_leave_no_object_versions_behind(cluster: LocalCluster) -> None:
    """Memory stays flat over a long run: the resourceVersion kept per published object (Job, Workload,
    Pod) goes with the workload when it finishes."""
    cluster.simulate = True  # (the cluster is shared with the tests above, whose workloads stay)
    names = []
    for _ in range(3):
        rid = run_id()
        names.append(f"{rid}-a1")
        await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
            job(names[-1], main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]))]))
    wls = [cluster.wls[n] for n in names]

    def uids(objs: list[dict[str, Any]]) -> set[str]:
        return {o["metadata"].get("uid", o["metadata"]["name"]) for o in objs}

    # when applied: each Workload's (a Job is first published when it ends, issue 30)
    assert uids([o for w in wls for o in (w.job, w.workload)]) & set(cluster._versions) == uids(
        [w.workload for w in wls])
    await cluster.tick()
    await asyncio.wait_for(_until(lambda: not set(names) & set(cluster.wls)), timeout=10)
    assert [[p.phase for p in w.pods] for w in wls] == [["Succeeded"]] * 3
    published = uids([o for w in wls for o in (w.job, w.workload, *(p.obj for p in w.pods))])
    assert published & set(cluster._versions) == set()
    assert [n in cluster.finished for n in names] == [True] * 3


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_a_runtime_with_an_engine_runs_the_pod_in_its_image_and_ships_its_output(
        bus: Bus, cluster: LocalCluster, engine_image: tuple[str, str]) -> None:
    engine, image = engine_image

    class InEngine:
        def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Ready:
            return Ready(python="python", engine=engine, image=image,
                         environment={"container": image, "engine": engine})

        def forget(self, pod: str) -> None:
            return None

    cluster.podsync.runtime = InEngine()
    rid = run_id()
    name = f"{rid}-a1"
    container = main(["/bin/sh", "-c", "echo in $(cat /proc/1/comm) at $PWD"], image=image, workingDir="/work")
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[job(name, container)]))
    await until_finished(cluster, name, timeout=120)
    work = cluster.kubelet.workdir(f"{name}-pod")
    assert (await logs(bus, rid)) == {f"{name}-pod": [f"in {engine}-init at {work}"]}
    stored = cluster.kubelet.pods.manifest(f"{name}-pod") or {}
    assert stored["metadata"]["annotations"][ENGINE_ANNOTATION] == engine
    assert stored["spec"]["containers"][0]["command"] == ["/bin/sh", "-c", "echo in $(cat /proc/1/comm) at $PWD"]
    final = (await pod_events(bus, f"{name}-pod"))[-1]
    assert final["metadata"]["annotations"]["environment.taugrid.io/container"] == image


async def test_a_pod_whose_running_record_is_lost_with_the_bus_is_launched_again_and_runs_once(
        bus: Bus, cluster: LocalCluster) -> None:
    """The save that records a pod as Running (just before the kubelet gets it) fails, as it does while the only
    nats-server restarts: the pod must stay Pending and be launched at the next tick, not stay Running in memory
    with no process (its run then waited at `admitted` for good)."""
    rid = run_id()
    name = f"{rid}-a1"
    save = cluster.podsync.save
    failed: list[str] = []

    async def save_failing_once(wl: LocalWorkload) -> None:
        if not failed and wl.name == name and any(p.phase == "Running" for p in wl.pods):
            failed.append(wl.name)
            raise TemporaryError("storing local_cluster/wl failed: TimeoutError()", delay=1.0)
        await save(wl)

    cluster.podsync.save = save_failing_once
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                     manifests=[job(name, main(["python3", "-c", "print('ran')"]))]))
    await until_finished(cluster, name)
    assert failed == [name]
    assert (await logs(bus, rid)) == {f"{name}-pod": ["ran"]}
    phases = [ev["status"].get("phase") for ev in await pod_events(bus, f"{name}-pod")]
    assert phases[-1] == "Succeeded" and "Running" in phases


async def test_a_simulated_pod_whose_start_is_lost_with_the_bus_starts_again_and_is_reported_running(
        bus: Bus, cluster: LocalCluster) -> None:
    """The same for the simulated pool: a start the bus did not take is tried again, so the pod's Running status
    is published (its end alone would not say it ever ran) before it succeeds."""
    cluster.simulate = True
    rid = run_id()
    name = f"{rid}-a1"
    save = cluster.save
    failed: list[str] = []

    async def save_failing_once(wl: LocalWorkload) -> None:
        if not failed and wl.name == name and any(p.phase == "Running" for p in wl.pods):
            failed.append(wl.name)
            raise TemporaryError("writing local_cluster/wl failed: TimeoutError()", delay=1.0)
        await save(wl)

    cluster.save = save_failing_once  # type: ignore[method-assign]
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
        job(name, main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]))]))
    await until_finished(cluster, name)
    assert failed == [name]
    # announced once, Running (a simulated Job pod's end is its Job's Complete, issue 30)
    assert [ev["status"].get("phase") for ev in await pod_events(bus, f"{name}-pod")] == ["Running"]


async def test_an_apply_redelivered_after_its_workload_finished_does_not_run_it_again(
        bus: Bus, cluster: LocalCluster) -> None:
    """A restarted nats-server can redeliver a backend request whose ack it had confirmed: the workload it
    created has finished and is gone from memory and KV, and must not start a second time."""
    cluster.simulate = True
    rid = run_id()
    name = f"{rid}-a1"
    request = BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
        job(name, main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]))])
    await cluster.apply(request)
    await until_finished(cluster, name)
    await cluster.apply(msgspec.json.decode(msgspec.json.encode(request), type=BackendApply))  # as redelivered
    await cluster.tick()
    assert name not in cluster.wls
    added = await replay(bus, stream="K8S", subject=f"k8s.local.workload.default.job-{name}.added")
    assert len(added) == 1


async def test_workloads_hold_the_strings_their_requests_repeat_once(cluster: LocalCluster) -> None:
    """Two runs of a workspace, each request decoded on its own (as the service decodes each apply): their workloads
    share one workspace, namespace and placement string (issue 27: a backlog's small objects stay resident)."""
    cluster.simulate = True
    names = []
    for _ in range(2):
        rid = run_id()
        names.append(f"{rid}-a1")
        request = BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
            job(names[-1], main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]))])
        await cluster.apply(msgspec.json.decode(msgspec.json.encode(request), type=BackendApply))
    a, b = (cluster.wls[n] for n in names)
    assert (a.workspace, a.namespace, a.placement) == ("default", "default", "binpack")
    assert a.workspace is b.workspace and a.namespace is b.namespace and a.placement is b.placement
    for name in names:
        await until_finished(cluster, name)


async def test_the_only_server_killed_while_pods_start_every_workload_runs_once_and_finishes(
        fresh_nats: tuple[subprocess.Popen[bytes], int, Path], tmp_path: Path) -> None:
    """A real nats-server SIGKILLed just as the third of 12 pods is being recorded Running (that save, and others
    in flight, fail for real), then restarted on its port and store: every workload finishes, each process ran
    once. (Before, a pod whose Running save failed was never started, and its run stayed `admitted`.)"""
    proc, port, store = fresh_nats
    bus = await connect(f"nats://127.0.0.1:{port}", name="local-cluster")
    restarted: list[subprocess.Popen[bytes]] = []
    cluster: LocalCluster | None = None
    ticking: asyncio.Task[None] | None = None
    try:
        await bootstrap(bus)
        await platformstore.put_text(bus, PLATFORM)
        cluster = await one_node_cluster(bus, tmp_path / "data")
        save = cluster.podsync.save
        starts: list[str] = []

        async def restart() -> None:
            await asyncio.sleep(0.5)
            restarted.append(natsserver.start(store, port=port, log_file=store.parent / "nats.log")[0])

        async def save_then_lose_the_server(wl: LocalWorkload) -> None:
            if any(p.phase == "Running" for p in wl.pods) and wl.name not in starts:
                starts.append(wl.name)
                if len(starts) == 3:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    asyncio.get_running_loop().create_task(restart())
            await save(wl)

        cluster.podsync.save = save_then_lose_the_server
        runs = [run_id() for _ in range(12)]
        for rid in runs:
            script = f"open({str(tmp_path / rid)!r}, 'a').write('ran')"
            await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1,
                                             manifests=[job(f"{rid}-a1", main(["python3", "-c", script]))]))

        async def ticks(c: LocalCluster) -> None:  # as the service's 0.2 s timer does, failures included
            while True:
                with contextlib.suppress(TemporaryError):
                    await c.tick()
                await asyncio.sleep(0.05)

        ticking = asyncio.create_task(ticks(cluster))
        await asyncio.wait_for(_until(lambda: not cluster.wls), timeout=90)
        assert restarted and len(set(starts)) == 12
        assert {rid: (tmp_path / rid).read_text() for rid in runs} == {rid: "ran" for rid in runs}
        for rid in runs:
            jobs = [msgspec.json.decode(m.data, type=WatchEvent).object for m in
                    await replay(bus, stream="K8S", subject=f"k8s.local.job.default.{rid}-a1.>")]
            assert jobs[-1]["status"]["conditions"][-1]["type"] == "Complete", rid
    finally:
        if ticking is not None:
            ticking.cancel()
        if cluster is not None:
            await cluster.kubelet.close()
        await bus.close(drain=False)
        for server in restarted:
            stop_server(server)


async def test_a_simulated_four_pod_run_is_four_watch_changes_its_first_rank_listing_the_gang(
        bus: Bus, cluster: LocalCluster) -> None:
    """Issue 30: the Workload added, its admission, the first rank's pod (already Running, listing every pod's
    name, node and completion index, which Kueue's TAS bench reads from its exec.running) and the Job's Complete.
    Not published: the Job's creation and start (no reader takes anything from them), the other ranks' pods (the
    first lists them), a pod's end (the Job's Complete says every index succeeded), the Workload's Finished (only
    the hub's dispatcher reads it, from a site)."""
    cluster.simulate = True
    rid = run_id()
    name = f"{rid}-a1"
    await cluster.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[
        job(name, main(["true"], env=[{"name": "SIMULATED_DURATION", "value": "0.05"}]), pods=4)]))
    await until_finished(cluster, name)
    changes = [msgspec.json.decode(m.data, type=WatchEvent) for m in await replay(bus, stream="K8S",
                                                                                  subject="k8s.local.>")
               if rid in m.subject]
    seen = [(w.object["kind"], w.type, (w.object.get("status") or {}).get("phase", "")) for w in changes]
    assert sorted(seen) == sorted([("Workload", "ADDED", ""), ("Workload", "MODIFIED", ""),
                                   ("Pod", "ADDED", "Running"), ("Job", "MODIFIED", "")])
    [first] = [w.object for w in changes if w.object["kind"] == "Pod"]
    assert (first["metadata"]["name"], first["metadata"]["labels"][COMPLETION_INDEX], first["spec"]["nodeName"],
            first["metadata"]["annotations"][ANNOTATION_GANG_STARTED]) == (f"{name}-0", "0", cluster.node, f"{name}-0")
    assert json.loads(first["metadata"]["annotations"][ANNOTATION_GANG]) == [
        {"name": f"{name}-{i}", "node": cluster.node, "index": i} for i in range(4)]  # the gang, rank order
    job_end = next(w.object for w in changes if w.object["kind"] == "Job" and w.type == "MODIFIED")
    assert [c["type"] for c in job_end["status"]["conditions"]][-1] == "Complete"
    assert job_end["status"]["startTime"] <= job_end["status"]["completionTime"]
