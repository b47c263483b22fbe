"""``health.change.Publisher``: which samples a node's agent publishes, decision by decision (pure; the bus side is
``test_heartbeat.py``). Rules that measure across samples keep getting every sample while their inputs move."""

from __future__ import annotations

import msgspec

from taugrid.core.contracts import GpuSample, IbPort, NodeSample
from taugrid.health.change import Publisher, Thermal, phase
from taugrid.health.wire import ConditionState, NodeState

NODE, HEARTBEAT = "gpu-7", 60.0


def gpu(**fields: object) -> GpuSample:
    base = GpuSample(index=0, memory_total_mb=81920, temperature_c=40, utilization_pct=0, ecc_volatile_uncorrected=0,
                     ecc_aggregate_uncorrected=0, remapped_rows_pending=False, remapped_rows_failure=False,
                     pcie_replay_count=0)
    return msgspec.structs.replace(base, **fields)


def sample(t: float, *, gpus: list[GpuSample] | None = None, ports: list[IbPort] | None = None) -> NodeSample:
    return NodeSample(node=NODE, time=t, cpus=8, memory_bytes=1 << 30, gpus=gpus if gpus is not None else [gpu()],
                      gpu_source="declared", ib_ports=ports or [])


def decisions(pub: Publisher, samples: list[NodeSample], state: NodeState | None = None) -> list[str]:
    out = []
    for s in samples:
        why = pub.why(s, state)
        if why:
            pub.published(s)
        out.append(why)
    return out


def test_every_sample_is_published_without_a_heartbeat() -> None:
    assert decisions(Publisher(NODE), [sample(t) for t in (0, 5, 10)]) == ["every-sample"] * 3


def test_readings_no_rule_reads_publish_nothing_until_the_heartbeat() -> None:
    pub = Publisher(NODE, heartbeat_s=HEARTBEAT)
    first_beat = phase(NODE, HEARTBEAT)
    times = [5.0 * i for i in range(40)]
    moving = [sample(t, gpus=[gpu(utilization_pct=i % 100, memory_used_mb=i, power_w=100.0 + i,
                                  temperature_c=40 + i % 7, throttle_reasons=["sw_power_cap"] * (i % 2))])
              for i, t in enumerate(times)]
    got = decisions(pub, moving)
    beats = [t for t, why in zip(times, got, strict=True) if why]
    assert got[0] == "first" and set(got[1:]) <= {"", "heartbeat"}
    due = next(t for t in times if t >= first_beat)
    assert beats == [0.0, due, *[t for t in times if t > due and (t - due) % HEARTBEAT == 0]]


def test_a_temperature_is_judged_by_its_band() -> None:
    pub = Publisher(NODE, heartbeat_s=HEARTBEAT, thermal=Thermal(90, 85))
    temps = [40, 84, 86, 89, 90, 95, 88, 85, 60]
    got = decisions(pub, [sample(5.0 * i, gpus=[gpu(temperature_c=c)]) for i, c in enumerate(temps)])
    # cool → between (86) → hot (90) → between (88) → cool (85): each band change, nothing inside a band
    assert got == ["first", "", "changed", "", "changed", "", "changed", "changed", ""]


def test_events_and_fault_counters_are_published_at_once() -> None:
    pub = Publisher(NODE, heartbeat_s=HEARTBEAT)
    def nvlink(replay: int, crc_flit: int) -> list[GpuSample]:
        return [gpu(nvlink_links=18, nvlink_errors={"replay": replay, "recovery": 0, "crc_flit": crc_flit})]

    ecc = [gpu(ecc_aggregate_uncorrected=1)]
    got = decisions(pub, [sample(0), sample(5, gpus=[gpu(xid_events=[79])]), sample(10), sample(15, gpus=ecc),
                          sample(20, gpus=ecc), sample(25, gpus=nvlink(0, 5)), sample(30, gpus=nvlink(0, 9)),
                          sample(35, gpus=nvlink(1, 9)), sample(40, gpus=[])])
    # crc_flit is no rule's input: it moving alone is not a change
    assert got == ["first", "events", "", "changed", "", "changed", "", "changed", "changed"]


def test_a_pcie_replay_counter_moving_keeps_every_sample_coming_for_a_rate_window() -> None:
    pub = Publisher(NODE, heartbeat_s=1000.0, rate_window_s=60.0)
    counts = [0, 0, 40, 40] + [40] * 12 + [40]
    got = decisions(pub, [sample(5.0 * i, gpus=[gpu(pcie_replay_count=c)]) for i, c in enumerate(counts)])
    # moved at t=10 (published, a change); then every sample while t - 10 < 60, i.e. up to t=65; quiet from t=70
    assert got[:3] == ["first", "", "changed"]
    assert got[3:14] == ["rate-moving"] * 11 and got[14:] == ["", "", ""]


def test_a_port_down_and_a_held_node_are_published_every_sample() -> None:
    up = IbPort(hca="mlx5_0", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, link_layer="InfiniBand",
                counters={"port_rcv_data": 1})
    down = msgspec.structs.replace(up, state="DOWN", phys_state="Polling")
    pub = Publisher(NODE, heartbeat_s=HEARTBEAT)
    got = decisions(pub, [sample(0, ports=[up]), sample(5, ports=[msgspec.structs.replace(up, counters={
        "port_rcv_data": 9})]), sample(10, ports=[down]), sample(15, ports=[down]), sample(20, ports=[down]),
        sample(25, ports=[up]), sample(30, ports=[up])])
    assert got == ["first", "", "changed", "ib-down", "ib-down", "changed", ""]

    cordoned = NodeState(node=NODE, cordoned=True)
    raised = NodeState(node=NODE, conditions={"GpuThermal/0": ConditionState(type="GpuThermal", gpu=0, status="True")})
    asked = NodeState(node=NODE, validation_wanted_since=3.0)
    cleared = NodeState(node=NODE, conditions={"GpuThermal/0": ConditionState(type="GpuThermal", gpu=0,
                                                                              status="False")})
    assert [pub.why(sample(35 + i, ports=[up]), st)
            for i, st in enumerate((cordoned, raised, asked, cleared, None))] == [
        "held", "held", "held", "", ""]
