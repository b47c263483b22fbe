"""A site's report of itself (``local/sitecapacity.site_capacity``): its pool by ResourceFlavor (the nodes each
flavor's labels select), GPUs by vendor, CPU cores or time-shared, and each ClusterQueue's figures from the
admitter's snapshot with its waiting runs named (the first five, workloads no longer held left out)."""

from __future__ import annotations

import yaml

from taugrid.config.platform import load_platform
from taugrid.core.sitecapacity import FlavorCapacity, QueueShare, SiteCapacity
from taugrid.local.admit import PoolNode
from taugrid.local.sitecapacity import site_capacity

PLATFORM = load_platform(yaml.safe_dump({
    "resource_flavors": [{"name": "h100", "node_labels": {"gpu": "h100"}}, {"name": "any"}],
    "cluster_queues": [{"name": "research", "resource_groups": [{
        "covered_resources": ["cpu"],
        "flavors": [{"name": "any", "resources": [{"name": "cpu", "nominal_quota": 8}]}]}]}],
    "local_queues": [{"name": "q", "namespace": "ns", "cluster_queue": "research"}],
}))
POOL = [PoolNode("a", gpus=8, cpu=64.0, memory=float(1 << 40), labels=(("gpu", "h100"),)),
        PoolNode("b", gpus=8, cpu=32.0, memory=float(1 << 39), labels=(("gpu", "h100"),)),
        PoolNode("c", gpus=4, cpu=16.0, memory=float(1 << 38), gpu_resource="amd.com/gpu")]
RUNS = {f"w{i}": f"run-{i}" for i in range(7)}


def test_the_pool_by_flavor_and_vendor_and_each_queue_with_its_first_waiting_runs() -> None:
    snapshot = [{"cluster_queue": "research", "cohort": "", "nominal": {"cpu": 8.0, "memory": 0.0},
                 "used": {"cpu": 2.0}, "borrowed": {}, "lent": {}, "admitted": 2,
                 "pending": ["w0", "gone", "w1", "w2", "w3", "w4", "w5", "w6"]}]
    got = site_capacity(PLATFORM, POOL, snapshot, RUNS.get)
    assert got == SiteCapacity(
        nodes=3, gpus={"nvidia.com/gpu": 16.0, "amd.com/gpu": 4.0}, cpu=112.0, memory=float(7 << 38),
        flavors=[FlavorCapacity("h100", 2, 16.0, 96.0), FlavorCapacity("any", 3, 20.0, 112.0)],
        queues=[QueueShare("research", nominal={"cpu": 8.0}, used={"cpu": 2.0}, admitted=2, pending=7,
                           first_pending=["run-0", "run-1", "run-2", "run-3", "run-4"])])
    # nothing time-dependent: the same state reports the same record, which the site then does not write again
    assert site_capacity(PLATFORM, POOL, snapshot, RUNS.get) == got


def test_a_time_shared_node_makes_the_pools_cpu_shared() -> None:
    pool = [*POOL, PoolNode("laptop", cpu=None)]
    got = site_capacity(PLATFORM, pool, [], RUNS.get)
    assert (got.nodes, got.cpu, got.flavors[1], got.queues) == (4, None, FlavorCapacity("any", 4, 20.0, None), [])
