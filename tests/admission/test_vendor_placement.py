"""A node's GPUs go only to pods asking for its vendor's resource (issue 26): an AMD pod lands on the AMD node with
that node's GPU indices, an NVIDIA pod (or a GPU share, which only NVIDIA's stack gives) on the NVIDIA node, a Gaudi
pod on no node without Gaudi devices, even when quota would admit it; topology-aware placement counts each node's
devices under its own vendor's resource."""

from __future__ import annotations

from taugrid.core.admission import (
    GPU,
    Engine,
    GpuDevice,
    Node,
    PodSet,
    ResourceFlavor,
    Topology,
    TopologyRequest,
    Workload,
)
from tests.admission.adm_build import cq

AMD, GAUDI = "amd.com/gpu", "habana.ai/gaudi"


def mixed(amd_quota: int = 8, **kw: object) -> Engine:
    nodes = [Node("nv-0", tuple(GpuDevice(i, 81920) for i in range(4)), cpu=64, memory=1 << 40,
                  labels={"kubernetes.io/hostname": "nv-0"}),
             Node("mi-0", tuple(GpuDevice(i, 196608) for i in range(8)), cpu=64, memory=1 << 40,
                  labels={"kubernetes.io/hostname": "mi-0"}, gpu_resource=AMD)]
    queue = cq("q", flavors={"default": {GPU: 8, AMD: amd_quota, GAUDI: 8}})
    return Engine([queue], nodes=nodes, **kw)  # type: ignore[arg-type]


def one(name: str, requests: dict[str, float], *, count: int = 1, **kw: object) -> Workload:
    return Workload(name, "q", (PodSet("main", count, requests, **kw),))  # type: ignore[arg-type]


def test_each_vendors_pod_gets_its_vendors_node_and_indices() -> None:
    engine = mixed()
    engine.submit(one("rocm", {AMD: 3}), 0)
    engine.submit(one("cuda", {GPU: 2}), 0)
    engine.submit(one("share", {}, gpu_fraction=0.5), 0)
    placed = {a.workload: [(p.node, p.gpus) for p in a.placements]
              for t in range(3) for a in engine.cycle(t).admitted}  # one head of the queue a cycle
    assert placed == {"rocm": [("mi-0", (0, 1, 2))], "cuda": [("nv-0", (0, 1))], "share": [("nv-0", (2,))]}


def test_a_vendor_no_node_has_waits_though_quota_would_admit_it() -> None:
    engine = mixed()
    engine.submit(one("gaudi", {GAUDI: 1}), 0)
    assert engine.cycle(0).admitted == []
    pending = engine.pending_info("gaudi")
    assert pending is not None and "none of 0 eligible node(s)" in pending.message


def test_more_amd_gpus_than_the_amd_node_has_never_borrow_nvidia_devices() -> None:
    engine = mixed(amd_quota=16)
    # quota holds 12; the AMD node has 8, and the NVIDIA node's 4 are not AMD's
    engine.submit(one("big", {AMD: 4}, count=3), 0)
    assert engine.cycle(0).admitted == []
    pending = engine.pending_info("big")
    assert pending is not None and "none of 1 eligible node(s) has room for pod" in pending.message


def test_topology_aware_placement_counts_a_nodes_devices_as_its_vendors() -> None:
    topo = Topology("hosts", ("kubernetes.io/hostname",))
    flavor = ResourceFlavor("default", topology_name="hosts")
    engine = mixed(topologies=[topo], flavors=[flavor])
    engine.submit(one("rocm", {AMD: 8}, topology_request=TopologyRequest(required="kubernetes.io/hostname")), 0)
    [adm] = engine.cycle(0).admitted
    assert [(p.node, p.gpus) for p in adm.placements] == [("mi-0", tuple(range(8)))]
