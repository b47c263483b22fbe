"""The emulated cluster (tests/kube/cluster.py): Kueue admission and the Job controller over FakeKube, pods run
by the real local kubelet, their status PATCHed over HTTP and their logs served by the pod log endpoint; and the
log shipper following a real pod's log across a restart, exactly once."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.kube.client import KubeApi
from taugrid.kube.podlogs import split_line
from taugrid_services.log_shipper.shipper import LogShipper
from tests.kube.cluster import JOBS, PODS, WORKLOADS, EmulatedCluster
from tests.kube.test_log_shipper import lines_of

NS = "team-a"


def tau_job(run_id: str, main: list[str], *, completions: int = 1, init: list[str] | None = None,
            subdomain: str = "") -> dict[str, Any]:
    labels = {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run_id, "taugrid.io/workspace": NS,
              "taugrid.io/attempt": "1"}
    volume = [{"name": "tau-source", "mountPath": "/tau/source"}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "python:3.12", "command": main, "workingDir": "/tau/source",
                        "volumeMounts": volume, "env": [{"name": "GREETING", "value": "hi"}]}],
        "volumes": [{"name": "tau-source", "emptyDir": {}}],
    }
    if init:
        spec["initContainers"] = [{"name": "tau-source-fetch", "image": "t", "command": init,
                                   "workingDir": "/tau/source", "volumeMounts": volume}]
    if subdomain:
        spec["subdomain"] = subdomain
    job_spec: dict[str, Any] = {"suspend": True, "backoffLimit": 0, "template": {
        "metadata": {"labels": labels}, "spec": spec}}
    if completions > 1:
        job_spec.update(completions=completions, parallelism=completions, completionMode="Indexed")
    name = f"{run_id}-a1"
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {**labels, "kueue.x-k8s.io/queue-name": "lq"}},
            "spec": job_spec}


@pytest.fixture
async def cluster(fake_kube: Any, tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    fake, api_client = fake_kube
    emulated = EmulatedCluster(fake, api_client.configuration.host, tmp_path)
    await emulated.start()
    try:
        yield emulated
    finally:
        await emulated.stop()


async def until(cond: Callable[[], Any], timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)


def job_of(cluster: EmulatedCluster, name: str) -> dict[str, Any]:
    return cluster.fake.objects[(JOBS, NS, name)]


def pods_of(cluster: EmulatedCluster, job: str) -> list[dict[str, Any]]:
    return sorted((o for (r, _, _), o in cluster.fake.objects.items()
                   if r == PODS and o["metadata"]["labels"].get("job-name") == job),
                  key=lambda p: p["metadata"]["name"])


def finished(cluster: EmulatedCluster, name: str) -> bool:
    return any(c["type"] in ("Complete", "Failed") for c in
               (job_of(cluster, name).get("status") or {}).get("conditions") or [])


async def test_an_indexed_job_is_admitted_and_its_pods_run_through_the_kubelet(
    cluster: EmulatedCluster, fake_kube: Any
) -> None:
    fake, api_client = fake_kube
    run_id = f"idx-{uuid.uuid4().hex[:6]}"
    py = sys.executable
    # The init container writes into the emptyDir that is both containers' working directory.
    code = ("import os; print(open('greeting').read().strip(), os.environ['JOB_COMPLETION_INDEX'], "
            "os.environ['GREETING'])")
    job = tau_job(run_id, [py, "-c", code],
                  completions=2, init=["/bin/sh", "-c", "echo fetching; echo $(GREETING) > greeting"],
                  subdomain="svc")
    job["spec"]["template"]["spec"]["initContainers"][0]["env"] = [{"name": "GREETING", "value": "hello"}]
    fake.put(JOBS, job)
    name = job["metadata"]["name"]
    await until(lambda: finished(cluster, name))

    status = job_of(cluster, name)["status"]
    assert (status["succeeded"], status["active"], [c["type"] for c in status["conditions"]]) == (
        2, 0, ["Complete"])
    assert job_of(cluster, name)["spec"]["suspend"] is False
    workload = next(o for (r, _, _), o in fake.objects.items() if r == WORKLOADS)
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == job_of(cluster, name)["metadata"]["uid"]
    assert [c["type"] for c in workload["status"]["conditions"]] == ["QuotaReserved", "Admitted", "Finished"]
    pods = pods_of(cluster, name)
    assert [p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1"]
    assert [p["spec"]["hostname"] for p in pods] == [f"{name}-0", f"{name}-1"]
    for pod in pods:
        st = pod["status"]
        assert st["phase"] == "Succeeded"
        assert [(c["type"], c["status"]) for c in st["conditions"]] == [
            ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", "False"), ("Ready", "False")]
        assert [(s["name"], s["state"]["terminated"]["exitCode"], s["state"]["terminated"]["reason"])
                for s in st["initContainerStatuses"] + st["containerStatuses"]] == [
            ("tau-source-fetch", 0, "Completed"), ("main", 0, "Completed")]

    # The pod log endpoint serves the kubelet's lines, with their timestamps.
    api = KubeApi(api_client)
    for index, pod in enumerate(pods):
        got = {c: [split_line(raw) async for raw in api.log_lines(NS, pod["metadata"]["name"], container=c)]
               for c in ("tau-source-fetch", "main")}
        assert [t for _, t in got["tau-source-fetch"]] == ["fetching"]
        assert [t for _, t in got["main"]] == [f"hello {index} hi"]
        assert all(ts.endswith("Z") and "." in ts for lines in got.values() for ts, _ in lines)
    # The kubelet's status reached the API server as PATCHes over HTTP.
    patched = [a for a in fake.applies if a.get("subresource") == "status"]
    assert len(patched) == cluster.status_patches >= 4
    assert all(a["content_type"].startswith("application/merge-patch+json") for a in patched)


async def test_a_failing_pod_fails_the_job_with_its_exit_code(cluster: EmulatedCluster, fake_kube: Any) -> None:
    fake, _ = fake_kube
    run_id = f"fail-{uuid.uuid4().hex[:6]}"
    job = tau_job(run_id, ["/bin/sh", "-c", "echo boom >&2; exit 3"])
    fake.put(JOBS, job)
    name = job["metadata"]["name"]
    await until(lambda: finished(cluster, name))
    status = job_of(cluster, name)["status"]
    assert (status["failed"], status["active"]) == (1, 0)
    assert [(c["type"], c["reason"]) for c in status["conditions"]] == [("Failed", "BackoffLimitExceeded")]
    [pod] = pods_of(cluster, name)
    main = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], main["exitCode"], main["reason"]) == ("Failed", 3, "Error")


async def test_a_deleted_job_takes_its_running_pod_and_workload(cluster: EmulatedCluster, fake_kube: Any) -> None:
    fake, _ = fake_kube
    job = tau_job(f"del-{uuid.uuid4().hex[:6]}", ["/bin/sh", "-c", "echo up; exec sleep 30"])
    fake.put(JOBS, job)
    name = job["metadata"]["name"]
    await until(lambda: any(p.get("status", {}).get("phase") == "Running" for p in pods_of(cluster, name)))
    [pod] = pods_of(cluster, name)
    started = time.monotonic()
    fake.remove(JOBS, NS, name)
    await until(lambda: not pods_of(cluster, name) and not any(r == WORKLOADS for (r, _, _) in fake.objects))
    handle = cluster.kubelet.handles[pod["metadata"]["name"]]
    final = await asyncio.wait_for(handle.wait(), 10)
    assert final["phase"] == "Failed" and time.monotonic() - started < 10


async def test_a_log_shipper_restart_while_a_real_pod_prints_loses_and_doubles_no_line(
    cluster: EmulatedCluster, fake_kube: Any, bus: Bus
) -> None:
    fake, api_client = fake_kube
    run_id = f"ship-{uuid.uuid4().hex[:6]}"
    script = "import time\nfor i in range(40):\n    print(f'line {i}', flush=True)\n    time.sleep(0.05)\n"
    job = tau_job(run_id, [sys.executable, "-c", script], init=["/bin/sh", "-c", "echo fetched"])
    fake.put(JOBS, job)
    name = job["metadata"]["name"]
    first = LogShipper(api_client, bus, flush_s=0.05)
    await first.start()
    try:
        async with asyncio.timeout(20):
            while len(await lines_of(bus, run_id)) < 8:
                await asyncio.sleep(0.05)
    finally:
        await first.stop()
    assert not finished(cluster, name)  # the restart really happens mid-run
    await asyncio.sleep(0.3)  # lines printed while no shipper runs
    second = LogShipper(api_client, bus, flush_s=0.05)
    await second.start()
    try:
        await until(lambda: finished(cluster, name))
        async with asyncio.timeout(20):
            while len(await lines_of(bus, run_id)) < 41:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # anything doubled would land now
    finally:
        await second.stop()
    assert await lines_of(bus, run_id) == ["fetched", *[f"line {i}" for i in range(40)]]
