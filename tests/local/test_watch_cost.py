"""What a multi-pod run costs between the local cluster, the K8S stream and the admission watcher (issue 30), on the
real nats-server of the test session: a simulated 4-pod Job's watch changes, as the local cluster stored them, fed
to the admission watcher, become exactly one ``exec.running`` (rank 0's, listing the gang) and no ``exec.progress``;
projected, the record still shows every pod with its node and its pod-level phases through, and succeeded once the
Job completed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, connect, kv, platformstore
from taugrid.bus.envelope import from_message
from taugrid.bus.replay import replay
from taugrid.cli.views import pod_lines
from taugrid.core import states
from taugrid.core.contracts import BackendApply, GangPod
from taugrid.local.controller import LocalCluster
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from tests.inprocess import one_node_cluster
from tests.platforms import lab_platform, workspace

PODS = 4


def simulated_job(name: str, run_id: str) -> dict[str, Any]:
    main = {"name": "main", "image": "python:3.11-slim", "command": ["true"],
            "env": [{"name": "SIMULATED_DURATION", "value": "0.05"}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": run_id,
                                    "taugrid.io/workspace": "default", "taugrid.io/attempt": "1"}},
            "spec": {"suspend": True, "backoffLimit": 0, "completions": PODS, "parallelism": PODS,
                     "completionMode": "Indexed",
                     "template": {"metadata": {"labels": {}},
                                  "spec": {"restartPolicy": "Never", "containers": [main],
                                           "subdomain": f"{name}-headless"}}}}


@pytest.fixture
async def cluster(bus: Bus, bootstrapped: str, tmp_path: Path) -> AsyncIterator[LocalCluster]:
    await platformstore.put_text(bus, lab_platform(workspaces=[workspace(output_root="/tmp")]))
    own = await connect(bootstrapped, name="local-cluster")  # its changes' source, as the stack's local cluster's
    c = await one_node_cluster(own, tmp_path)
    c.simulate = True
    yield c
    await c.kubelet.close()
    await own.close()


async def test_a_four_pod_run_is_one_running_and_a_progress_a_pod_and_status_shows_each_pods_node(
        bus: Bus, cluster: LocalCluster) -> None:
    run_id = f"cost-{uuid.uuid4().hex[:8]}"
    name = f"{run_id}-a1"
    await kv.put(bus, runrecord.BUCKET, runrecord.key("default", run_id),
                 states.RunRecord(run_id=run_id, workspace="default", state="rendered", attempt=1, user="alice"))
    await cluster.apply(BackendApply(run_id=run_id, workspace="default", attempt=1,
                                     manifests=[simulated_job(name, run_id)]))
    deadline = time.monotonic() + 60
    while name in cluster.wls and time.monotonic() < deadline:
        await cluster.tick()
        await asyncio.sleep(0.05)
    assert name not in cluster.wls
    watcher = AdmissionWatcher(bus)
    changes = [m for m in await replay(bus, stream="K8S", subject="k8s.local.>") if run_id in m.subject]
    # the Workload added, its admission, the first rank's pod (listing the gang), the Job's end
    assert len(changes) == 4, "\n".join(m.subject for m in changes)
    for m in changes:
        await watcher.on_event(from_message(m.subject, m.headers, m.data))
    events = [from_message(m.subject, m.headers, m.data)
              for m in await replay(bus, stream="RUNS", subject=f"run.default.{run_id}.>")]
    assert [ev.type for ev in events] == ["admission.queued", "admission.admitted", "exec.running", "exec.succeeded"]
    [running_event] = [ev for ev in events if ev.type == "exec.running"]
    # stored without its pod and node, the first listed pod's (issue 27); read back through its contract
    assert b'"node":' not in running_event.data.split(b'"pods"')[0]
    running = running_event.as_dict()
    assert (running["pod"], running["node"]) == (f"{name}-0", cluster.node)
    assert msgspec.convert(running["pods"], list[GangPod]) == [GangPod(name=f"{name}-{i}", node=cluster.node, index=i)
                                                               for i in range(PODS)]

    record = states.RunRecord(run_id=run_id, workspace="default", state="rendered", attempt=1)
    for ev in events:
        assert states.apply(record, ev.type, ev.attempt, ev.as_dict(), 1.0), ev.type  # as the projection reads
    assert record.state == "succeeded" and record.node == cluster.node
    assert pod_lines(record) == ["  pods:", *[f"    {name}-{i}  Succeeded  node {cluster.node}" for i in range(PODS)]]
    assert [(p.name, p.status, p.detail) for p in record.phases if p.name in states.POD_PHASES] == [
        ("scheduling", "done", f"{PODS}/{PODS} pods"), ("image-pull", "done", f"{PODS}/{PODS} pods"),
        ("init", "done", f"{PODS}/{PODS} pods"), ("container-start", "done", f"{PODS}/{PODS} pods")]
