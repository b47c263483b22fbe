"""The health-monitor's handler: fold ``node.<node>.sample`` into ``node_state`` and act on what changed.

Per sample: read the node's state (KV ``node_state``, key ``node.<node>``), evaluate the pure rules, publish
condition transitions, cordon/uncordon decisions and ``health.degraded`` for the runs on a node being drained,
then write the new state with a compare-and-set.

Idempotent, because: samples not newer than the state's ``last_sample`` are ignored; every publish carries a
Nats-Msg-Id derived from the state it was computed from (condition transition number, cordon sequence), and
we publish *before* the CAS write, so a crash in between leads to a redelivery that recomputes the same ids
and is deduplicated by the stream; a lost CAS race re-reads and re-evaluates.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import msgspec

from taugrid import runrecord
from taugrid.bus import kv, metrics, streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core.contracts import HealthDegraded, NodeSample
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.events import node_subject
from taugrid.core.ids import token
from taugrid.core.states import TERMINAL, RunRecord
from taugrid.health import repair, rules
from taugrid.health.wire import NodeCordon, NodeRepair, NodeState, NodeUncordon, NodeValidation, condition_key
from taugrid.settings import HealthSettings

log = logging.getLogger("taugrid.health.monitor")

T = TypeVar("T")
BUCKET = "node_state"
STREAM = "NODES"


def state_key(node: str) -> str:
    return f"node.{token(node)}"


def policy(given: HealthSettings) -> rules.Policy:
    """The monitor's thresholds as the settings give them (``TAU_HEALTH_*``; their defaults are
    ``rules.Policy``'s, tests/test_settings.py checks it)."""
    return rules.Policy(
        thermal_raise_c=given.thermal_c,
        thermal_clear_c=given.thermal_clear_c,
        clean_samples_to_release=given.clean_samples,
        max_cordoned=given.max_cordoned,
        max_cordoned_fraction=given.max_cordoned_fraction,
        min_cordon_budget=given.min_cordon_budget,
        pcie_replays_per_min=given.pcie_replays_per_min,
        expected_gpus=given.expected_gpus,
        repair_budget=given.repair_budget,
        repair_retry_s=given.repair_retry_s,
    )


async def read_state(bus: Bus, node: str) -> tuple[NodeState | None, int]:
    return await kv.load(bus, BUCKET, state_key(node), NodeState)


async def list_states(bus: Bus) -> list[NodeState]:
    return await kv.values(bus, BUCKET, NodeState, prefix="node.")


def shrinks_instead(rec: RunRecord, node: str) -> bool:
    """An elastic run with pods on other nodes too is not told ``health.degraded`` (which would retry it whole):
    the drain takes only its pods here, and the local pool shrinks it off the node (``local/resize.shrink_off``);
    where that cannot be (pod 0 is here, the minimum), the drain fails it and recovery blames the node from that
    failure (``health/blame.py``), so it is still retried elsewhere."""
    run = rec.resolved
    return run is not None and run.elastic_max > 0 and any(p.node and p.node != node for p in rec.pods)


class HealthMonitor:
    def __init__(self, bus: Bus, *, policy: rules.Policy | None = None) -> None:
        self.bus = bus
        self.policy = policy or rules.Policy()

    async def handle(self, ev: Event) -> None:
        """Consumer handler for ``node.*.sample`` (durable ``health-monitor``)."""
        try:
            sample: NodeSample = ev.payload(NodeSample)
        except msgspec.ValidationError as exc:
            raise PermanentError(f"{ev.nats_subject}: not a NodeSample: {exc}") from exc
        await self.process(sample)

    async def process(self, sample: NodeSample) -> rules.Plan | None:
        for _ in range(10):
            prev, revision = await read_state(self.bus, sample.node)
            if prev is not None and sample.time <= prev.last_sample:
                return None  # redelivery or an older sample: already folded in
            asked = prev is not None and prev.validation_wanted_since > 0
            validation = await self.last_validation(sample.node) if asked else None
            ev = rules.evaluate(prev, sample, policy=self.policy, validation=validation)
            fleet = await self.fleet(sample.node) if rules.wants_cordon(ev) else None
            plan = rules.plan(ev, policy=self.policy, fleet=fleet)
            await self._repair(plan.state, released=ev.released, now=sample.time)
            await self._publish(plan)
            try:
                await kv.save(self.bus, BUCKET, state_key(sample.node), plan.state, revision=revision)
            except kv.Conflict:
                continue
            metrics.observe_sample(sample)
            metrics.observe_node(plan.state)
            if plan.state.guard_blocked:
                log.warning("%s: cordon withheld: %s", sample.node, plan.state.guard_blocked)
            return plan
        raise TemporaryError(f"node_state contention on {sample.node}", delay=0.2)

    async def fleet(self, node: str) -> rules.Fleet:
        states = await list_states(self.bus)
        names = {s.node for s in states} | {node}
        return rules.Fleet(total=len(names), cordoned=frozenset(s.node for s in states if s.cordoned))

    async def _repair(self, st: NodeState, *, released: bool, now: float) -> None:
        """Fold in the agent's report of the outstanding repair step, then ask for the next one if the drained
        node is still faulty (``health.repair``). The replace-node escalation is reported here: no agent acts."""
        if released:
            repair.released(st)
            return
        if st.repair_wanted:
            repair.fold(st, await self._last(st.node, "repair", NodeRepair))
        step, gpus = repair.next_step(st, now=now, budget=self.policy.repair_budget,
                                      retry_s=self.policy.repair_retry_s)
        if not step:
            return
        repair.ask(st, step, gpus, now)
        log.warning("%s: repair step %d: %s%s", st.node, st.repairs, step, f" (GPUs {gpus})" if gpus else "")
        if step == "replace-node":
            spent = st.repairs > self.policy.repair_budget  # else the fault's own ladder starts there (an RMA)
            why = (f"repair budget of {self.policy.repair_budget} step(s) spent ({st.last_repair})" if spent else
                   "the fault needs the GPU replaced: " + "; ".join(
                       c.message for c in rules.faults(st) if c.type in repair.LADDERS
                       and repair.LADDERS[c.type][0] == "replace-node"))
            result = NodeRepair(node=st.node, step=step, ok=False, attempt=st.repairs, gpus=gpus, time=now,
                                outcome=f"{why}; the node stays cordoned until it is replaced or repaired by hand")
            await self.bus.publish(node_subject(st.node, "repair"), result, event_type="repair", family="node",
                                   ce_subject=st.node, msg_id=f"{token(st.node)}.repair.{st.repairs}")
            repair.fold(st, result)

    async def _last(self, node: str, what: str, kind: type[T]) -> T | None:
        msg = await streams.last(self.bus, STREAM, node_subject(node, what))
        if msg is None:
            return None
        try:
            return msgspec.json.decode(msg.data, type=kind)
        except msgspec.DecodeError:
            log.warning("%s: undecodable %s result ignored", node, what)
            return None

    async def last_validation(self, node: str) -> NodeValidation | None:
        msg = await streams.last(self.bus, STREAM, node_subject(node, "validation"))
        if msg is None:
            return None
        try:
            return msgspec.json.decode(msg.data, type=NodeValidation)
        except msgspec.DecodeError:
            log.warning("%s: undecodable validation result ignored", node)
            return None

    async def _publish(self, plan: rules.Plan) -> None:
        st = plan.state
        node = token(st.node)
        for cond in plan.transitions:
            n = st.conditions[condition_key(cond.type, cond.gpu)].transitions
            gpu = "node" if cond.gpu is None else f"g{cond.gpu}"
            await self.bus.publish(
                node_subject(st.node, f"condition.{cond.type}"), cond, event_type="condition", family="node",
                ce_subject=st.node, msg_id=f"{node}.condition.{cond.type}.{gpu}.{n}")
            log.info("%s: %s%s %s (%s)", st.node, cond.type, "" if cond.gpu is None else f"[gpu {cond.gpu}]",
                     cond.status, cond.reason)
        for action in plan.actions:
            if action.kind == "uncordon":
                await self.bus.publish(
                    node_subject(st.node, "uncordon"), NodeUncordon(node=st.node, reason=action.reason,
                                                                    time=st.last_sample),
                    event_type="uncordon", family="node", ce_subject=st.node,
                    msg_id=f"{node}.uncordon.{action.seq}")
                log.info("%s: uncordon: %s", st.node, action.reason)
                continue
            types = sorted({c.type for c in rules.faults(st)})
            # the runs on the node as the drain begins: read before the cordon goes out, since the drain it starts
            # may end a run, and recovery retry it elsewhere, before a later read would find it on this node
            live = await self._live_runs(st) if action.drain else []
            await self.bus.publish(
                node_subject(st.node, "cordon"),
                NodeCordon(node=st.node, reason=action.reason, drain=action.drain, conditions=types,
                           time=st.last_sample),
                event_type="cordon", family="node", ce_subject=st.node,
                msg_id=f"{node}.cordon.{action.seq}{'.drain' if action.drain else ''}")
            log.warning("%s: cordon%s: %s", st.node, " + drain" if action.drain else "", action.reason)
            if action.drain:
                await self._degrade_runs(st, action, live)

    async def _live_runs(self, st: NodeState) -> list[RunRecord]:
        return [rec for rec in await runrecord.list_records(self.bus)
                if rec.node == st.node and rec.state not in TERMINAL and not shrinks_instead(rec, st.node)]

    async def _degrade_runs(self, st: NodeState, action: rules.Action, live: list[RunRecord]) -> None:
        """Tell recovery about every live run on the node; it decides retry/resume with the node excluded."""
        worst = max(rules.faults(st), key=lambda c: c.severity, default=None)
        condition = worst.type if worst is not None else "Unknown"
        for rec in live:
            await self.bus.emit(
                workspace=rec.workspace, run_id=rec.run_id, attempt=rec.attempt, event_type="health.degraded",
                payload=HealthDegraded(node=st.node, condition=condition, message=action.reason),
                dedup=f"{token(st.node)}.{action.seq}")
            log.warning("%s: run %s (attempt %d) told health.degraded", st.node, rec.run_id, rec.attempt)
