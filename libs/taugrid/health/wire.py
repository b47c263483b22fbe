"""The ``node_state`` KV record, and the node-health payloads (re-exported from ``core/contracts.py``, where the
published bus contract reads them).

Subjects (stream NODES): ``node.<node>.cordon`` (NodeCordon), ``node.<node>.uncordon`` (NodeUncordon),
``node.<node>.validation`` (NodeValidation, from the node agent), ``node.<node>.repair`` (NodeRepair).
Like every wire struct, fields are only
added, with defaults. ``NodeState`` is the health-monitor's per-node projection: it can be rebuilt by
replaying ``node.*.sample`` (it holds what the rules derived from samples, plus our own cordon decisions).

A node's agent publishes a sample when something the rules judge changed, else a heartbeat every
``heartbeat_s`` (``health.change``); ``silent`` (``core.heartbeat``) tells a node whose agent stopped from a quiet
one.
"""

from __future__ import annotations

import msgspec

from taugrid.core import heartbeat
from taugrid.core.contracts import NodeCordon, NodeRepair, NodeUncordon, NodeValidation

__all__ = ["ConditionState", "NodeCordon", "NodeRepair", "NodeState", "NodeUncordon", "NodeValidation",
           "condition_key", "silent"]


class ConditionState(msgspec.Struct, kw_only=True):
    type: str
    gpu: int | None = None
    status: str = "False"
    reason: str = ""
    message: str = ""
    severity: int = 0
    latched: bool = False  # event-born: cleared only by a passed validation, never by one quiet sample
    since: float = 0.0
    transitions: int = 0  # numbers the transitions, so each has a deterministic Nats-Msg-Id


class NodeState(msgspec.Struct, kw_only=True):
    node: str
    last_sample: float = 0.0  # the last sample published, a change or a heartbeat
    heartbeat_s: float = 0.0  # the agent's heartbeat interval as its last sample stated it (0: every sample)
    gpu_source: str = "none"
    gpu_vendor: str = ""  # the node's GPUs' vendor and model, as last read (kept while they cannot be read)
    gpu_model: str = ""
    expected_gpus: int = 0  # high-water mark of GPUs seen (or the policy's override)
    conditions: dict[str, ConditionState] = msgspec.field(default_factory=dict)
    verdict: str = "healthy"  # healthy | degraded | unhealthy
    cordoned: bool = False  # by us; a node a human cordoned is never ours to uncordon
    drained: bool = False
    cordon_seq: int = 0
    cordon_reason: str = ""
    cordon_time: float = 0.0
    guard_blocked: str = ""
    clean_samples: int = 0
    validation_wanted_since: float = 0.0  # the agent validates when this is set and newer than its last run
    last_validation: str = ""
    repairs: int = 0  # repair steps asked for this node (the budget counts them; reset by a passed validation)
    repair_wanted: str = ""  # the step the agent should carry out now ("" = none)
    repair_wanted_since: float = 0.0
    repair_gpus: list[int] = msgspec.field(default_factory=list)
    last_repair: str = ""  # "<step>: <outcome>"
    last_repair_time: float = 0.0
    pcie_base: dict[str, list[float]] = msgspec.field(default_factory=dict)  # gpu → [time, count]
    ecc_aggregate: dict[str, int] = msgspec.field(default_factory=dict)  # gpu → last aggregate count
    nvlink_base: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)  # gpu → last NVLink error counts
    ib_down_since: dict[str, float] = msgspec.field(default_factory=dict)  # "<hca>/<port>" → first seen not ACTIVE
    ib_rate_max: dict[str, float] = msgspec.field(default_factory=dict)  # port → highest rate seen (Gb/s)
    ib_counters: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)  # port → last error counters
    ib_symbol_base: dict[str, list[float]] = msgspec.field(default_factory=dict)  # port → [time, symbol_error]


def condition_key(ctype: str, gpu: int | None) -> str:
    return ctype if gpu is None else f"{ctype}/{gpu}"


def silent(state: NodeState, now: float) -> bool:
    """No sample, not even a heartbeat, for longer than ``core.heartbeat.silent_after``: the agent (or its node)
    is gone."""
    return heartbeat.silent(state.last_sample, state.heartbeat_s, now)
