"""The control plane's quota view: each ClusterQueue summed over the clusters serving it, each share named by its
cluster; a queue a cluster does not serve counts nowhere, whatever its site reports."""

from __future__ import annotations

from taugrid.core.sitecapacity import ClusterShare, QueueShare, QueueTotal, SiteCapacity, Usage, summed, usage

EAST = SiteCapacity(nodes=2, gpus={"nvidia.com/gpu": 16.0}, cpu=64.0, queues=[
    QueueShare("research", nominal={"cpu": 32.0, "nvidia.com/gpu": 8.0}, used={"cpu": 4.0, "nvidia.com/gpu": 2.0},
               admitted=2, pending=3, first_pending=["r1", "r2", "r3"]),
    QueueShare("prod", nominal={"cpu": 32.0}, used={"cpu": 1.0}, admitted=1)])
WEST = SiteCapacity(nodes=1, cpu=None, queues=[
    QueueShare("research", nominal={"cpu": 8.0}, used={"cpu": 8.0}, admitted=4, pending=1, first_pending=["r9"]),
    QueueShare("prod", nominal={"cpu": 100.0}, used={"cpu": 50.0}, admitted=7)])
SERVED = {"east": None, "west": {"research"}, "north": None}


def _serves(cluster: str, queue: str) -> bool:
    queues = SERVED[cluster]
    return queues is None or queue in queues


def test_each_queue_is_the_sum_of_the_clusters_serving_it_with_their_shares() -> None:
    got = summed({"east": EAST, "west": WEST}, ["west", "east", "north"], _serves)
    assert got == [
        QueueTotal("research", {"cpu": 40.0, "nvidia.com/gpu": 8.0}, {"cpu": 12.0, "nvidia.com/gpu": 2.0}, 6, 4, [
            ClusterShare("west", {"cpu": 8.0}, {"cpu": 8.0}, 4, 1, ["r9"]),
            ClusterShare("east", {"cpu": 32.0, "nvidia.com/gpu": 8.0}, {"cpu": 4.0, "nvidia.com/gpu": 2.0}, 2, 3,
                         ["r1", "r2", "r3"])]),
        # west reports a prod queue, but serves only research: its 100 CPUs are no part of the view
        QueueTotal("prod", {"cpu": 32.0}, {"cpu": 1.0}, 1, 0, [ClusterShare("east", {"cpu": 32.0}, {"cpu": 1.0}, 1, 0,
                                                                             [])])]


def test_no_report_yet_adds_nothing_and_a_report_of_a_cluster_not_named_is_ignored() -> None:
    assert summed({}, ["east"], _serves) == []
    assert summed({"south": EAST}, ["east", "west"], _serves) == []


def test_a_clusters_usage_sums_its_served_queues() -> None:
    assert usage(WEST, lambda q: q == "research") == Usage({"cpu": 8.0}, {"cpu": 8.0}, 4, 1)
    assert usage(EAST, lambda q: True) == Usage({"cpu": 64.0, "nvidia.com/gpu": 8.0},
                                                {"cpu": 5.0, "nvidia.com/gpu": 2.0}, 3, 3)
    assert usage(SiteCapacity(), lambda q: True) == Usage({}, {}, 0, 0)
