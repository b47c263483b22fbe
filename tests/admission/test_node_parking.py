"""Which parked heads a release of node room brings back (issue 24 item 6: the TAS scenario's cost per head).

Nodes are shared by every cohort tree, so a release in one tree can let a head of another tree in when that
head's verdict read what the nodes hold now (a TAS assignment, a placement on the live nodes). A head refused by
quota alone reads no node: only a capacity event in its own cohort tree can change its verdict, so another
tree's release leaves it parked instead of nominating it again for nothing. Decisions are the same either way;
``test_memo_parking``'s strand property checks that no run that would fit stays parked at quiescence."""

from __future__ import annotations

from taugrid.core.admission import (
    ClusterQueue,
    Cohort,
    Engine,
    FlavorQuotas,
    Node,
    PodSet,
    PreemptionPolicy,
    ReclaimWithinCohort,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Topology,
    TopologyRequest,
    Workload,
)

RACK, HOST = "example.com/rack", "kubernetes.io/hostname"
ANY = PreemptionPolicy(reclaim_within_cohort=ReclaimWithinCohort.ANY)


def engine() -> Engine:
    """Two nodes of 4 cpu in two racks; three queues, each alone in its cohort tree: ``big`` (8 cpu) can fill
    both nodes, ``tas`` (2 cpu) and ``tight`` (1 cpu) share the nodes with it."""
    def cq(name: str, cpu: int) -> ClusterQueue:
        group = ResourceGroup(("cpu",), (FlavorQuotas("f", {"cpu": ResourceQuota(cpu)}),))
        return ClusterQueue(name, (group,), cohort=f"c-{name}", preemption=ANY)
    nodes = [Node(f"n{i}", cpu=4, memory=1e12, labels={RACK: f"r{i}", HOST: f"n{i}"}) for i in range(2)]
    return Engine([cq("big", 8), cq("tas", 2), cq("tight", 1)], [Cohort(f"c-{n}") for n in ("big", "tas", "tight")],
                  [ResourceFlavor("f", topology_name="racks")], nodes, topologies=[Topology("racks", (RACK, HOST))])


def gang(name: str, queue: str, pods: int, at: float) -> Workload:
    return Workload(name, queue, (PodSet("main", pods, {"cpu": 1}, topology_request=TopologyRequest(required=RACK)),),
                    created_at=at)


def test_a_release_in_another_cohort_tree_brings_back_only_the_heads_that_read_the_nodes() -> None:
    e = engine()
    e.submit(gang("a", "big", 4, 0), 0)
    e.submit(gang("b", "big", 4, 1), 0)
    assert [x.workload for x in e.cycle(0).admitted] == ["a"]
    assert [x.workload for x in e.cycle(0).admitted] == ["b"]  # both nodes are full
    e.submit(gang("w", "tas", 1, 2), 0)  # its quota holds it; no rack has room: it read the nodes
    e.submit(gang("v", "tight", 2, 3), 0)  # 2 cpu on a 1-cpu queue: refused by quota alone
    res = e.cycle(0)
    assert (res.admitted, res.heads) == ([], 2)
    assert [x[3] for x in e.queues["tas"].parked_on_nodes] == ["w"] and e.queues["tas"].parked == []
    assert [x[3] for x in e.queues["tight"].parked] == ["v"] and e.queues["tight"].parked_on_nodes == []
    assert e.quiescent()
    e.finish("a", 1)  # node room released in the ``big`` tree
    assert not e.quiescent()
    res = e.cycle(1)
    assert ([x.workload for x in res.admitted], res.heads) == (["w"], 1)  # v was not nominated again
    assert [x[3] for x in e.queues["tight"].parked] == ["v"]
    assert e.quiescent()


def test_a_release_in_its_own_cohort_tree_brings_back_a_head_refused_by_quota() -> None:
    e = engine()
    e.submit(gang("u", "tight", 1, 0), 0)
    e.submit(gang("v", "tight", 1, 1), 0)
    assert [x.workload for x in e.cycle(0).admitted] == ["u"]
    assert e.cycle(0).admitted == []  # v: the queue's 1 cpu is taken
    assert [x[3] for x in e.queues["tight"].parked] == ["v"]
    e.finish("u", 1)
    assert [x.workload for x in e.cycle(1).admitted] == ["v"]


def test_a_cordon_brings_back_every_parked_head() -> None:
    """Fewer or more nodes change even a verdict that read only the totals (the empty topology of a TAS
    preemptor): a cordon or readiness change unparks every head, as before."""
    e = engine()
    e.submit(gang("v", "tight", 2, 0), 0)
    assert e.cycle(0).admitted == []
    e.set_schedulable("n0", False)
    assert not e.quiescent()
    assert e.cycle(0).heads == 1
