"""The node agent publishes what changed and otherwise heartbeats (``health.change``), against a real nats-server:
a quiet node's samples reach NODES only as heartbeats; a fault is published at the next sample; a node the
monitor holds is sampled into it every tick until it is released; a node whose heartbeats stop is judged silent.

The agents sample a probe whose clock the test sets, so five-second ticks and minute-long heartbeat intervals
take no time."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.bus.bootstrap import bootstrap
from taugrid.client.summaries import node_rows
from taugrid.core.contracts import NodeSample
from taugrid.health.agent import NodeAgent
from taugrid.health.change import Thermal, phase
from taugrid.health.monitor import HealthMonitor, read_state, state_key
from taugrid.health.pool import AgentPool, StateWatch
from taugrid.health.probe import DeclaredProbe, take_sample
from taugrid.health.rules import Policy
from taugrid.health.wire import NodeState

ROOMY = Policy(clean_samples_to_release=2, max_cordoned=10_000, max_cordoned_fraction=1.0)
SAMPLE_S, HEARTBEAT_S = 5.0, 60.0
START = 1_000_000.0


class ClockedProbe(DeclaredProbe):
    """The declared stand-in, its samples taken at the test's time."""

    now = START

    def sample(self, node: str) -> NodeSample:
        return msgspec.structs.replace(take_sample(self, node), time=self.now)


def quiet_schedule(node: str, ticks: list[float]) -> list[float]:
    """When a node that never changes publishes: its first sample, its first heartbeat at its phase into the
    interval, then one every interval, each at the first tick due."""
    out: list[float] = []
    due = ticks[0]
    for t in ticks:
        if t >= due:
            due = t + (phase(node, HEARTBEAT_S) if not out else HEARTBEAT_S)
            out.append(t)
    return out


async def sample_count(bus: Bus, node: str) -> int:
    subject = f"node.{node}.sample"
    info = await bus.js.stream_info("NODES", subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def run_ticks(agent: NodeAgent, probe: ClockedProbe, ticks: list[float], monitor: HealthMonitor,
                    watch: StateWatch | None = None) -> list[float]:
    """Tick the agent at each time; every sample it publishes is folded in by the monitor before the next tick
    (and, with ``watch``, reaches the watch). Returns the times of the samples published."""
    published = []
    for t in ticks:
        probe.now = t
        sample = await agent.tick(watch.current if watch is not None else None)
        if sample is None:
            continue
        published.append(sample.time)
        plan = await monitor.process(sample)
        if watch is not None and plan is not None:
            await seen_by(watch, agent.node, plan.state)
    return published


async def seen_by(watch: StateWatch, node: str, state: NodeState) -> None:
    for _ in range(500):
        current = watch.current
        if current is not None and current.get(state_key(node)) == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the watch never delivered {node}'s state")


def ticks(start: float, count: int) -> list[float]:
    return [start + i * SAMPLE_S for i in range(count)]


async def test_an_unchanged_node_publishes_only_its_first_sample_and_heartbeats(bus: Bus) -> None:
    node = f"quiet-{uuid.uuid4().hex[:6]}"
    probe = ClockedProbe(2)
    agent = NodeAgent(bus, probe, node, heartbeat_s=HEARTBEAT_S)
    monitor = HealthMonitor(bus, policy=ROOMY)
    times = ticks(START, 61)  # five minutes of ticks
    gpus = probe.gpus
    for i, t in enumerate(times):  # utilisation, power and temperature inside its band move every sample
        probe.gpus = [msgspec.structs.replace(g, utilization_pct=i % 100, power_w=60.0 + i,
                                              temperature_c=40 + i % 5, memory_used_mb=i) for g in gpus]
        probe.now = t
        sample = await agent.tick()
        if sample is not None:
            await monitor.process(sample)
    expected = quiet_schedule(node, times)
    assert len(expected) in (5, 6)  # first, a phased heartbeat, then one a minute
    assert await sample_count(bus, node) == len(expected)
    state, _ = await read_state(bus, node)
    assert state is not None and (state.last_sample, state.heartbeat_s) == (expected[-1], HEARTBEAT_S)
    assert state.verdict == "healthy" and not state.conditions


@pytest.mark.parametrize(("fault", "condition"), [
    (lambda p: p.inject_xid(0, 79), "GpuXidError"),
    (lambda p: p.inject_ecc(1, volatile=1), "GpuEccUncorrectable"),
    (lambda p: p.inject_remapped_rows(0, failure=True), "GpuRemappedRowsFailure"),
    (lambda p: p.inject_temperature(1, 92), "GpuThermal"),
    (lambda p: p.hide_gpu(1), "GpuMissing"),
])
async def test_a_change_the_rules_judge_is_published_at_the_next_sample(bus: Bus, fault, condition) -> None:
    node = f"fault-{uuid.uuid4().hex[:6]}"
    probe = ClockedProbe(2)
    agent = NodeAgent(bus, probe, node, heartbeat_s=HEARTBEAT_S)
    monitor = HealthMonitor(bus, policy=ROOMY)
    first = ticks(START, 3)
    assert await run_ticks(agent, probe, first, monitor) == quiet_schedule(node, first)
    before = await sample_count(bus, node)
    assert before == len(quiet_schedule(node, first))
    fault(probe)
    at = first[-1] + SAMPLE_S
    assert await run_ticks(agent, probe, [at], monitor) == [at]
    assert await sample_count(bus, node) == before + 1
    state, _ = await read_state(bus, node)
    assert state is not None and state.last_sample == at
    assert [c.type for c in state.conditions.values() if c.status == "True"] == [condition]


async def test_a_held_node_is_sampled_every_tick_until_validated_and_released_then_heartbeats(bus: Bus) -> None:
    node = f"held-{uuid.uuid4().hex[:6]}"
    probe = ClockedProbe(2)
    agent = NodeAgent(bus, probe, node, heartbeat_s=HEARTBEAT_S, thermal=Thermal(90, 85))
    monitor = HealthMonitor(bus, policy=ROOMY)
    watch = StateWatch(bus)
    watch.start()
    try:
        assert await run_ticks(agent, probe, [START], monitor, watch) == [START]
        probe.inject_xid(0, 79)
        held = ticks(START + SAMPLE_S, 6)
        # the XID (cordon, drain, a reboot asked and done at the next tick), then every tick while held: two
        # clean samples (the second asks for a validation), and the sample at which the agent answers it, which
        # the monitor folds in after the answer (uncordon); the last two ticks are quiet again
        assert await run_ticks(agent, probe, held, monitor, watch) == held[:4]
        state, _ = await read_state(bus, node)
        assert state is not None and not state.cordoned and state.verdict == "healthy"
        assert state.last_validation.startswith("2 GPU(s) answer")
        assert await sample_count(bus, node) == 5
    finally:
        await watch.stop()


async def test_a_pool_of_one_watches_its_own_record_and_a_pool_of_many_every_record(private_bus: Bus) -> None:
    bus, machine = private_bus, f"machine-{uuid.uuid4().hex[:6]}"
    await bootstrap(bus)  # a server of its own with no platform applied: the pool is this machine alone
    pool = AgentPool(bus, machine=machine, machine_probe=lambda: ClockedProbe(1), watch_states=True)
    try:
        await pool.refresh()
        assert pool.watch is not None and (list(pool.agents), pool.watch.key_filter) == (
            [machine], state_key(machine))
        pool.agents["other"] = NodeAgent(bus, ClockedProbe(1), "other")
        await pool._watch_for_agents()
        assert pool.watch.key_filter == "node.>"
    finally:
        await pool.close()
    assert pool.watch is None



async def test_a_node_whose_heartbeats_stop_is_judged_silent_by_tau_nodes(bus: Bus) -> None:
    node = f"gone-{uuid.uuid4().hex[:6]}"
    probe = ClockedProbe(1)
    agent = NodeAgent(bus, probe, node, heartbeat_s=HEARTBEAT_S)
    monitor = HealthMonitor(bus, policy=ROOMY)
    times = ticks(START, 40)
    published = await run_ticks(agent, probe, times, monitor)
    assert published == quiet_schedule(node, times)
    state, _ = await read_state(bus, node)
    assert state is not None
    last = published[-1]

    def row(now: float) -> dict[str, object]:
        [r] = node_rows([state], [], now)
        return r

    # quiet between heartbeats is alive: a heartbeat may come up to one sample late
    assert (row(last + HEARTBEAT_S + SAMPLE_S)["silent"], row(last + 2 * HEARTBEAT_S)["silent"]) == (False, False)
    # the agent stopped: past two heartbeat intervals without a sample the node is silent, and says since when
    gone = row(last + 2 * HEARTBEAT_S + 1)
    assert (gone["silent"], gone["last_sample_age_s"], gone["silent_after_s"]) == (True, 121.0, 120.0)
