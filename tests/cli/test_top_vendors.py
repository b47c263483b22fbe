"""`tau top` shows a queue's GPUs per vendor (issue 26): NVIDIA's, AMD's and Gaudi's each against its quota, and
each node's vendor and model."""

from __future__ import annotations

import msgspec

from taugrid.cli.top_cmd import TopView, frame
from taugrid.health.wire import NodeState

QUEUES = {"backend": "local", "node": "n1", "time": 1_800_000_000.0, "queues": [{
    "cluster_queue": "fleet", "cohort": None, "borrowed": {}, "lent": {}, "admitted": 2, "pending": [],
    "nominal": {"cpu": 64.0, "nvidia.com/gpu": 8.0, "amd.com/gpu": 8.0, "habana.ai/gaudi": 16.0},
    "used": {"cpu": 4.0, "amd.com/gpu": 3.0, "habana.ai/gaudi": 8.0, "rdma/x": 1.0}}]}


def test_a_queue_shows_its_gpus_per_vendor() -> None:
    view = TopView()
    view.apply("local_cluster", "queues", msgspec.json.encode(QUEUES))
    text = frame(view.snapshot(now=1_800_000_000.0, finished=5))
    [line] = [line for line in text.splitlines() if line.startswith("fleet")]
    assert "0/8 nvidia, 3/8 amd, 8/16 intel-gaudi" in line


def test_a_queue_of_one_vendor_shows_its_gpus_plainly_and_a_node_its_vendor_and_model() -> None:
    one = {**QUEUES, "queues": [{**QUEUES["queues"][0], "nominal": {"cpu": 8.0, "amd.com/gpu": 8.0},
                                 "used": {"cpu": 1.0, "amd.com/gpu": 2.0}}]}
    view = TopView()
    view.apply("local_cluster", "queues", msgspec.json.encode(one))
    view.apply("node_state", "node.mi-0", msgspec.json.encode(
        NodeState(node="mi-0", expected_gpus=8, gpu_vendor="amd", gpu_model="amd-mi300x", last_sample=1.0)))
    text = frame(view.snapshot(now=1_800_000_000.0, finished=5))
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("fleet")] == [["fleet", "-", "2/8"]]
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("mi-0")] == [
        ["mi-0", "8", "amd/amd-mi300x"]]
