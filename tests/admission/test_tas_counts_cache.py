"""TAS counts kept between fills (``TasTree`` with the ``Cluster``'s change log) equal counting every leaf afresh,
after random allocations, releases, simulations (quiet release/restore, trial placements) and cordons, and
after a search has rewritten the domains' counts."""

from __future__ import annotations

import random

import pytest

from taugrid.core.admission import (
    GPU,
    GpuDevice,
    Node,
    PodSet,
    ResourceFlavor,
    Taint,
    Toleration,
    Topology,
    TopologyRequest,
    Workload,
)
from taugrid.core.admission.placement import Cluster
from taugrid.core.admission.tas import TasPodSet, find
from taugrid.core.admission.tas_tree import Demand, Domain, Stats, TasTree

BLOCK, RACK, HOST = "example.com/block", "example.com/rack", "kubernetes.io/hostname"
BY_NODE = Topology("by-node", (BLOCK, RACK, HOST))
BY_RACK = Topology("by-rack", (BLOCK, RACK))  # leaves are racks of several nodes
FLAVOR = ResourceFlavor("tas", topology_name="by-node")
GPU_TAINT = Taint("gpu", "true")


def nodes(rng: random.Random) -> list[Node]:
    out = []
    for i in range(24):
        b, r = f"b{i // 12}", f"r{i // 4}"
        name = f"{b}-{r}-n{i}"
        out.append(Node(name, tuple(GpuDevice(g) for g in range(rng.choice((0, 2, 4)))), cpu=rng.choice((4, 8)),
                        memory=32e9, labels={BLOCK: b, RACK: r, HOST: name, "zone": f"z{i % 2}"},
                        taints=(GPU_TAINT,) if i % 5 == 0 else (), max_pods=rng.choice((None, 3, 6))))
    return out


def demands(tree: TasTree) -> list[Demand]:
    last = len(tree.levels) - 1
    cpu = {"cpu": 1000, "memory": 1 << 30, GPU: 0}
    gpu = {"cpu": 500, "memory": 1 << 29, GPU: 1000}
    return [
        Demand(cpu, None, {}, (), 1, last),
        Demand(gpu, None, {}, (Toleration("gpu", "Exists"),), 1, last),
        Demand(gpu, None, {"zone": "z1"}, (), 2, 1),  # slices of two at the rack level
        Demand(cpu, {"cpu": 2000, "memory": 0, GPU: 1000}, {}, (), 1, last),  # with a leader
        Demand(gpu, cpu, {}, (Toleration("gpu", "Exists"),), 2, 0),
    ]


def snapshot(tree: TasTree) -> list[tuple[int, ...]]:
    def vals(d: Domain) -> tuple[int, ...]:
        return d.pods, d.slices, d.leader, d.pods_wl, d.slices_wl
    return [vals(d) for d in tree.domains]


def fresh(tree: TasTree, demand: Demand, cluster: Cluster, empty: bool) -> tuple[object, ...]:
    """Every leaf counted afresh: the domains' values and the stats a fill reports."""
    counts = tree.count_all(demand, {}, lambda ni: cluster.tas_free(ni, empty=empty))
    resources = {k: n for k, n in counts.resources.items() if n}
    return counts.vals, counts.static.total, counts.static.selector, counts.static.taints, resources


def kept(tree: TasTree, demand: Demand, cluster: Cluster, empty: bool) -> tuple[object, ...]:
    stats = Stats()
    tree.fill(demand, {}, lambda ni: cluster.tas_free(ni, empty=empty), stats, cluster.changes, empty)
    return snapshot(tree), stats.total, stats.selector, stats.taints, stats.resources


def check(cluster: Cluster, rng: random.Random, empty: bool) -> int:
    """Fill every tree with every demand, kept counts against fresh ones; between two fills of one shape a
    search rewrites some domains' counts (``find``), which the next fill must undo. Returns the fills compared."""
    compared = 0
    for topo in (BY_NODE, BY_RACK):
        tree = cluster.tas_tree(ResourceFlavor("tas", topology_name=topo.name), topo)
        for i, demand in enumerate(demands(tree)):
            assert kept(tree, demand, cluster, empty) == fresh(tree, demand, cluster, empty)
            compared += 1
            if i < 2:  # shapes a plain pod set has: the search fills the same kept counts, then rewrites them
                ps = TasPodSet("p", rng.randint(1, 6), demand.per_pod, TopologyRequest(preferred=topo.levels[0]),
                               demand.node_selector, demand.tolerations)
                find(tree, ps, None, {}, lambda ni: cluster.tas_free(ni, empty=empty), cluster.changes, empty)
                assert kept(tree, demand, cluster, empty) == fresh(tree, demand, cluster, empty)
                # One node changes between two fills of one shape: the second recounts it alone.
                node = cluster.nodes[rng.choice(sorted(tree.nodes))].node.name
                pod = Workload("probe", "cq", (PodSet("p", 1, {"cpu": 2, "memory": 4e9}),))
                assert not isinstance(cluster.adopt(pod, [[]], [node]), str)
                assert kept(tree, demand, cluster, empty) == fresh(tree, demand, cluster, empty)
                cluster.release("probe")
                assert kept(tree, demand, cluster, empty) == fresh(tree, demand, cluster, empty)
                compared += 3
    return compared


def job(rng: random.Random, name: str) -> Workload:
    count = rng.randint(1, 4)
    tr = rng.choice((None, TopologyRequest(required=RACK), TopologyRequest(preferred=BLOCK),
                     TopologyRequest(unconstrained=True)))
    requests = {"cpu": rng.choice((0.5, 1, 2)), "memory": 1e9}
    if rng.random() < 0.5:
        requests[GPU] = 1
    return Workload(name, "cq", (PodSet("w", count, requests, topology_request=tr),),
                    tolerations=(Toleration("gpu", "Exists"),))


@pytest.mark.parametrize("seed", range(6))
def test_kept_counts_equal_fresh_counts_after_random_allocations_releases_and_cordons(seed: int) -> None:
    rng = random.Random(seed)
    pool = nodes(rng)
    cluster = Cluster(pool, {"by-node": BY_NODE, "by-rack": BY_RACK})
    running: list[str] = []
    compared = 0
    for step in range(60):
        op = rng.random()
        if op < 0.4:  # admit through TAS (which itself fills the kept counts), committed
            w = job(rng, f"w{step}")
            flv = [{"cpu": "tas", "memory": "tas", GPU: "tas"}]
            if not isinstance(cluster.place(w, flv, {"tas": FLAVOR}, commit=True), str):
                running.append(w.name)
        elif op < 0.55:  # a trial placement, undone
            cluster.place(job(rng, f"t{step}"), [{"cpu": "tas", "memory": "tas", GPU: "tas"}], {"tas": FLAVOR},
                          commit=False)
        elif op < 0.7 and running:  # a pod that runs on a named node (a restore)
            node = rng.choice(pool)
            w = Workload(f"a{step}", "cq", (PodSet("p", 1, {"cpu": 0.5}),))
            if not isinstance(cluster.adopt(w, [[]], [node.name]), str):
                running.append(w.name)
        elif op < 0.85 and running:
            name = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.5:  # victims set aside and put back (a preemption simulation)
                cluster.restore(name, cluster.release(name, quiet=True), quiet=True)
                running.append(name)
            else:
                cluster.release(name)
        else:  # cordon or uncordon a node: another tree, which keeps its own counts
            name = rng.choice(pool).name
            if name in cluster.unschedulable:
                cluster.unschedulable.discard(name)
            else:
                cluster.unschedulable.add(name)
        compared += check(cluster, rng, empty=False) + check(cluster, rng, empty=True)
    assert compared == 60 * 2 * 2 * 11
