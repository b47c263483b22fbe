"""Which of a node's samples its agent publishes: the ones the health monitor can learn something from.

The agent samples every ``TAU_NODE_SAMPLE_INTERVAL`` (5 s) but publishes a sample only when (``Publisher.why``):

* it is the first since the agent started (the monitor may have missed everything before);
* what the rules judge in it changed since the last one published (``judged``);
* it carries events (XIDs, vendor events): they are reported once, never again;
* a rule is measuring something over consecutive samples right now (``restless``): the monitor holds the node
  (cordoned, a condition raised, a validation or repair step outstanding: it counts clean samples in a row and
  folds a validation's result in at the next sample), an InfiniBand port is down (its grace is timed across
  samples), or a counter the rules turn into a rate (PCIe replays) moved within the last rate window;
* else a heartbeat, ``TAU_NODE_HEARTBEAT_INTERVAL`` (60 s) after the last one published, so the monitor and the
  readers of ``node_state`` know the node is alive (``wire.silent``). Each node's first heartbeat comes at its
  own fraction of the interval, so a pool's heartbeats do not all fall on one tick. A heartbeat is a whole
  sample, so a change the monitor never folded in (its message given up on) is stated again within an interval.

This is what fleet agents do: node-problem-detector patches a node condition when it changes and otherwise lets
the kubelet's periodic status say the node is alive; DCGM's health watches report incidents, not every reading.

What counts as judged: the fields ``health/rules.py`` reads (GPU source, vendor, model and message; per GPU its
index, memory, ECC counts, remapped rows, PCIe replay count, NVLink links, down links and replay/recovery
counters, and its temperature's band against the thermal thresholds; per InfiniBand port its state, physical
state, rate, link layer and the error counters the rules read). What does not: the sample's time, the machine's
CPUs, memory and load, GPU utilisation, memory used, power, throttle reasons, a temperature moving inside its
band, and InfiniBand traffic counters. No rule reads them, and most move at every sample, so publishing on their
change would publish every sample again. The GPU gauges (``metrics.observe_sample``) follow published samples, so
between heartbeats they show a node's last published reading.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from taugrid.core.contracts import GpuSample, IbPort, NodeSample
from taugrid.health.rules import IB_FATAL_COUNTERS, Policy
from taugrid.health.wire import NodeState

IB_JUDGED_COUNTERS = (*IB_FATAL_COUNTERS, "symbol_error")
NVLINK_JUDGED_COUNTERS = ("replay", "recovery")


@dataclass(frozen=True)
class Thermal:
    """The monitor's thermal thresholds (``TAU_HEALTH_THERMAL_C``, ``TAU_HEALTH_THERMAL_CLEAR_C``): a temperature
    is judged only by which side of them it is on."""

    raise_c: int = Policy.thermal_raise_c
    clear_c: int = Policy.thermal_clear_c

    def band(self, celsius: int | None) -> int | None:
        """1 at or above the raise threshold, -1 at or below the clear one, 0 between, None unknown."""
        if celsius is None:
            return None
        return 1 if celsius >= self.raise_c else -1 if celsius <= self.clear_c else 0


def _gpu(g: GpuSample, thermal: Thermal) -> tuple[Any, ...]:
    nvlink = None if g.nvlink_errors is None else tuple(g.nvlink_errors.get(k) for k in NVLINK_JUDGED_COUNTERS)
    return (g.index, g.memory_total_mb, g.ecc_volatile_uncorrected, g.ecc_aggregate_uncorrected,
            g.remapped_rows_pending, g.remapped_rows_failure, g.pcie_replay_count, thermal.band(g.temperature_c),
            g.nvlink_links, tuple(g.nvlink_down), nvlink)


def _port(p: IbPort) -> tuple[Any, ...]:
    return (p.hca, p.port, p.state, p.phys_state, p.rate_gbps, p.link_layer,
            tuple(p.counters.get(k) for k in IB_JUDGED_COUNTERS))


def judged(sample: NodeSample, thermal: Thermal) -> tuple[Any, ...]:
    """What the rules read from ``sample``, as a value to compare with the last published one's."""
    return (sample.gpu_source, sample.gpu_vendor, sample.gpu_model, sample.message,
            tuple(_gpu(g, thermal) for g in sample.gpus), tuple(_port(p) for p in sample.ib_ports))


def _rate_counters(sample: NodeSample) -> tuple[int | None, ...]:
    return tuple(g.pcie_replay_count for g in sample.gpus)


def held(state: NodeState | None) -> bool:
    """The monitor is counting this node's samples: it cordoned it, a condition is raised, or it waits for a
    validation or a repair step the agent reports at the next sample."""
    return state is not None and (state.cordoned or bool(state.guard_blocked) or bool(state.validation_wanted_since)
                                  or bool(state.repair_wanted)
                                  or any(c.status == "True" for c in state.conditions.values()))


def phase(node: str, heartbeat_s: float) -> float:
    """The node's own offset into the heartbeat interval (stable across restarts), to spread a pool's heartbeats."""
    return heartbeat_s * (zlib.crc32(node.encode()) / 2**32)


class Publisher:
    """One node's publishing decision; ``heartbeat_s`` 0 publishes every sample (tests that tick by hand)."""

    def __init__(self, node: str, *, heartbeat_s: float = 0.0, thermal: Thermal | None = None,
                 rate_window_s: float = Policy.pcie_window_s) -> None:
        self.node, self.heartbeat_s = node, heartbeat_s
        self.thermal = thermal or Thermal()
        self.rate_window_s = rate_window_s
        self._judged: tuple[Any, ...] | None = None
        self._rates: tuple[int | None, ...] | None = None
        self._rate_moved_at = float("-inf")
        self._due = 0.0  # when the next heartbeat is due

    def why(self, sample: NodeSample, state: NodeState | None) -> str:
        """Why ``sample`` is to be published ("" when it is not): first, changed, events, held, ib-down,
        rate-moving, heartbeat or every-sample."""
        now = sample.time
        rates = _rate_counters(sample)
        if rates != self._rates:
            if self._rates is not None:  # first sight of a counter is no movement
                self._rate_moved_at = now
            self._rates = rates
        if not self.heartbeat_s:
            return "every-sample"
        if self._judged is None:
            return "first"
        if judged(sample, self.thermal) != self._judged:
            return "changed"
        if any(g.xid_events or g.events for g in sample.gpus):
            return "events"
        if held(state):
            return "held"
        if any(p.state and p.state.upper() != "ACTIVE" for p in sample.ib_ports):
            return "ib-down"
        if now - self._rate_moved_at < self.rate_window_s:
            return "rate-moving"
        return "heartbeat" if now >= self._due else ""

    def published(self, sample: NodeSample) -> None:
        """``sample`` reached the bus: the next decision compares with it, and the next heartbeat counts from it."""
        first = self._judged is None
        self._judged = judged(sample, self.thermal)
        self._due = sample.time + (phase(self.node, self.heartbeat_s) if first else self.heartbeat_s)
