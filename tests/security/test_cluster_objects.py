"""A real cluster's objects are written by whoever may create or annotate them in some namespace, not by taugrid:
what they claim about a run (its labels, the local cluster's own gang and preemptor annotations) must not reach
another workspace's run, its record or its evidence (``../shared/design/trust.md``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.core.contracts import ExecRunning, WatchEvent
from taugrid.core.errors import TemporaryError
from taugrid.kube.translate import translate
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from tests.kube.test_admission_owners import WORKSPACE, event, fresh, fresh_placed, placed, stored
from tests.kube.test_bridge import bridge, last


def pod(run_id: str, namespace: str, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{run_id}-a1-0", "namespace": namespace, "uid": str(uuid.uuid4()),
                         "resourceVersion": "3",
                         "labels": {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run_id,
                                    "taugrid.io/workspace": WORKSPACE, "taugrid.io/attempt": "1"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]}, "status": status}


FAILED = {"phase": "Failed", "containerStatuses": [{"name": "main", "state": {"terminated": {
    "exitCode": 137, "reason": "Error"}}}]}


async def test_a_pod_in_another_namespace_labelled_with_a_run_says_nothing_about_it(bus: Bus) -> None:
    """Whoever may create a pod in some namespace of a real cluster can label it with another workspace's run: the
    run's events come only from objects in the namespace the policy rendered it into (the record's)."""
    victim, _ = await fresh_placed(bus)
    watcher = AdmissionWatcher(bus)
    await watcher.on_event(event("MODIFIED", pod(victim, "attackers", **FAILED)))
    assert [await stored(bus, victim, t) for t in ("exec.failed", "exec.progress")] == [None, None]

    # the same pod where the run was rendered is the run's
    await watcher.on_event(event("MODIFIED", pod(victim, WORKSPACE, **FAILED)))
    assert await stored(bus, victim, "exec.failed") is not None


async def test_a_clusters_object_for_a_run_the_policy_has_not_placed_waits(bus: Bus) -> None:
    run_id, _ = fresh()  # no record yet: its namespace is not known
    watcher = AdmissionWatcher(bus)
    running = event("MODIFIED", pod(run_id, WORKSPACE, phase="Running",
                                    containerStatuses=[{"name": "main", "state": {"running": {}}}]))
    with pytest.raises(TemporaryError, match="waits for the policy's decision"):
        await watcher.on_event(running)
    assert await stored(bus, run_id, "exec.running") is None
    await placed(bus, run_id)
    await watcher.on_event(running)  # the redelivery
    assert await stored(bus, run_id, "exec.running") is not None


async def test_a_real_clusters_pod_cannot_claim_the_local_clusters_gang_or_preemptor(bus: Bus) -> None:
    """Anyone who may annotate a pod on a real cluster could write ``taugrid.io/gang`` (who ran where, carried into
    the run's record and evidence) or ``taugrid.io/preemptor-run-id``: the bridge drops what only the local cluster
    may say, so the first rank's ``exec.running`` names its own pod alone."""
    cluster = f"c{uuid.uuid4().hex[:8]}"
    forged = [{"name": "train-a1-0", "node": "victim-node", "index": 0}, {"name": "x", "node": "elsewhere", "index": 1}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train-a1-0", "namespace": "team-a", "uid": "u-1", "resourceVersion": "7",
                        "labels": {"taugrid.io/run-id": "r-1", "taugrid.io/workspace": "team-a",
                                   "taugrid.io/attempt": "1", "taugrid.io/managed-by": "taugrid"},
                        "annotations": {"taugrid.io/gang": json.dumps(forged), "taugrid.io/gang-started": "train-a1-0",
                                        "taugrid.io/preemptor-run-id": "someone-else", "kept": "yes"}},
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "x"}]},
           "status": {"phase": "Running"}}
    b = bridge(bus, None, cluster, "a")  # it publishes what it watched; no API call is made
    await b.publish(WatchEvent(type="MODIFIED", object=pod, cluster=cluster))

    msg = await last(bus, f"k8s.{cluster}.pod.team-a.train-a1-0.modified")
    carried = msgspec.json.decode(msg.data, type=WatchEvent)
    assert carried.object["metadata"]["annotations"] == {"kept": "yes"}
    assert pod["metadata"]["annotations"]["taugrid.io/gang"] == json.dumps(forged)  # the watched object untouched
    [out] = translate(carried)
    assert (out.event_type, out.payload) == ("exec.running", ExecRunning(node="gpu-1", pod="train-a1-0"))
    # the same change from the local cluster (its own simulated gang) is read as it says
    [local] = translate(WatchEvent(type="MODIFIED", object=pod, cluster="local"))
    assert [(p.name, p.node) for p in local.payload.pods] == [("train-a1-0", "victim-node"), ("x", "elsewhere")]
