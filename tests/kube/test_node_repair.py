"""Repair steps an agent cannot carry out itself, done on the cluster over real HTTP (kmock FakeKube): a reboot
request as the annotation kured's sentinel command can test, or a medik8s NodeMaintenance; replace-node as an
annotation; an uncordon clears them. And the ``health-actuator`` consumer acting on ``node.<n>.repair``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.core.errors import PermanentError
from taugrid.core.events import node_subject
from taugrid.health.wire import NodeRepair
from taugrid.kube.nodes import REBOOT_ANNOTATION, REBOOT_REASON_ANNOTATION, REPLACE_ANNOTATION
from taugrid.render.crds import validator_for
from taugrid_services.health_monitor.__main__ import actuate
from tests.kube.test_nodes import actuator, add_node, node
from tests.owners import acting_as

NODE_MAINTENANCES = ("nodemaintenance.medik8s.io", "v1beta1", "nodemaintenances")


async def test_a_reboot_request_annotates_the_node_once_and_an_uncordon_clears_it(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    await act.cordon("n1", "XID 79", conditions=["GpuXidError"])
    assert await act.request_reboot("n1", "XID 79 on GPU 0", at=1_796_000_000.0)
    annotations = node(fake)["metadata"]["annotations"]
    assert (annotations[REBOOT_ANNOTATION], annotations[REBOOT_REASON_ANNOTATION]) == (
        "2026-11-30T00:53:20Z", "XID 79 on GPU 0")
    assert not await act.request_reboot("n1", "XID 79 on GPU 0", at=1_796_000_000.0)  # redelivery: nothing new
    assert await act.mark_for_replacement("n1", "repair budget spent")
    assert node(fake)["metadata"]["annotations"][REPLACE_ANNOTATION] == "repair budget spent"
    await act.uncordon("n1", "validated")
    left = node(fake)["metadata"].get("annotations") or {}
    assert not {REBOOT_ANNOTATION, REBOOT_REASON_ANNOTATION, REPLACE_ANNOTATION} & set(left)


async def test_a_reboot_through_medik8s_applies_a_node_maintenance_and_ending_it_deletes_it(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    add_node(fake)
    act = actuator(api_client)
    assert await act.request_reboot("n1", "XID 79", at=1.0, via="nodemaintenance")
    obj = fake.objects[(NODE_MAINTENANCES, None, "taugrid-n1")]
    assert (obj["kind"], obj["spec"]) == ("NodeMaintenance", {"nodeName": "n1", "reason": "XID 79"})
    assert obj["metadata"]["labels"] == {"taugrid.io/managed-by": "taugrid"}
    # What was applied is valid under medik8s's own CRD (deploy/crds), unknown fields refused as strict apply does.
    applied = {k: v for k, v in obj.items() if k != "status"}
    applied["metadata"] = {k: v for k, v in obj["metadata"].items() if k in ("name", "labels", "annotations")}
    assert list(validator_for(obj["apiVersion"], "NodeMaintenance").iter_errors(applied)) == []
    assert [e.message for e in validator_for(obj["apiVersion"], "NodeMaintenance").iter_errors(
        {**applied, "spec": {"reason": "x"}})] == ["'nodeName' is a required property"]
    await act.end_maintenance("n1")
    assert (NODE_MAINTENANCES, None, "taugrid-n1") not in fake.objects
    await act.end_maintenance("n1")  # already gone: fine
    with pytest.raises(PermanentError, match="TAU_HEALTH_REBOOT_VIA"):
        await act.request_reboot("n1", "x", at=1.0, via="ipmi")


async def test_the_actuator_requests_the_reboot_an_agent_could_only_report(fake_kube: Any, bus: Bus) -> None:
    fake, api_client = fake_kube
    name = f"n-{uuid.uuid4().hex[:8]}"
    add_node(fake, name)
    loop = ConsumerLoop(bus, stream="NODES", durable="health-actuator",
                        handler=actuate(bus, actuator(api_client)), fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    try:
        step = NodeRepair(node=name, step="node-reboot", ok=False, attempt=1, gpus=[0], time=1_796_000_000.0,
                          outcome="reboot requested: reboot this machine by hand")
        with acting_as(bus, "node-agent"):
            await bus.publish(node_subject(name, "repair"), step, event_type="repair", family="node",
                              ce_subject=name, msg_id=f"{name}.repair.1")
        for _ in range(200):
            if REBOOT_ANNOTATION in (node(fake, name)["metadata"].get("annotations") or {}):
                break
            await asyncio.sleep(0.05)
        annotations = node(fake, name)["metadata"]["annotations"]
        assert annotations[REBOOT_ANNOTATION] == "2026-11-30T00:53:20Z"
        assert annotations[REBOOT_REASON_ANNOTATION] == "taugrid repair step 1: reboot requested: reboot this " \
                                                        "machine by hand"
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, timeout=10)
