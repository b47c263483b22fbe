"""Topology aware scheduling through the whole engine: racks and blocks of a multi-node pool, rank order,
cordoned and not-ready nodes, flavor fallback, refusals. Kueue's own tables are in test_kueue_tas_*."""

from __future__ import annotations

import pytest

from taugrid.core.admission import (
    GPU,
    ClusterQueue,
    Engine,
    FlavorQuotas,
    GpuDevice,
    Node,
    PodSet,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
    TopologyAssignment,
    TopologyRequest,
    Workload,
)
from taugrid.core.admission.results import TOPOLOGY_PLACEMENT_FAILED
from taugrid.core.errors import PermanentError

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
TOPO = Topology("dc", (BLOCK, RACK, HOST))


def pool(*, gpus: int = 2) -> list[Node]:
    """Two blocks of two racks of two nodes: b1-r1-n1 ... b2-r2-n8, each with ``gpus`` GPUs."""
    nodes = []
    for i in range(8):
        b, r = f"b{i // 4 + 1}", f"r{i // 2 + 1}"
        name = f"{b}-{r}-n{i + 1}"
        nodes.append(Node(name, tuple(GpuDevice(g) for g in range(gpus)), cpu=8, memory=64e9,
                          labels={BLOCK: b, RACK: r, HOST: name}))
    return nodes


def engine(nodes: list[Node], *, flavors: tuple[ResourceFlavor, ...] = (ResourceFlavor("tas", topology_name="dc"),),
           topologies: tuple[Topology, ...] = (TOPO,)) -> Engine:
    quotas = tuple(FlavorQuotas(f.name, {GPU: ResourceQuota(64), "cpu": ResourceQuota(256)}) for f in flavors)
    return Engine([ClusterQueue("cq", (ResourceGroup((GPU, "cpu"), quotas),))], flavors=flavors, nodes=nodes,
                  topologies=topologies)


def job(name: str, count: int, tr: TopologyRequest | None, *, gpus: int = 1) -> Workload:
    return Workload(name, "cq", (PodSet("workers", count, {GPU: gpus, "cpu": 1}, topology_request=tr),))


def test_required_rack_puts_every_pod_in_one_rack_and_ranks_fill_a_node_before_the_next() -> None:
    e = engine(pool())
    e.submit(job("train", 4, TopologyRequest(required=RACK)), 0)
    [adm] = e.cycle(0).admitted
    ta = adm.topology_assignments["workers"]
    assert ta == TopologyAssignment(levels=(HOST,), domains=((("b1-r1-n1",), 2), (("b1-r1-n2",), 2)))
    assert [p.node for p in sorted(adm.placements, key=lambda p: p.index)] == ["b1-r1-n1"] * 2 + ["b1-r1-n2"] * 2


def test_a_busy_rack_sends_the_next_gang_to_another_rack_and_finishing_frees_it() -> None:
    e = engine(pool())
    e.submit(job("a", 4, TopologyRequest(required=RACK)), 0)
    e.submit(job("b", 4, TopologyRequest(required=RACK)), 1)
    e.cycle(0)
    e.cycle(1)
    racks = {e.admission(n).topology_assignments["workers"].domains[0][0][0][:5] for n in ("a", "b")}  # type: ignore[union-attr]
    assert racks == {"b1-r1", "b1-r2"}
    e.finish("a", 2)
    e.submit(job("c", 4, TopologyRequest(required=RACK)), 2)
    [adm] = e.cycle(2).admitted
    assert {p.node for p in adm.placements} == {"b1-r1-n1", "b1-r1-n2"}


def test_preferred_rack_spills_into_the_block_when_no_rack_holds_the_gang() -> None:
    e = engine(pool())
    e.submit(job("big", 6, TopologyRequest(preferred=RACK)), 0)
    [adm] = e.cycle(0).admitted
    nodes = {p.node for p in adm.placements}
    assert len(nodes) == 3 and all(n.startswith("b1-") for n in nodes)


def test_required_rack_that_no_rack_holds_waits_with_kueues_reason() -> None:
    e = engine(pool())
    e.submit(job("big", 6, TopologyRequest(required=RACK)), 0)
    assert e.cycle(0).admitted == []
    info = e.pending_info("big")
    assert info is not None and info.reason == TOPOLOGY_PLACEMENT_FAILED
    assert info.message == ('couldn\'t assign flavors to pod set workers: topology "dc" allows to fit only 4 out of '
                            '6 pod(s)')


def test_explain_names_the_domains_and_what_to_change() -> None:
    e = engine(pool())
    e.submit(job("train", 4, TopologyRequest(required=RACK)), 0)
    e.submit(job("big", 6, TopologyRequest(required=RACK)), 0)
    e.cycle(0)
    e.cycle(1)
    assert "pod set workers in topology domains (kubernetes.io/hostname): b1-r1-n1 x2, b1-r1-n2 x2" in \
        e.explain("train")
    assert "preferred instead of required placement" in e.explain("big")


def test_cordoned_and_not_ready_nodes_leave_tas_capacity() -> None:
    nodes = pool()
    nodes[0] = Node(nodes[0].name, nodes[0].gpus, cpu=8, memory=64e9, labels=nodes[0].labels, ready=False)
    e = engine(nodes)
    e.set_schedulable("b1-r1-n2", False)
    e.submit(job("train", 4, TopologyRequest(required=RACK)), 0)
    [adm] = e.cycle(0).admitted
    assert {p.node for p in adm.placements} == {"b1-r2-n3", "b1-r2-n4"}


def test_a_node_that_turns_not_ready_leaves_tas_capacity_at_once_and_comes_back_when_ready() -> None:
    e = engine(pool())
    e.set_ready("b1-r1-n1", False)
    e.submit(job("a", 4, TopologyRequest(required=RACK)), 0)
    [adm] = e.cycle(0).admitted
    assert {p.node for p in adm.placements} == {"b1-r2-n3", "b1-r2-n4"}
    e.set_ready("b1-r1-n1", True)
    e.submit(job("b", 4, TopologyRequest(required=RACK)), 1)
    [adm] = e.cycle(1).admitted
    assert {p.node for p in adm.placements} == {"b1-r1-n1", "b1-r1-n2"}


def test_slices_of_two_pods_each_stay_inside_one_node() -> None:
    e = engine(pool(gpus=3))
    e.submit(job("sliced", 4, TopologyRequest(required=BLOCK, slice_required=HOST, slice_size=2)), 0)
    [adm] = e.cycle(0).admitted
    assert all(n == 2 for _, n in adm.topology_assignments["workers"].domains)


def test_rack_as_lowest_level_places_pods_on_the_racks_nodes() -> None:
    racks = Topology("racks", (BLOCK, RACK))
    e = engine(pool(), flavors=(ResourceFlavor("tas", topology_name="racks"),), topologies=(racks,))
    e.submit(job("train", 3, TopologyRequest(required=RACK)), 0)
    [adm] = e.cycle(0).admitted
    assert adm.topology_assignments["workers"] == TopologyAssignment(levels=(BLOCK, RACK),
                                                                     domains=((("b1", "r1"), 3),))
    assert {p.node for p in adm.placements} <= {"b1-r1-n1", "b1-r1-n2"}


def test_a_flavor_whose_topology_cannot_hold_the_gang_gives_way_to_the_next_flavor() -> None:
    nodes = [Node(n.name, n.gpus, cpu=8, memory=64e9, labels={**n.labels, "pool": "small" if i < 2 else "big"})
             for i, n in enumerate(pool())]
    flavors = (ResourceFlavor("small", {"pool": "small"}, topology_name="dc"),
               ResourceFlavor("big", {"pool": "big"}, topology_name="dc"))
    e = engine(nodes, flavors=flavors)
    e.submit(job("train", 6, TopologyRequest(required=BLOCK)), 0)
    [adm] = e.cycle(0).admitted
    assert adm.flavors[GPU] == "big"


def test_a_level_the_topology_lacks_is_refused_naming_the_field_and_the_levels() -> None:
    e = engine(pool())
    with pytest.raises(PermanentError, match=r"topology_request.required='example.com/zone'.*use one of"):
        e.submit(job("bad", 2, TopologyRequest(required="example.com/zone")), 0)


def test_conflicting_topology_annotations_are_refused() -> None:
    with pytest.raises(PermanentError, match="choose one"):
        job("bad", 2, TopologyRequest(required=RACK, preferred=RACK)).validate()
    with pytest.raises(PermanentError, match="slice_size"):
        job("bad", 2, TopologyRequest(required=RACK, slice_required=HOST, slice_size=3)).validate()
    with pytest.raises(PermanentError, match="does not divide the pod set count 5"):
        job("bad", 5, TopologyRequest(required=RACK, slice_required=HOST, slice_size=2)).validate()


def test_a_flavor_naming_a_missing_topology_makes_its_queue_inactive() -> None:
    e = engine(pool(), topologies=())
    e.submit(job("train", 1, TopologyRequest(required=RACK)), 0)
    e.cycle(0)
    info = e.pending_info("train")
    assert info is not None and "topology that is not defined" in info.message


def test_an_unconstrained_gang_fills_the_fullest_nodes_first() -> None:
    e = engine(pool())
    e.submit(job("one", 1, None), 0)
    e.cycle(0)
    e.submit(job("many", 3, TopologyRequest(unconstrained=True)), 1)
    [adm] = e.cycle(1).admitted
    # LeastFreeCapacity: the half-used node first, then the next in order.
    first = e.admission("one").placements[0].node  # type: ignore[union-attr]
    assert adm.placements[0].node == first


@pytest.mark.parametrize("seed", range(20))
def test_every_admitted_pod_lies_in_its_domain_in_rank_order_and_required_levels_hold(seed: int) -> None:
    """Random pools, gangs and requests: each pod's node is in its pod set's assigned domain, consecutive pod
    indices fill a domain before the next, a required level holds every pod in one domain of it, and no node
    takes more GPUs than it has."""
    import random
    rnd = random.Random(seed)
    nodes = [Node(n.name, tuple(GpuDevice(g) for g in range(rnd.choice((1, 2, 4)))), cpu=8, memory=64e9,
                  labels=n.labels) for n in pool()]
    e = engine(nodes)
    for i in range(12):
        level = rnd.choice((BLOCK, RACK, HOST))
        kind = rnd.choice(("required", "preferred", "unconstrained"))
        tr = (TopologyRequest(unconstrained=True) if kind == "unconstrained"
              else TopologyRequest(**{kind: level}))
        e.submit(job(f"w{i}", rnd.randint(1, 6), tr), i)
    for t in range(12):
        e.cycle(t)
    assert e.admitted_names()
    by_node = {n.name: n for n in nodes}
    used: dict[str, int] = {}
    for name in e.admitted_names():
        adm = e.admission(name)
        assert adm is not None
        ta = adm.topology_assignments["workers"]
        pods = sorted(adm.placements, key=lambda p: p.index)
        expected = [values for values, n in ta.domains for _ in range(n)]
        assert len(expected) == len(pods)
        for p, values in zip(pods, expected, strict=True):
            assert tuple(by_node[p.node].labels[k] for k in ta.levels) == values
            used[p.node] = used.get(p.node, 0) + len(p.gpus)
        tr = e.states[name].workload.pod_sets[0].topology_request
        if tr is not None and tr.required is not None:
            assert len({by_node[p.node].labels[tr.required] for p in pods}) == 1
    assert all(used[n] <= len(by_node[n].gpus) for n in used)


def test_a_leader_and_its_workers_share_one_rack() -> None:
    e = engine(pool())
    group = dict(required=RACK, pod_set_group="lws")
    e.submit(Workload("lws", "cq", (PodSet("leader", 1, {"cpu": 1}, topology_request=TopologyRequest(**group)),
                                    PodSet("workers", 3, {GPU: 1, "cpu": 1},
                                           topology_request=TopologyRequest(**group)))), 0)
    [adm] = e.cycle(0).admitted
    racks = {p.node[:5] for p in adm.placements}
    assert racks == {"b1-r1"} and len(adm.placements) == 4
    assert set(adm.topology_assignments) == {"leader", "workers"}


def test_a_pod_set_group_must_be_a_leader_and_its_workers_at_one_level() -> None:
    def ps(name: str, count: int, **tr: str) -> PodSet:
        return PodSet(name, count, {"cpu": 1}, topology_request=TopologyRequest(**tr))
    with pytest.raises(PermanentError, match="exactly 2 pod sets"):
        Workload("w", "cq", (ps("a", 1, required=RACK, pod_set_group="g"),)).validate()
    with pytest.raises(PermanentError, match="must have 1 pod"):
        Workload("w", "cq", (ps("a", 2, required=RACK, pod_set_group="g"),
                             ps("b", 2, required=RACK, pod_set_group="g"))).validate()
    with pytest.raises(PermanentError, match="different levels"):
        Workload("w", "cq", (ps("a", 1, required=RACK, pod_set_group="g"),
                             ps("b", 2, required=BLOCK, pod_set_group="g"))).validate()
    with pytest.raises(PermanentError, match="needs required or preferred"):
        Workload("w", "cq", (ps("a", 1, pod_set_group="g"), ps("b", 2, pod_set_group="g"))).validate()
