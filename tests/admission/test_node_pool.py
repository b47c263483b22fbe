"""Cordoned nodes and excluded nodes in the engine's placement: nothing new lands there; an uncordon is a
capacity event for parked heads."""

from __future__ import annotations

from taugrid.core.admission import GPU, Engine, GpuDevice, Node, PodSet, Workload
from tests.admission.adm_build import cq


def two_nodes() -> Engine:
    nodes = [Node(n, (GpuDevice(0, 80000),), cpu=8, memory=1 << 36) for n in ("gpu-a", "gpu-b")]
    return Engine([cq("q", gpu=4)], nodes=nodes)


def one_gpu(name: str, *, exclude: frozenset[str] = frozenset()) -> Workload:
    return Workload(name, "q", (PodSet("main", 1, {GPU: 1}, excluded_nodes=exclude),))


def test_a_workload_excluding_a_node_is_placed_on_another() -> None:
    engine = two_nodes()
    engine.submit(one_gpu("retry", exclude=frozenset({"gpu-a"})), 0)
    [adm] = engine.cycle(0).admitted
    assert [p.node for p in adm.placements] == ["gpu-b"]


def test_a_cordoned_node_gets_nothing_new_and_an_uncordon_unparks_the_head() -> None:
    engine = two_nodes()
    engine.set_schedulable("gpu-a", False)
    engine.submit(one_gpu("first"), 0)
    [adm] = engine.cycle(0).admitted
    assert adm.placements[0].node == "gpu-b"
    engine.submit(one_gpu("second"), 1)
    assert engine.cycle(1).admitted == []
    pending = engine.pending_info("second")
    assert pending is not None and "none of 1 eligible node(s)" in pending.message
    engine.set_schedulable("gpu-a", True)
    [adm] = engine.cycle(2).admitted
    assert (adm.workload, adm.placements[0].node) == ("second", "gpu-a")


def test_what_runs_on_a_node_keeps_its_place_when_it_is_cordoned() -> None:
    engine = two_nodes()
    engine.submit(one_gpu("running"), 0)
    [adm] = engine.cycle(0).admitted
    engine.set_schedulable(adm.placements[0].node, False)
    assert engine.is_admitted("running")
    engine.finish("running", 1)
    engine.submit(one_gpu("next"), 2)
    [nxt] = engine.cycle(2).admitted
    assert nxt.placements[0].node != adm.placements[0].node
