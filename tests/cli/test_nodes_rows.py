"""``tau nodes`` rows (pure): a drained node's repair steps are shown with the rest of its health."""

from __future__ import annotations

from taugrid.client.summaries import node_rows
from taugrid.core.states import RunRecord
from taugrid.health.wire import ConditionState, NodeState


def test_a_drained_node_shows_its_repair_and_the_runs_still_on_it() -> None:
    st = NodeState(node="gpu-a", last_sample=99.0, expected_gpus=1, verdict="unhealthy", cordoned=True, drained=True,
                   cordon_reason="XID 79", cordon_time=90.0, repairs=1, repair_wanted="node-reboot",
                   last_repair="")
    st.conditions["GpuXidError/0"] = ConditionState(type="GpuXidError", gpu=0, status="True", reason="Xid79",
                                                    message="GPU 0: XID 79")
    runs = [RunRecord(run_id="r1", workspace="w", state="running", node="gpu-a"),
            RunRecord(run_id="r2", workspace="w", state="succeeded", node="gpu-a")]
    [row] = node_rows([st], runs, now=100.0)
    assert row["repair"] == {"wanted": "node-reboot", "steps": 1, "last": ""}
    assert (row["cordoned_for_s"], row["conditions"], row["runs"]) == (
        10.0, {"GpuXidError/0": "Xid79: GPU 0: XID 79"}, ["r1"])


def test_a_multi_node_run_is_on_each_of_its_pods_nodes() -> None:
    from taugrid.core.states import PodView

    states = [NodeState(node=n, last_sample=99.0, expected_gpus=2, verdict="healthy") for n in ("a1", "b1", "b2")]
    run = RunRecord(run_id="r1", workspace="w", state="running", node="b1",
                    pods=[PodView(name="r1-0", node="b1"), PodView(name="r1-1", node="b2")])
    assert {row["node"]: row["runs"] for row in node_rows(states, [run], now=100.0)} == {
        "a1": [], "b1": ["r1"], "b2": ["r1"]}


def test_a_local_pool_node_shows_its_topology_domain_from_the_platform() -> None:
    from taugrid.client.summaries import pool_domains
    from tests.local.test_tas_pool import RACK, TAS_PLATFORM

    domains = pool_domains(TAS_PLATFORM)
    assert domains == {"a1": {RACK: "r1"}, "a2": {RACK: "r1"}, "b1": {RACK: "r2"}, "b2": {RACK: "r2"}}
    states = [NodeState(node=n, last_sample=99.0, expected_gpus=2, verdict="healthy") for n in ("b1", "machine")]
    assert [(row["node"], row["domain"]) for row in node_rows(states, [], now=100.0, domains=domains)] == [
        ("b1", {RACK: "r2"}), ("machine", {})]
    assert pool_domains(TAS_PLATFORM.replace("topologies:", "unused:")) == {}  # does not load: no domains
    assert pool_domains("resource_flavors: [{name: default}]\n") == {}  # no topologies


def test_each_node_shows_its_gpus_vendor_and_model() -> None:
    from taugrid.client.summaries import gpu_kind

    states = [NodeState(node="mi-0", expected_gpus=8, gpu_vendor="amd", gpu_model="amd-mi300x"),
              NodeState(node="hl-0", expected_gpus=8, gpu_vendor="intel-gaudi", gpu_model="HL-325L"),
              NodeState(node="cpu-0")]
    rows = node_rows(states, [], now=100.0)
    assert [(r["node"], r["gpu_vendor"], r["gpu_model"], gpu_kind(r)) for r in rows] == [
        ("cpu-0", "", "", "-"), ("hl-0", "intel-gaudi", "HL-325L", "intel-gaudi/HL-325L"),
        ("mi-0", "amd", "amd-mi300x", "amd/amd-mi300x")]
