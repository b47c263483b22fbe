"""``python -m taugrid_services.health_monitor``: consumes ``node.*.sample`` with durable ``health-monitor``.

With ``TAU_BACKEND=kubernetes`` it also carries its decisions out on the cluster (durable ``health-actuator``,
``node.*.cordon`` / ``node.*.uncordon`` / ``node.*.condition.>`` / ``node.*.repair``): cordon + taint, drain by
eviction, node conditions, and the repair steps an agent cannot do itself (a ``node-reboot`` it only requested:
the kured annotation or a medik8s NodeMaintenance, ``TAU_HEALTH_REBOOT_VIA``; ``replace-node``: an annotation),
through ``taugrid.kube.nodes.NodeActuator``. In local mode (the default) the local cluster
consumes the cordon decisions itself, so nothing more runs here.

A decision older than the node's latest of its kind (a drain retried past a later uncordon, a condition
retried past its next transition) is stale and skipped, so retries never undo a newer decision.

Tunables (environment): ``TAU_HEALTH_THERMAL_C``, ``TAU_HEALTH_THERMAL_CLEAR_C``,
``TAU_HEALTH_CLEAN_SAMPLES``, ``TAU_HEALTH_MAX_CORDONED``, ``TAU_HEALTH_MAX_CORDONED_FRACTION``,
``TAU_HEALTH_MIN_CORDON_BUDGET``, ``TAU_HEALTH_PCIE_REPLAYS_PER_MIN``, ``TAU_HEALTH_EXPECTED_GPUS``;
Kubernetes mode: ``TAU_KUBE_HOST`` / ``TAU_KUBECONFIG`` (or ``KUBECONFIG``) + ``TAU_KUBE_CONTEXT`` or
in-cluster credentials, ``TAU_HEALTH_DRAIN_GRACE_S`` (default 30), ``TAU_HEALTH_REBOOT_VIA`` (``annotation``,
the default, or ``nodemaintenance``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from taugrid.bus import streams
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import Handler
from taugrid.bus.envelope import Event
from taugrid.core.contracts import NodeCondition
from taugrid.core.errors import PermanentError
from taugrid.core.events import node_subject
from taugrid.health.monitor import STREAM, HealthMonitor, policy
from taugrid.health.wire import NodeCordon, NodeRepair, NodeUncordon
from taugrid.service import Service, main
from taugrid.settings import KubeSettings

if TYPE_CHECKING:
    from taugrid.kube.nodes import NodeActuator


async def actuator(kube: KubeSettings) -> NodeActuator:
    # Imported here, for the Kubernetes backend only: kubernetes_asyncio is about 65 MB resident, which a local
    # stack's health monitor would otherwise carry for nothing (tests/contract/test_import_weight.py).
    from taugrid.kube.client import KubeApi, api_client_for
    from taugrid.kube.nodes import NodeActuator

    return NodeActuator(KubeApi(await api_client_for(kube)))


async def _last_seq(bus: Bus, subject: str) -> tuple[int, bytes]:
    msg = await streams.last(bus, STREAM, subject)
    return (msg.seq, msg.data) if msg is not None else (0, b"")


async def _superseded(bus: Bus, ev: Event, node: str, *, gpu: int | None = None) -> bool:
    """Whether a newer decision of the same kind exists (a retried message must not undo a later one)."""
    if not ev.seq:
        return False
    if ev.nats_subject.split(".")[2] == "condition":  # one subject per type; the GPU is in the payload
        seq, data = await _last_seq(bus, ev.nats_subject)
        if seq <= ev.seq:
            return False
        try:
            return msgspec.json.decode(data, type=NodeCondition).gpu == gpu
        except msgspec.DecodeError:
            return False
    latest = max([(await _last_seq(bus, node_subject(node, what)))[0] for what in ("cordon", "uncordon")])
    return latest > ev.seq


def actuate(bus: Bus, actuator: NodeActuator, *, grace_s: int = 30, reboot_via: str = "annotation") -> Handler:
    """The ``health-actuator`` handler: one node decision → one cluster action."""

    async def handle(ev: Event) -> None:
        parts = ev.nats_subject.split(".")
        what = parts[2] if len(parts) > 2 else ""
        if what == "repair":
            await _repair(ev)
            return
        if what not in ("condition", "cordon", "uncordon"):
            raise PermanentError(f"{ev.nats_subject}: not a node decision subject")
        try:
            decision: NodeCondition | NodeCordon | NodeUncordon = (
                ev.payload(NodeCondition) if what == "condition"
                else ev.payload(NodeCordon) if what == "cordon" else ev.payload(NodeUncordon))
        except msgspec.DecodeError as exc:  # also a ValidationError: JSON of the wrong shape
            raise PermanentError(f"{ev.nats_subject}: undecodable payload: {exc}") from exc
        gpu = decision.gpu if isinstance(decision, NodeCondition) else None
        if await _superseded(bus, ev, decision.node, gpu=gpu):
            return  # a newer decision for this node exists; it is the one to act on
        if isinstance(decision, NodeCondition):
            await actuator.set_condition(decision)
        elif isinstance(decision, NodeCordon):
            await actuator.cordon(decision.node, decision.reason, conditions=decision.conditions)
            if decision.drain:
                await actuator.drain(decision.node, grace_s=grace_s)
        else:
            await actuator.uncordon(decision.node, decision.reason)
            if reboot_via == "nodemaintenance":
                await actuator.end_maintenance(decision.node)

    async def _repair(ev: Event) -> None:
        try:
            step = ev.payload(NodeRepair)
        except msgspec.DecodeError as exc:
            raise PermanentError(f"{ev.nats_subject}: undecodable payload: {exc}") from exc
        if step.ok:
            return  # the agent did it
        if step.step == "node-reboot":
            await actuator.request_reboot(step.node, f"taugrid repair step {step.attempt}: {step.outcome}",
                                          at=step.time, via=reboot_via)
        elif step.step == "replace-node":
            await actuator.mark_for_replacement(step.node, step.outcome)

    return handle


async def start(svc: Service) -> None:
    health = svc.settings.health
    monitor = HealthMonitor(svc.bus, policy=policy(health))
    svc.consume("health-monitor", monitor.handle)
    if svc.settings.process.backend == "kubernetes":
        svc.consume("health-actuator", actuate(svc.bus, await actuator(svc.settings.kube),
                                               grace_s=health.drain_grace_s, reboot_via=health.reboot_via))


if __name__ == "__main__":
    main("health-monitor", start)
