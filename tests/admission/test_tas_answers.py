"""TAS answers kept by the placement ``Cluster`` (issue 24 item 6): on the nodes as they are, per workload shape
while no free capacity changes; on empty nodes, per usable node set and shape. A kept answer is never one the
nodes no longer give."""

from __future__ import annotations

from taugrid.core.admission import Node, PodSet, ResourceFlavor, Topology, TopologyRequest, Workload
from taugrid.core.admission.placement import Cluster, TasFailure

RACK, HOST = "example.com/rack", "kubernetes.io/hostname"
FLAVORS = {"tas": ResourceFlavor("tas", topology_name="racks")}
ON_TAS = [{"cpu": "tas"}]


def cluster() -> Cluster:
    nodes = [Node(f"n{i}", cpu=4, memory=1e12, labels={RACK: f"r{i}", HOST: f"n{i}"}) for i in range(2)]
    return Cluster(nodes, {"racks": Topology("racks", (RACK, HOST))})


def gang(name: str) -> Workload:
    return Workload(name, "cq", (PodSet("main", 4, {"cpu": 1}, topology_request=TopologyRequest(required=RACK)),))


def node_of(answer: object) -> str:
    assert not isinstance(answer, TasFailure) and isinstance(answer, tuple)
    [(values, count)] = answer[1]["main"].domains
    assert count == 4
    return str(values[0])


def test_an_answer_on_the_nodes_as_they_are_is_shared_until_free_capacity_changes() -> None:
    c = cluster()
    first = c.tas_assign(gang("a"), ON_TAS, FLAVORS)
    assert c.tas_assign(gang("b"), ON_TAS, FLAVORS) is first  # same shape, nothing changed: one search
    assert node_of(first) == "n0"
    assert not isinstance(c.place(gang("a"), ON_TAS, FLAVORS, commit=True), str)  # n0 is full now
    assert node_of(c.tas_assign(gang("b"), ON_TAS, FLAVORS)) == "n1"
    held = c.release("a", quiet=True)  # a simulation: a's pods set aside
    assert node_of(c.tas_assign(gang("b"), ON_TAS, FLAVORS)) == "n0"
    c.restore("a", held, quiet=True)
    assert node_of(c.tas_assign(gang("b"), ON_TAS, FLAVORS)) == "n1"
    c.place(gang("c"), ON_TAS, FLAVORS, commit=True)
    failed = c.tas_assign(gang("b"), ON_TAS, FLAVORS)
    assert isinstance(failed, TasFailure) and "doesn't allow to fit any of 4 pod(s)" in failed.reason


def test_an_answer_on_empty_nodes_ignores_what_runs_and_follows_the_usable_nodes() -> None:
    c = cluster()
    c.place(gang("a"), ON_TAS, FLAVORS, commit=True)
    c.place(gang("b"), ON_TAS, FLAVORS, commit=True)
    empty = c.tas_assign(gang("x"), ON_TAS, FLAVORS, empty=True)
    assert node_of(empty) == "n0" and c.tas_assign(gang("y"), ON_TAS, FLAVORS, empty=True) is empty
    c.unschedulable.add("n0")  # a cordon: another set of usable nodes, another answer
    assert node_of(c.tas_assign(gang("x"), ON_TAS, FLAVORS, empty=True)) == "n1"
