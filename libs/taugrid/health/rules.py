"""Pure fault rules: a NodeSample plus the node's previous state → conditions, a verdict and actions.

No I/O here; the health-monitor feeds samples, the fleet view and validation results in, and publishes what
comes out. Conditions use problem polarity (``status "True"`` = fault).

Invariants:
* Level conditions (remapped rows, thermal, missing GPUs, PCIe replays, NVML unavailable) follow their signal;
  an unknown reading (``None``, NVML NotSupported) never raises or clears one.
* Latched conditions (XIDs, uncorrectable ECC, failed validation, vendor events) are born from events; they clear
  only when the node has had ``clean_samples_to_release`` clean samples in a row AND a validation requested after
  that passed.
* A node we cordoned is uncordoned only through that same validation gate.
* A cordon is never issued past the blast-radius budget: at most ``max_cordoned`` nodes and at most
  ``max_cordoned_fraction`` of the fleet (but at least ``min_cordon_budget``, so a one-machine fleet can still
  protect itself). A blocked cordon is recorded in ``guard_blocked`` and retried on the next sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from taugrid.core.contracts import IbPort, NodeCondition, NodeSample
from taugrid.health.wire import ConditionState, NodeState, NodeValidation, condition_key
from taugrid.health.xid import classify

SEVERITY = {
    "GpuXidError": 0,  # from the XID table, per event
    "GpuEccUncorrectable": 3,
    "GpuRemappedRowsFailure": 4,
    "GpuRemappedRowsPending": 2,
    "GpuThermal": 2,
    "GpuMissing": 4,
    "PcieReplays": 1,
    "NvmlUnavailable": 3,
    "GpuValidationFailed": 4,
    "GpuNvlinkError": 3,  # F12: replay/recovery counters rising (XID 74 comes as GpuXidError)
    "GpuNvlinkDown": 3,  # F13: a link of an NVLink GPU not active
    "IbPortDown": 3,  # F21: an InfiniBand port not ACTIVE for longer than ib_down_grace_s
    "IbRateDegraded": 2,  # F22: an active port below the rate it had
    "IbLinkErrors": 3,  # F24: link_downed / link integrity / buffer overrun rising, or symbol errors > 120/h
    # Raised by vendor events (GpuSample.events, health.vendorcodes), each with its event's severity:
    "GpuFatalError": 0,  # a fatal RAS record (AMD CPER) or a critical event (Gaudi)
    "GpuRmaRequired": 0,  # the GPU needs replacing (AMD bad pages past the threshold or unreservable)
    "GpuVendorEvent": 0,  # a vendor code the table does not know, or one worth an alert only
}
LATCHED = frozenset({"GpuXidError", "GpuEccUncorrectable", "GpuValidationFailed", "GpuNvlinkError", "IbLinkErrors",
                     "GpuFatalError", "GpuRmaRequired", "GpuVendorEvent"})
IB_FATAL_COUNTERS = ("link_downed", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


@dataclass(frozen=True)
class Policy:
    thermal_raise_c: int = 90
    thermal_clear_c: int = 85
    clean_samples_to_release: int = 3
    max_cordoned: int = 3
    max_cordoned_fraction: float = 0.2
    min_cordon_budget: int = 1
    pcie_replays_per_min: float = 31.0  # DCGM's Gen5 x16 allowance (gpu-health.md §2.1)
    pcie_window_s: float = 60.0
    expected_gpus: int | None = None  # None: the highest count this node ever reported
    repair_budget: int = 3  # repair steps per node before replace-node (a passed validation starts it over)
    repair_retry_s: float = 60.0  # after a step, how long clean samples get to show before the next step
    ib_down_grace_s: float = 240.0  # a port down this long is a drop, not a flap (gpud: 4 min)
    ib_symbol_errors_per_hour: float = 120.0  # IBTA BER 1e-12 (NVSentinel)


@dataclass(frozen=True)
class Fleet:
    """What the guard needs to know about every node the monitor tracks."""

    total: int
    cordoned: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Signal:
    type: str
    gpu: int | None
    active: bool | None  # None: unknown this sample, keep what we had
    reason: str = ""
    message: str = ""
    severity: int = 0


@dataclass
class Evaluation:
    state: NodeState
    transitions: list[NodeCondition] = field(default_factory=list)
    clean: bool = True
    released: bool = False  # validation passed: latched conditions cleared, a cordon may be lifted

    @property
    def severity(self) -> int:
        return max((c.severity for c in self.state.conditions.values() if c.status == "True"), default=0)


@dataclass(frozen=True)
class Action:
    kind: str  # cordon | uncordon
    reason: str
    drain: bool = False
    seq: int = 0


@dataclass
class Plan:
    state: NodeState
    transitions: list[NodeCondition]
    actions: list[Action]


def verdict_for(severity: int) -> str:
    return "healthy" if severity == 0 else "unhealthy" if severity >= 3 else "degraded"


def _level_signals(sample: NodeSample, st: NodeState, policy: Policy) -> list[Signal]:
    out: list[Signal] = []
    seen = sample.gpu_source != "none"
    expected = policy.expected_gpus if policy.expected_gpus is not None else st.expected_gpus
    if seen and policy.expected_gpus is None:
        expected = max(expected, len(sample.gpus))
        st.expected_gpus = expected
    elif policy.expected_gpus is not None:
        st.expected_gpus = expected
    st.gpu_source = sample.gpu_source
    if sample.gpu_vendor:  # a node whose GPUs stopped answering is still that vendor's
        st.gpu_vendor, st.gpu_model = sample.gpu_vendor, sample.gpu_model
    out.append(Signal("NvmlUnavailable", None, not seen and expected > 0, "NvmlUnavailable",
                      f"expected {expected} GPU(s) but none are readable: {sample.message}",
                      SEVERITY["NvmlUnavailable"]))
    if seen:
        present = {g.index for g in sample.gpus}
        missing = sorted(set(range(expected)) - present)
        out.append(Signal("GpuMissing", None, len(sample.gpus) < expected, "GpuCountBelowExpected",
                          f"{len(sample.gpus)} of {expected} GPUs visible; missing index(es) {missing}"
                          + (f"; {sample.message}" if sample.message else ""), SEVERITY["GpuMissing"]))
    for g in sample.gpus:
        out.append(Signal("GpuRemappedRowsFailure", g.index, g.remapped_rows_failure, "RowRemapFailure",
                          f"GPU {g.index}: row remapping failed; drain, reboot, replace on recurrence",
                          SEVERITY["GpuRemappedRowsFailure"]))
        out.append(Signal("GpuRemappedRowsPending", g.index, g.remapped_rows_pending, "RowRemapPending",
                          f"GPU {g.index}: remapped rows pending; reset the GPU when idle",
                          SEVERITY["GpuRemappedRowsPending"]))
        hot: bool | None = None
        if g.temperature_c is not None:
            if g.temperature_c >= policy.thermal_raise_c:
                hot = True
            elif g.temperature_c <= policy.thermal_clear_c:
                hot = False  # between the two thresholds: keep the previous status (hysteresis)
        out.append(Signal("GpuThermal", g.index, hot, "TemperatureHigh",
                          f"GPU {g.index}: {g.temperature_c} °C (raise at {policy.thermal_raise_c}, "
                          f"clear at {policy.thermal_clear_c})", SEVERITY["GpuThermal"]))
        out.append(_pcie_signal(g.index, g.pcie_replay_count, sample.time, st, policy))
        down: bool | None = bool(g.nvlink_down) if g.nvlink_links else None  # no NVLink: unknown, never down
        out.append(Signal("GpuNvlinkDown", g.index, down, "NvlinkInactive",
                          f"GPU {g.index}: NVLink link(s) {g.nvlink_down} of {g.nvlink_links} not active; drain, "
                          "reset, check the links", SEVERITY["GpuNvlinkDown"]))
    out += _ib_level_signals(sample, st, policy)
    return out


def _port_key(hca: str, port: int) -> str:
    return f"{hca}/{port}"


def _ib_ports(sample: NodeSample) -> list[tuple[str, IbPort]]:
    """The InfiniBand ports the rules watch (RoCE/Ethernet ports are left out: they may be management NICs)."""
    return [(_port_key(p.hca, p.port), p) for p in sample.ib_ports if p.link_layer in ("InfiniBand", "")]


def _ib_level_signals(sample: NodeSample, st: NodeState, policy: Policy) -> list[Signal]:
    if not sample.ib_ports:
        return []
    now = sample.time
    dropped, slow = [], []
    for key, p in _ib_ports(sample):
        if p.state and p.state.upper() != "ACTIVE":
            since = st.ib_down_since.setdefault(key, now)
            if now - since >= policy.ib_down_grace_s:
                dropped.append(f"{key} {p.state}/{p.phys_state or '?'} for {now - since:.0f}s")
        else:
            st.ib_down_since.pop(key, None)
            if p.rate_gbps is not None:
                best = max(st.ib_rate_max.get(key, 0.0), p.rate_gbps)
                st.ib_rate_max[key] = best
                if p.rate_gbps < best:
                    slow.append(f"{key} at {p.rate_gbps:g} Gb/s (was {best:g})")
    return [Signal("IbPortDown", None, bool(dropped), "IbPortDown",
                   "InfiniBand port(s) down: " + "; ".join(dropped) + "; drain (multi-node work first)",
                   SEVERITY["IbPortDown"]),
            Signal("IbRateDegraded", None, bool(slow), "IbRateDegraded",
                   "InfiniBand port(s) below their rate: " + "; ".join(slow), SEVERITY["IbRateDegraded"])]


def _pcie_signal(gpu: int, count: int | None, now: float, st: NodeState, policy: Policy) -> Signal:
    """Replay-counter rate over a window of at least ``pcie_window_s``, so one 5 s sample cannot trip it."""
    key = str(gpu)
    base = st.pcie_base.get(key)
    active: bool | None = None
    message = ""
    if count is not None:
        if base is None or count < base[1]:  # first sight, or the counter was reset
            st.pcie_base[key] = [now, float(count)]
        elif now - base[0] >= policy.pcie_window_s:
            rate = (count - base[1]) * 60.0 / (now - base[0])
            active = rate > policy.pcie_replays_per_min
            message = (f"GPU {gpu}: PCIe replay counter rising {rate:.1f}/min "
                       f"(limit {policy.pcie_replays_per_min:g}/min)")
            st.pcie_base[key] = [now, float(count)]
    return Signal("PcieReplays", gpu, active, "PcieReplayRateHigh", message, SEVERITY["PcieReplays"])


def _latched_signals(sample: NodeSample, st: NodeState, policy: Policy) -> list[Signal]:
    out: list[Signal] = []
    for g in sample.gpus:
        worst = max((classify(x) for x in set(g.xid_events)), key=lambda i: i.severity, default=None)
        if worst is not None and worst.severity >= 1:
            codes = ", ".join(str(x) for x in sorted(set(g.xid_events)))
            out.append(Signal("GpuXidError", g.index, True, f"Xid{worst.code}",
                              f"GPU {g.index}: XID {codes}; worst {worst.code} ({worst.mnemonic}, NVIDIA "
                              f"bucket {worst.bucket}): {worst.action}", worst.severity))
        for event in g.events:  # AMD's and Gaudi's codes, already mapped to a condition and a severity
            if event.severity >= 1 and event.condition:
                out.append(Signal(event.condition, g.index, True, event.code, event.message, event.severity))
        if g.ecc_volatile_uncorrected:
            out.append(Signal("GpuEccUncorrectable", g.index, True, "VolatileUncorrectedEcc",
                              f"GPU {g.index}: {g.ecc_volatile_uncorrected} uncorrected ECC error(s) since "
                              "the last reset; drain, reset, validate", SEVERITY["GpuEccUncorrectable"]))
        if g.ecc_aggregate_uncorrected is not None:
            before = st.ecc_aggregate.get(str(g.index))
            st.ecc_aggregate[str(g.index)] = g.ecc_aggregate_uncorrected
            # The lifetime count is history; only growth we watched happen is a fresh fault.
            if before is not None and g.ecc_aggregate_uncorrected > before:
                out.append(Signal("GpuEccUncorrectable", g.index, True, "AggregateUncorrectedEccRising",
                                  f"GPU {g.index}: lifetime uncorrected ECC count rose {before} → "
                                  f"{g.ecc_aggregate_uncorrected}", SEVERITY["GpuEccUncorrectable"]))
        if g.nvlink_errors is not None:
            before_nv = st.nvlink_base.get(str(g.index))
            st.nvlink_base[str(g.index)] = dict(g.nvlink_errors)
            rising = [f"{k} +{g.nvlink_errors.get(k, 0) - before_nv.get(k, 0)}" for k in ("replay", "recovery")
                      if before_nv is not None and g.nvlink_errors.get(k, 0) > before_nv.get(k, 0)]
            if rising:
                out.append(Signal("GpuNvlinkError", g.index, True, "NvlinkErrorsRising",
                                  f"GPU {g.index}: NVLink {', '.join(rising)}; drain, reset, check the links",
                                  SEVERITY["GpuNvlinkError"]))
    out += _ib_error_signals(sample, st, policy)
    return out


def _ib_error_signals(sample: NodeSample, st: NodeState, policy: Policy) -> list[Signal]:
    found: list[str] = []
    for key, p in _ib_ports(sample):
        before = st.ib_counters.get(key)
        st.ib_counters[key] = {k: p.counters[k] for k in IB_FATAL_COUNTERS if k in p.counters}
        if before is not None:
            found += [f"{key} {k} +{p.counters[k] - before[k]}" for k in IB_FATAL_COUNTERS
                      if k in p.counters and k in before and p.counters[k] > before[k]]
        symbols = p.counters.get("symbol_error")
        if symbols is None:
            continue
        base = st.ib_symbol_base.get(key)
        if base is None or symbols < base[1] or sample.time - base[0] >= 3600:  # first sight, reset, new hour
            st.ib_symbol_base[key] = [sample.time, float(symbols)]
        elif symbols - base[1] > policy.ib_symbol_errors_per_hour:
            found.append(f"{key} symbol_error +{symbols - base[1]:.0f} within the hour "
                         f"(limit {policy.ib_symbol_errors_per_hour:g})")
            st.ib_symbol_base[key] = [sample.time, float(symbols)]
    if not found:
        return []
    return [Signal("IbLinkErrors", None, True, "IbLinkErrors", "InfiniBand link errors: " + "; ".join(found) +
                   "; drain, check cable and optics", SEVERITY["IbLinkErrors"])]


def _transition(st: NodeState, sig: Signal, status: str, now: float) -> NodeCondition:
    key = condition_key(sig.type, sig.gpu)
    cond = st.conditions.get(key) or ConditionState(type=sig.type, gpu=sig.gpu)
    cond.status, cond.since, cond.transitions = status, now, cond.transitions + 1
    if status == "True":
        cond.reason, cond.message, cond.severity = sig.reason, sig.message, sig.severity
        cond.latched = sig.type in LATCHED
    else:
        cond.message = sig.message or f"cleared: {cond.reason}"
    st.conditions[key] = cond
    return NodeCondition(node=st.node, type=sig.type, status=status, reason=cond.reason, message=cond.message,
                         gpu=sig.gpu, time=now)


def evaluate(prev: NodeState | None, sample: NodeSample, *, policy: Policy,
             validation: NodeValidation | None = None) -> Evaluation:
    """Fold one sample into the node's state. ``prev`` is not modified."""
    st = (msgspec.json.decode(msgspec.json.encode(prev), type=NodeState) if prev is not None
          else NodeState(node=sample.node))
    now = sample.time
    st.last_sample, st.heartbeat_s = now, sample.heartbeat_s
    ev = Evaluation(state=st)
    for sig in _level_signals(sample, st, policy):
        cond = st.conditions.get(condition_key(sig.type, sig.gpu))
        is_true = cond is not None and cond.status == "True"
        if sig.active is True and not is_true:
            ev.transitions.append(_transition(st, sig, "True", now))
        elif sig.active is False and is_true:
            ev.transitions.append(_transition(st, sig, "False", now))
    latched = _latched_signals(sample, st, policy)
    for sig in latched:
        cond = st.conditions.get(condition_key(sig.type, sig.gpu))
        if cond is None or cond.status != "True" or sig.severity > cond.severity:
            ev.transitions.append(_transition(st, sig, "True", now))
    ev.clean = not latched and not any(
        c.status == "True" and not c.latched for c in st.conditions.values())
    _revalidate(ev, policy, validation, now)
    st.verdict = verdict_for(ev.severity)
    return ev


def _revalidate(ev: Evaluation, policy: Policy, validation: NodeValidation | None, now: float) -> None:
    st = ev.state
    if not ev.clean:
        st.clean_samples, st.validation_wanted_since = 0, 0.0
        return
    st.clean_samples += 1
    held = st.cordoned or any(c.status == "True" and c.latched for c in st.conditions.values())
    if not held or st.clean_samples < policy.clean_samples_to_release:
        return
    if not st.validation_wanted_since:
        st.validation_wanted_since = now  # the agent sees this in node_state and runs validate_node
        return
    if validation is None or validation.time < st.validation_wanted_since:
        return
    st.last_validation = validation.detail
    st.validation_wanted_since = 0.0
    if validation.ok:
        for cond in list(st.conditions.values()):
            if cond.status == "True" and cond.latched:
                cleared = Signal(cond.type, cond.gpu, False,
                                 message=f"cleared after validation: {validation.detail}")
                ev.transitions.append(_transition(st, cleared, "False", now))
        ev.released = True
    else:
        st.clean_samples = 0
        failed = Signal("GpuValidationFailed", None, True, "ValidationFailed",
                        f"validation failed: {validation.detail}; stays cordoned",
                        SEVERITY["GpuValidationFailed"])
        ev.transitions.append(_transition(st, failed, "True", now))


def cordon_budget(total: int, policy: Policy) -> int:
    by_fraction = math.floor(policy.max_cordoned_fraction * total)
    return min(policy.max_cordoned, max(policy.min_cordon_budget, by_fraction))


def guard(fleet: Fleet, node: str, policy: Policy) -> tuple[bool, str]:
    """May ``node`` be cordoned now without exceeding the blast-radius budget?"""
    others = fleet.cordoned - {node}
    total = max(fleet.total, len(others) + 1)
    budget = cordon_budget(total, policy)
    if len(others) + 1 > budget:
        return False, (f"blast-radius guard: {len(others)} of {total} node(s) already cordoned, budget "
                       f"{budget} (at most {policy.max_cordoned} and {policy.max_cordoned_fraction:.0%})")
    return True, ""


def wants_cordon(ev: Evaluation) -> bool:
    return ev.severity >= 2 and not ev.state.cordoned


def plan(ev: Evaluation, *, policy: Policy, fleet: Fleet | None = None) -> Plan:
    """Turn an evaluation into cordon/uncordon actions. ``fleet`` is needed only when ``wants_cordon``."""
    st = ev.state
    actions: list[Action] = []
    sev = ev.severity
    faults = sorted(k for k, c in st.conditions.items() if c.status == "True")
    reason = "; ".join(st.conditions[k].message for k in faults)
    if ev.released and st.cordoned and sev == 0:
        actions.append(Action("uncordon", f"validated after {st.clean_samples} clean samples: "
                                          f"{st.last_validation}", seq=st.cordon_seq))
        st.cordoned, st.drained, st.cordon_reason, st.guard_blocked = False, False, "", ""
    elif sev >= 2 and not st.cordoned:
        ok, why = guard(fleet or Fleet(total=1), st.node, policy)
        if ok:
            st.cordon_seq += 1
            st.cordoned, st.drained, st.guard_blocked = True, sev >= 3, ""
            st.cordon_reason, st.cordon_time = reason, st.last_sample
            actions.append(Action("cordon", reason, drain=sev >= 3, seq=st.cordon_seq))
        else:
            st.guard_blocked = why
    elif sev >= 3 and st.cordoned and not st.drained:
        st.drained = True
        actions.append(Action("cordon", reason, drain=True, seq=st.cordon_seq))
    return Plan(state=st, transitions=ev.transitions, actions=actions)


def faults(state: NodeState) -> list[ConditionState]:
    return [c for c in state.conditions.values() if c.status == "True"]
