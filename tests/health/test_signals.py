"""NVLink and InfiniBand signals: sysfs ports read from a fake tree in tmp, NVLink through the NVML stand-in, and
the catalogue's rules over them (gpu-health.md §7: F12, F13, F21, F22, F24)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from taugrid.core.contracts import GpuSample, IbPort, NodeSample
from taugrid.health.ib import read_ports
from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import DeclaredProbe, validate_node
from taugrid.health.rules import Policy, evaluate, plan
from taugrid.health.wire import NodeState
from tests.health.test_probe import fake_nvml

POLICY = Policy(ib_down_grace_s=240)


def port_tree(root: Path, hca: str, port: int, *, state: str = "4: ACTIVE", phys: str = "5: LinkUp",
              rate: str = "400 Gb/sec (4X NDR)", layer: str = "InfiniBand", **counters: int) -> None:
    d = root / hca / "ports" / str(port)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "hw_counters").mkdir(exist_ok=True)
    for name, text in (("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", layer)):
        (d / name).write_text(text + "\n")
    for name, value in {"symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0, **counters}.items():
        (d / ("hw_counters" if name == "rnr_nak_retry_err" else "counters") / name).write_text(f"{value}\n")


def test_sysfs_ports_are_read_and_an_absent_tree_is_no_ports(tmp_path: Path) -> None:
    port_tree(tmp_path, "mlx5_0", 1, rnr_nak_retry_err=7)
    port_tree(tmp_path, "mlx5_1", 1, state="1: DOWN", phys="3: Disabled", rate="garbage")
    (tmp_path / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error").write_text("n/a\n")
    a, b = read_ports(tmp_path)
    counters = {"link_downed": 0, "port_rcv_errors": 0, "rnr_nak_retry_err": 7, "symbol_error": 0}
    assert a == IbPort(hca="mlx5_0", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0,
                       link_layer="InfiniBand", counters=counters)
    assert (b.state, b.phys_state, b.rate_gbps) == ("DOWN", "Disabled", None)
    assert "symbol_error" not in b.counters  # unreadable: unknown, not 0
    assert read_ports(tmp_path / "missing") == []


def node(t: float, ports: list[IbPort] | None = None, gpus: list[GpuSample] | None = None) -> NodeSample:
    return NodeSample(node="n1", time=t, cpus=8, memory_bytes=1 << 34, gpus=gpus or [], gpu_source="declared",
                      ib_ports=ports or [])


def fold(samples: list[NodeSample]) -> tuple[NodeState, list[Any]]:
    st: NodeState | None = None
    transitions: list[Any] = []
    for s in samples:
        ev = evaluate(st, s, policy=POLICY)
        transitions += [(s.time, c.type, c.status) for c in ev.transitions]
        st = plan(ev, policy=POLICY).state
    assert st is not None
    return st, transitions


def port(state: str = "ACTIVE", rate: float = 400.0, layer: str = "InfiniBand", **counters: int) -> IbPort:
    return IbPort(hca="mlx5_0", port=1, state=state, phys_state="LinkUp", rate_gbps=rate, link_layer=layer,
                  counters={"symbol_error": 0, "link_downed": 0, **counters})


def test_an_ib_port_down_for_four_minutes_drains_a_shorter_drop_does_not() -> None:
    st, tr = fold([node(0, [port()]), node(10, [port("DOWN")]), node(200, [port("DOWN")]), node(230, [port()])])
    assert not [t for t in tr if t[1] == "IbPortDown"]  # 220 s down, then back: a flap, not a drop
    st, tr = fold([node(0, [port()]), node(10, [port("DOWN")]), node(260, [port("DOWN")])])
    assert (260, "IbPortDown", "True") in tr and st.cordoned and st.drained


def test_a_rate_below_what_the_port_had_cordons_without_draining_and_clears_when_restored() -> None:
    st, tr = fold([node(0, [port(rate=400)]), node(5, [port(rate=200)]), node(10, [port(rate=400)])])
    assert [t for t in tr if t[1] == "IbRateDegraded"] == [(5, "IbRateDegraded", "True"),
                                                          (10, "IbRateDegraded", "False")]


def test_rising_link_errors_or_a_symbol_error_burst_raise_ib_link_errors_and_ethernet_ports_are_ignored() -> None:
    _, tr = fold([node(0, [port()]), node(5, [port(link_downed=1)])])
    assert (5, "IbLinkErrors", "True") in tr
    _, tr = fold([node(0, [port()]), node(60, [port(symbol_error=100)]), node(120, [port(symbol_error=150)])])
    assert [t for t in tr if t[1] == "IbLinkErrors"] == [(120, "IbLinkErrors", "True")]
    _, tr = fold([node(0, [port(layer="Ethernet")]), node(500, [port("DOWN", layer="Ethernet", link_downed=3)]),
                  node(900, [port("DOWN", layer="Ethernet", link_downed=5)])])
    assert tr == []  # a RoCE/management port is not a compute fabric port


def test_nvlink_down_and_rising_replays_are_faults_a_pcie_card_without_nvlink_is_not() -> None:
    probe = DeclaredProbe(2)
    probe.inject_nvlink(0, links=18)
    first = probe.sample("n1")
    probe.inject_nvlink(0, links=18, down=[3], replay=5)
    second = probe.sample("n1")
    st, tr = fold([node(0, gpus=first.gpus)])
    assert not [t for t in tr if t[1].startswith("GpuNvlink")]
    ev = evaluate(st, node(5, gpus=second.gpus), policy=POLICY)
    nvlink = sorted((c.type, c.gpu, c.status) for c in ev.transitions if c.type.startswith("GpuNvlink"))
    assert nvlink == [("GpuNvlinkDown", 0, "True"), ("GpuNvlinkError", 0, "True")]  # GPU 1 has no NVLink
    assert "NVLink replay +5" in ev.state.conditions["GpuNvlinkError/0"].message
    assert validate_node(probe, expected_gpus=2) == (False, "GPU 0 NVLink link(s) [3] not active")


def test_nvml_reads_nvlink_state_and_counters_and_not_supported_means_no_nvlink() -> None:
    nvml = fake_nvml(count=2)
    nvml.NVML_NVLINK_MAX_LINKS, nvml.NVML_FEATURE_ENABLED = 4, 1

    def state(h: int, link: int) -> int:
        if h == 1:
            raise nvml.NVMLError_NotSupported("Not Supported")  # a PCIe card
        return 0 if link == 2 else 1

    nvml.nvmlDeviceGetNvLinkState = state
    nvml.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, counter: {0: 2, 1: 1}.get(counter, 0)
    g0, g1 = NvmlProbe(nvml=nvml).sample("n1").gpus
    assert (g0.nvlink_links, g0.nvlink_down) == (4, [2])
    assert g0.nvlink_errors == {"replay": 8, "recovery": 4, "crc_flit": 0, "crc_data": 0}
    assert (g1.nvlink_links, g1.nvlink_down, g1.nvlink_errors) == (None, [], None)
