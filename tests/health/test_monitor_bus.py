"""The health-monitor and node agent against a real nats-server: XID 79 → condition, cordon, health.degraded;
clean samples + validation → uncordon; idempotent redelivery; the blast-radius guard reading node_state."""

from __future__ import annotations

import asyncio
import os
import uuid

import msgspec
import nats
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, connect
from taugrid.bus.consumer import ConsumerLoop
from taugrid.core.contracts import HealthDegraded, NodeCondition, ResolvedRun
from taugrid.core.states import PodView, RunRecord
from taugrid.health.agent import NodeAgent
from taugrid.health.monitor import HealthMonitor, read_state
from taugrid.health.probe import DeclaredProbe
from taugrid.health.rules import Policy
from taugrid.health.wire import NodeCordon, NodeUncordon, NodeValidation
from taugrid.service import Service

ROOMY = Policy(clean_samples_to_release=2, max_cordoned=10_000, max_cordoned_fraction=1.0)


async def last(bus: Bus, stream: str, subject: str) -> nats.js.api.RawStreamMsg | None:
    try:
        return await bus.js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None


async def test_xid_79_cordons_and_degrades_runs_then_validation_uncordons(bus: Bus) -> None:
    node, ws = f"gpu-{uuid.uuid4().hex[:6]}", f"w{uuid.uuid4().hex[:6]}"
    live, done = f"live-{uuid.uuid4().hex[:6]}", f"done-{uuid.uuid4().hex[:6]}"
    assert await runrecord.create(bus, RunRecord(run_id=live, workspace=ws, state="running", node=node,
                                                attempt=2))
    assert await runrecord.create(bus, RunRecord(run_id=done, workspace=ws, state="succeeded", node=node))
    # elastic runs (issue 25): one with pods on another node too shrinks off this one instead of being retried
    # whole; one whose pods are all here is degraded like any other
    spread, here = f"spread-{uuid.uuid4().hex[:6]}", f"here-{uuid.uuid4().hex[:6]}"
    for rid, nodes in ((spread, [node, "gpu-other", node]), (here, [node, node])):
        elastic = ResolvedRun(run_id=rid, submission_id="s", workspace=ws, namespace="ns", name=rid, nodes=2,
                              elastic_min=1, elastic_max=4)
        assert await runrecord.create(bus, RunRecord(
            run_id=rid, workspace=ws, state="running", node=node, resolved=elastic,
            pods=[PodView(name=f"{rid}-{i}", node=n) for i, n in enumerate(nodes)]))
    probe = DeclaredProbe(2, 80000)
    agent_bus = await connect(os.environ["TAU_NATS_URL"], name="node-agent")  # samples come from the agent
    agent = NodeAgent(agent_bus, probe, node)
    monitor = HealthMonitor(bus, policy=ROOMY)
    svc = Service(bus)
    from taugrid_services.health_monitor.__main__ import start

    await start(svc)  # the real service wiring: one loop on durable "health-monitor"
    [loop] = svc.loops
    assert loop.durable == "health-monitor" and loop.stream == "NODES"
    loop = ConsumerLoop(bus, stream="NODES", durable="health-monitor", handler=monitor.handle,
                        fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())

    async def tick() -> None:
        before = loop.handled
        assert await agent.tick() is not None
        for _ in range(100):
            if loop.handled > before:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("health-monitor did not handle the sample")

    try:
        await tick()
        probe.inject_xid(0, 79)
        await tick()
        msg = await last(bus, "NODES", f"node.{node}.condition.GpuXidError")
        assert msg is not None and msg.headers is not None
        cond = msgspec.json.decode(msg.data, type=NodeCondition)
        assert (cond.status, cond.reason, cond.gpu, cond.node) == ("True", "Xid79", 0, node)
        assert msg.headers["ce-type"] == "io.taugrid.node.condition.v1"
        assert msg.headers["Nats-Msg-Id"] == f"{node}.condition.GpuXidError.g0.1"
        cmsg = await last(bus, "NODES", f"node.{node}.cordon")
        assert cmsg is not None
        cordon = msgspec.json.decode(cmsg.data, type=NodeCordon)
        assert cordon.drain and cordon.conditions == ["GpuXidError"] and "XID 79" in cordon.reason
        dmsg = await last(bus, "RUNS", f"run.{ws}.{live}.health.degraded")
        assert dmsg is not None and dmsg.headers is not None
        degraded = msgspec.json.decode(dmsg.data, type=HealthDegraded)
        assert (degraded.node, degraded.condition) == (node, "GpuXidError")
        assert dmsg.headers["ce-attempt"] == "2"
        assert await last(bus, "RUNS", f"run.{ws}.{done}.health.degraded") is None  # terminal runs left alone
        assert await last(bus, "RUNS", f"run.{ws}.{spread}.health.degraded") is None
        assert await last(bus, "RUNS", f"run.{ws}.{here}.health.degraded") is not None
        state, _ = await read_state(bus, node)
        assert state is not None and state.cordoned and state.verdict == "unhealthy"

        for _ in range(6):  # clean samples; the agent validates when asked; then the monitor lets it back
            await tick()
            if await last(bus, "NODES", f"node.{node}.uncordon") is not None:
                break
        umsg = await last(bus, "NODES", f"node.{node}.uncordon")
        assert umsg is not None, "node was not uncordoned"
        assert "2 GPU(s) answer" in msgspec.json.decode(umsg.data, type=NodeUncordon).reason
        vmsg = await last(bus, "NODES", f"node.{node}.validation")
        assert vmsg is not None and msgspec.json.decode(vmsg.data, type=NodeValidation).ok
        msg = await last(bus, "NODES", f"node.{node}.condition.GpuXidError")
        assert msg is not None and msgspec.json.decode(msg.data, type=NodeCondition).status == "False"
        state, _ = await read_state(bus, node)
        assert state is not None and not state.cordoned and state.verdict == "healthy"
    finally:
        loop.stopping.set()
        await task
        await agent_bus.close()


async def test_redelivered_sample_is_ignored_and_republish_is_deduplicated(bus: Bus) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    probe = DeclaredProbe(1)
    monitor = HealthMonitor(bus, policy=ROOMY)
    probe.inject_temperature(0, 95)
    hot = probe.sample(node)
    plan = await monitor.process(hot)
    assert plan is not None and [t.type for t in plan.transitions] == ["GpuThermal"]
    assert [(a.kind, a.drain) for a in plan.actions] == [("cordon", False)]
    assert await monitor.process(hot) is None  # same sample again: already folded in
    subject = f"node.{node}.condition.GpuThermal"
    info = await bus.js.stream_info("NODES", subjects_filter=subject)
    assert info.state.subjects == {subject: 1}
    # A crash between publish and the KV write means the next attempt publishes the same ids: deduplicated.
    await monitor._publish(plan)
    info = await bus.js.stream_info("NODES", subjects_filter=subject)
    assert info.state.subjects == {subject: 1}


async def test_guard_reads_the_fleet_from_node_state_and_withholds_the_cordon(bus: Bus) -> None:
    node, ws, run = f"gpu-{uuid.uuid4().hex[:6]}", f"w{uuid.uuid4().hex[:6]}", f"r-{uuid.uuid4().hex[:6]}"
    await runrecord.create(bus, RunRecord(run_id=run, workspace=ws, state="running", node=node))
    probe = DeclaredProbe(2)
    fleet = await HealthMonitor(bus).fleet(node)
    full = Policy(max_cordoned=len(fleet.cordoned), max_cordoned_fraction=1.0, min_cordon_budget=0)
    monitor = HealthMonitor(bus, policy=full)
    await monitor.process(probe.sample(node))
    probe.inject_xid(1, 95)
    plan = await monitor.process(probe.sample(node))
    assert plan is not None and plan.actions == [] and "blast-radius guard" in plan.state.guard_blocked
    assert await last(bus, "NODES", f"node.{node}.condition.GpuXidError") is not None  # still reported
    assert await last(bus, "NODES", f"node.{node}.cordon") is None
    assert await last(bus, "RUNS", f"run.{ws}.{run}.health.degraded") is None


async def test_garbage_sample_is_a_permanent_error(bus: Bus) -> None:
    from taugrid.bus.envelope import Event
    from taugrid.core.errors import PermanentError

    ev = Event(id="x", type="sample", source="t", subject="n", time="", data=b'{"node": 1}',
               nats_subject="node.n.sample")
    with pytest.raises(PermanentError, match="not a NodeSample"):
        await HealthMonitor(bus).handle(ev)
