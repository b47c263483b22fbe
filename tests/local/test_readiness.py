"""Kueue's waitForPodsReady on the local cluster, against the session's real nats-server: a two-pod gang whose
second pod never becomes ready is evicted at its timeout (its running pod stopped, its quota released), requeued
after Kueue's backoff, and failed once past the requeue limit; blockAdmission holds other workloads meanwhile.
Time is stepped through ``LocalCluster.pods_ready_pass(now)``, never slept through."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus import Bus, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.replay import replay
from taugrid.core.contracts import (
    AdmissionPreempted,
    AdmissionQueued,
    BackendApply,
    BackendDelete,
    ExecFinished,
    WatchEvent,
)
from taugrid.kube.translate import translate
from taugrid.local.controller import LocalCluster
from taugrid.local.runtime import Preparing, Ready
from taugrid.local.state import LocalWorkload
from tests.inprocess import one_node_cluster
from tests.local.test_controller import PLATFORM, job, main

TIMEOUT_S = 300.0


class SecondPodNeverReady:
    """Pod 0 of a gang starts at once; pod 1 prepares its environment for ever (as an image that never pulls)."""

    def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing | Ready:
        if pod.removeprefix(wl.name).startswith("-1"):
            return Preparing("pulling an image that never arrives")
        return Ready(python=sys.executable, environment={})

    def forget(self, pod: str) -> None:
        return None


@pytest.fixture
async def bus(private_bus: Bus) -> AsyncIterator[Bus]:
    """A server of this test's own: the session's keeps other modules' local workloads, which a new local
    cluster restores and which would then count in this test's quota."""
    await bootstrap(private_bus, replicas=1)
    yield private_bus


async def cluster_with(bus: Bus, tmp_path: Path, ready: str) -> LocalCluster:
    await platformstore.put_text(bus, PLATFORM + ready)
    c = await one_node_cluster(bus, tmp_path)
    c.podsync.runtime = SecondPodNeverReady()
    c.readiness.draw = lambda: 0.0  # Kueue's jitter pinned
    return c


@pytest.fixture
async def limited(bus: Bus, tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = await cluster_with(bus, tmp_path, "wait_for_pods_ready: {timeout: 5m, requeuing_strategy: "
                                          "{backoff_base_seconds: 60, backoff_limit_count: 1}}\n")
    yield c
    await c.kubelet.close()


@pytest.fixture
async def blocking(bus: Bus, tmp_path: Path) -> AsyncIterator[LocalCluster]:
    c = await cluster_with(bus, tmp_path, "wait_for_pods_ready: {timeout: 5m, block_admission: true}\n")
    yield c
    await c.kubelet.close()


def sleeper() -> dict[str, Any]:
    return main(["python3", "-c", "import time; time.sleep(60)"])


async def submit(c: LocalCluster, *, pods: int) -> str:
    rid = f"rdy-{uuid.uuid4().hex[:8]}"
    name = f"{rid}-a1"
    await c.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[job(name, sleeper(), pods=pods)]))
    return name


async def watched(bus: Bus, kind: str, name: str) -> list[WatchEvent]:
    msgs = await replay(bus, stream="K8S", subject=f"k8s.local.{kind}.default.{name}.>")
    return [msgspec.json.decode(m.data, type=WatchEvent) for m in msgs]


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


async def test_a_gang_whose_second_pod_never_gets_ready_is_evicted_requeued_then_failed(
        bus: Bus, limited: LocalCluster) -> None:
    c = limited
    name = await submit(c, pods=2)
    await c.tick()
    wl = c.wls[name]
    assert wl.state == "running" and [p.phase for p in wl.pods] == ["Running", "Pending"]
    first_pods = [p.name for p in wl.pods]
    admitted_at = wl.admitted_at

    await c.pods_ready_pass(admitted_at + TIMEOUT_S - 1)  # within its timeout: nothing happens
    assert wl.state == "running"

    evicted_at = admitted_at + TIMEOUT_S
    await c.pods_ready_pass(evicted_at)
    assert (wl.state, wl.pods, wl.ready_requeues, wl.requeue_at) == ("pending", [], 1, evicted_at + 60)
    engine = c.admitter.engine
    assert engine is not None and name not in engine.states  # its quota is released, it is in no queue
    assert all(v == 0 for v in engine.usage("lab").values())
    for pod in first_pods:  # both pods are gone: the running one stopped, the waiting one never started
        assert (await watched(bus, "pod", pod))[-1].type == "DELETED"
    deadline = time.monotonic() + 10
    while (c.kubelet.status(first_pods[0]) or {}).get("phase") not in ("Failed", "Succeeded"):
        assert time.monotonic() < deadline, "the running pod was not stopped"
        await asyncio.sleep(0.05)
    wl_name = wl.workload["metadata"]["name"]
    message = f"Exceeded the PodsReady timeout default/{wl_name}"
    last = (await watched(bus, "workload", wl_name))[-1]
    assert {k: condition(last.object, "Evicted")[k] for k in ("status", "reason", "message")} == {
        "status": "True", "reason": "PodsReadyTimeout", "message": message}
    assert condition(last.object, "Requeued")["reason"] == "PodsReadyTimeout"
    assert last.object["status"]["requeueState"]["count"] == 1
    preempted, queued = translate(last)
    assert (preempted.event_type, preempted.payload) == (
        "admission.preempted", AdmissionPreempted(reason="Evicted", message=f"PodsReadyTimeout: {message}"))
    assert (queued.event_type, queued.payload) == ("admission.queued", AdmissionQueued(
        reason="PodsReadyTimeout", message=message,
        waiting_for={"queue": "default", "requeue_at": last.object["status"]["requeueState"]["requeueAt"]}))

    await c.tick()  # backing off: not admitted
    assert wl.state == "pending"
    await c.pods_ready_pass(evicted_at + 60)  # backoff over: back in its queue
    assert wl.requeue_at == 0 and condition(wl.workload, "Requeued")["reason"] == "BackoffFinished"
    finished = translate((await watched(bus, "workload", wl_name))[-1])
    assert [(o.event_type, o.payload.reason) for o in finished] == [  # type: ignore[attr-defined]
        ("admission.preempted", "Evicted"), ("admission.queued", "BackoffFinished")]
    await c.tick()
    assert wl.state == "running" and [p.name for p in wl.pods] == [f"{name}-0-r1", f"{name}-1-r1"]

    await c.pods_ready_pass(wl.admitted_at + TIMEOUT_S)  # the second timeout passes backoff_limit_count 1
    assert name not in c.wls
    failed = (await watched(bus, "job", name))[-1]
    [(event_type, outcome)] = [(o.event_type, o.payload) for o in translate(failed)]
    assert event_type == "exec.failed" and isinstance(outcome, ExecFinished)
    assert outcome.reason == "RequeuingLimitExceeded"
    assert outcome.message == ("The workload is deactivated due to exceeding the maximum number of re-queuing "
                               "retries (1 requeue(s) after PodsReadyTimeout, backoff_limit_count 1)")
    final = (await watched(bus, "workload", wl_name))[-1].object
    assert condition(final, "Evicted")["reason"] == "DeactivatedDueToRequeuingLimitExceeded"
    assert final["spec"]["active"] is False


async def test_block_admission_holds_every_other_workload_until_the_admitted_one_is_ready(
        bus: Bus, blocking: LocalCluster) -> None:
    c = blocking
    gang = await submit(c, pods=2)
    await c.tick()
    assert c.wls[gang].state == "running"
    other = await submit(c, pods=1)
    await c.tick()
    assert c.wls[other].state == "pending"
    reserved = condition(c.wls[other].workload, "QuotaReserved")
    assert (reserved["reason"], reserved["message"]) == (
        "WaitingForPodsReady", "waiting for all admitted workloads to be in PodsReady condition")
    await c.delete(BackendDelete(run_id=gang.removesuffix("-a1"), workspace="default", attempt=1, kind="Job",
                                 namespace="default", name=gang))
    await c.tick()  # the not-ready workload is going: nothing blocks any more
    assert c.wls[other].state == "running"


async def test_a_restart_during_the_backoff_keeps_the_workload_out_of_its_queue_until_the_backoff_ends(
        bus: Bus, tmp_path: Path, limited: LocalCluster) -> None:
    name = await submit(limited, pods=2)
    await limited.tick()
    evicted_at = limited.wls[name].admitted_at + TIMEOUT_S
    await limited.pods_ready_pass(evicted_at)
    await limited.kubelet.close()
    again = await one_node_cluster(bus, tmp_path)  # the same KV records, a fresh engine
    again.podsync.runtime = SecondPodNeverReady()
    try:
        wl = again.wls[name]
        assert (wl.state, wl.requeue_at, wl.ready_requeues) == ("pending", evicted_at + 60, 1)
        engine = again.admitter.engine
        assert engine is not None and name not in engine.states
        await again.tick()
        assert wl.state == "pending"
        await again.pods_ready_pass(evicted_at + 60)
        await again.tick()
        assert wl.state == "running" and wl.admitted_at > 0 and not wl.ready
    finally:
        await again.kubelet.close()
