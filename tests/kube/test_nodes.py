"""NodeActuator over real HTTP (kmock FakeKube): cordon/taint, uncordon, node conditions, drain by eviction;
and the ``health-actuator`` consumer end to end on a real nats-server."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.core.contracts import NodeCondition
from taugrid.core.errors import TemporaryError
from taugrid.core.events import node_subject
from taugrid.health.wire import NodeCordon, NodeUncordon
from taugrid.kube.client import KubeApi
from taugrid.kube.nodes import TAINT_KEY, NodeActuator
from taugrid_services.health_monitor.__main__ import actuate
from tests.owners import acting_as

NODES = ("", "v1", "nodes")
PODS = ("", "v1", "pods")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OURS = {"taugrid.io/managed-by": "taugrid"}


def add_node(fake: Any, name: str = "n1", **spec: Any) -> None:
    fake.put(NODES, {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "spec": {"podCIDR": "10.0.0.0/24", "taints": [dict(GPU_TAINT)], **spec},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    })


def add_pod(
    fake: Any, name: str, *, node: str, labels: dict[str, str] | None = None, ns: str = "team-a"
) -> None:
    fake.put(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    })


def node(fake: Any, name: str = "n1") -> dict[str, Any]:
    result: dict[str, Any] = fake.objects[(NODES, None, name)]
    return result


def actuator(api_client: Any) -> NodeActuator:
    return NodeActuator(KubeApi(api_client, retry_cap_s=0.01))


async def test_cordon_sets_unschedulable_and_our_taint_keeping_foreign_taints(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    assert await act.cordon("n1", "XID 79 on GPU 3", conditions=["GpuXidError", "GpuThermal"])
    spec = node(fake)["spec"]
    assert spec["unschedulable"] is True
    assert spec["taints"] == [GPU_TAINT, {"key": TAINT_KEY, "value": "GpuXidError", "effect": "NoSchedule"}]
    assert spec["podCIDR"] == "10.0.0.0/24"
    assert node(fake)["metadata"]["annotations"]["taugrid.io/cordon-reason"] == "XID 79 on GPU 3"
    patch = fake.applies[-1]
    assert "merge-patch" in patch["content_type"] and patch["params"]["fieldManager"] == "taugrid-health"


async def test_cordon_again_writes_nothing(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    await act.cordon("n1", "XID 79", conditions=["GpuXidError"])
    rv = node(fake)["metadata"]["resourceVersion"]
    assert not await act.cordon("n1", "XID 79", conditions=["GpuXidError"])
    assert node(fake)["metadata"]["resourceVersion"] == rv


async def test_cordon_rereads_after_a_conflict(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    fake.fail("PATCH", 409, "Operation cannot be fulfilled: the object has been modified", reason="Conflict")
    assert await actuator(api_client).cordon("n1", "XID 79", conditions=["GpuXidError"])
    assert node(fake)["spec"]["unschedulable"] is True


async def test_cordon_of_a_gone_node_is_a_no_op(fake_kube: Any) -> None:
    _, api_client = fake_kube
    assert not await actuator(api_client).cordon("gone", "XID 79", conditions=["GpuXidError"])


async def test_uncordon_clears_our_cordon_and_keeps_foreign_taints(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    await act.cordon("n1", "XID 79", conditions=["GpuXidError"])
    assert await act.uncordon("n1", "validation passed")
    spec = node(fake)["spec"]
    assert spec["unschedulable"] is False and spec["taints"] == [GPU_TAINT]
    assert "taugrid.io/cordon-reason" not in (node(fake)["metadata"].get("annotations") or {})
    assert not await act.uncordon("n1", "redelivered")


async def test_uncordon_leaves_a_node_someone_else_cordoned(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake, unschedulable=True)  # kubectl cordon by an operator: no taugrid taint
    assert not await actuator(api_client).uncordon("n1", "validation passed")
    assert node(fake)["spec"]["unschedulable"] is True


async def test_a_condition_lands_in_node_status_next_to_others(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    await act.set_condition(NodeCondition(node="n1", type="GpuXidError", status="True", reason="Xid79",
                                          message="GPU fell off the bus", gpu=3, time=1_700_000_000.0))
    await act.set_condition(NodeCondition(node="n1", type="GpuThermal", status="False", reason="Cool",
                                          time=1_700_000_060.0))
    by_type = {c["type"]: c for c in node(fake)["status"]["conditions"]}
    assert by_type["Ready"]["status"] == "True"
    assert by_type["TaugridGpuXidErrorGpu3"] == {
        "type": "TaugridGpuXidErrorGpu3", "status": "True", "reason": "Xid79",
        "message": "GPU 3: GPU fell off the bus", "lastTransitionTime": "2023-11-14T22:13:20Z"}
    assert by_type["TaugridGpuThermal"]["status"] == "False"
    status_applies = [a for a in fake.applies if a.get("subresource") == "status"]
    assert {a["params"]["fieldManager"] for a in status_applies} == {
        "taugrid-health-TaugridGpuXidErrorGpu3", "taugrid-health-TaugridGpuThermal"}
    assert all(a["content_type"].startswith("application/apply-patch") for a in status_applies)
    rv = node(fake)["metadata"]["resourceVersion"]
    await act.set_condition(NodeCondition(node="n1", type="GpuThermal", status="False", reason="Cool",
                                          time=1_700_000_060.0))
    assert node(fake)["metadata"]["resourceVersion"] == rv  # the same apply again changes nothing


async def test_drain_evicts_only_our_pods_on_that_node(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    add_node(fake, "n2")
    add_pod(fake, "train-a1-0", node="n1", labels=OURS)
    add_pod(fake, "train-a1-1", node="n1", labels=OURS, ns="team-b")
    add_pod(fake, "nvidia-dcgm-exporter", node="n1", ns="gpu-operator")
    add_pod(fake, "train-b1-0", node="n2", labels=OURS)
    assert await actuator(api_client).drain("n1", grace_s=5) == 2
    assert sorted((e["namespace"], e["name"]) for e in fake.evictions) == [
        ("team-a", "train-a1-0"), ("team-b", "train-a1-1")]
    assert fake.evictions[0]["body"]["kind"] == "Eviction"
    assert fake.evictions[0]["body"]["deleteOptions"]["gracePeriodSeconds"] == 5
    remaining = {name for (res, _, name) in fake.objects if res == PODS}
    assert remaining == {"nvidia-dcgm-exporter", "train-b1-0"}
    assert await actuator(api_client).drain("n1") == 0  # redelivery: nothing left to evict


async def test_drain_blocked_by_a_disruption_budget_is_temporary(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    add_pod(fake, "train-a1-0", node="n1", labels=OURS)
    add_pod(fake, "train-a1-1", node="n1", labels=OURS)
    fake.pdb_blocked.add(("team-a", "train-a1-0"))
    with pytest.raises(TemporaryError, match="disruption budget") as info:
        await actuator(api_client).drain("n1")
    assert info.value.delay >= 10.0
    remaining = {name for (res, _, name) in fake.objects if res == PODS}
    assert remaining == {"train-a1-0"}  # the other one was still evicted
    fake.pdb_blocked.clear()
    assert await actuator(api_client).drain("n1") == 1


async def test_a_cordon_with_drain_on_the_bus_cordons_and_evicts(fake_kube: Any, bus: Bus) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    add_pod(fake, "train-a1-0", node="n1", labels=OURS)
    add_pod(fake, "sidecar", node="n1")
    loop = ConsumerLoop(bus, stream="NODES", durable="health-actuator",
                        handler=actuate(bus, actuator(api_client)), fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    try:
        with acting_as(bus, "health-monitor"):
            await bus.publish(
                node_subject("n1", "cordon"),
                NodeCordon(node="n1", reason="XID 79", drain=True, conditions=["GpuXidError"], time=1.0),
                event_type="cordon", family="node", ce_subject="n1", msg_id=f"n1.cordon.{uuid.uuid4().hex}")
        for _ in range(200):
            if fake.evictions:
                break
            await asyncio.sleep(0.05)
        assert [(e["namespace"], e["name"]) for e in fake.evictions] == [("team-a", "train-a1-0")]
        assert node(fake)["spec"]["unschedulable"] is True
        ours = {"key": TAINT_KEY, "value": "GpuXidError", "effect": "NoSchedule"}
        assert ours in node(fake)["spec"]["taints"]
        assert (PODS, "team-a", "sidecar") in fake.objects
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, timeout=10)


async def test_a_cordon_superseded_by_an_uncordon_is_skipped(fake_kube: Any, bus: Bus) -> None:
    fake, api_client = fake_kube
    name = f"n-{uuid.uuid4().hex[:8]}"
    add_node(fake, name)
    add_pod(fake, "train-a1-0", node=name, labels=OURS)
    for what, payload in [
        ("cordon", NodeCordon(node=name, reason="XID 79", drain=True, conditions=["GpuXidError"], time=1.0)),
        ("uncordon", NodeUncordon(node=name, reason="validation passed", time=2.0)),
    ]:
        with acting_as(bus, "health-monitor"):
            await bus.publish(node_subject(name, what), payload, event_type=what, family="node", ce_subject=name,
                              msg_id=f"{name}.{what}.{uuid.uuid4().hex}")
    loop = ConsumerLoop(bus, stream="NODES", durable="health-actuator",
                        handler=actuate(bus, actuator(api_client)), fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(200):
            info = await bus.js.consumer_info("NODES", "health-actuator")
            if loop.handled >= 2 and info.num_pending == 0 and info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("health-actuator did not handle both decisions")
        assert not fake.evictions
        assert not node(fake, name)["spec"].get("unschedulable")
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, timeout=10)
