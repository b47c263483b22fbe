"""`tau top` counts a queue's GPUs of every vendor (issue 26): NVIDIA's, AMD's and Gaudi's together."""

from __future__ import annotations

import msgspec

from taugrid.cli.top_cmd import TopView, frame

QUEUES = {"backend": "local", "node": "n1", "time": 1_800_000_000.0, "queues": [{
    "cluster_queue": "fleet", "cohort": None, "borrowed": {}, "lent": {}, "admitted": 2, "pending": [],
    "nominal": {"cpu": 64.0, "nvidia.com/gpu": 8.0, "amd.com/gpu": 8.0, "habana.ai/gaudi": 16.0},
    "used": {"cpu": 4.0, "amd.com/gpu": 3.0, "habana.ai/gaudi": 8.0, "rdma/x": 1.0}}]}


def test_a_queue_shows_its_gpus_of_every_vendor() -> None:
    view = TopView()
    view.apply("local_cluster", "queues", msgspec.json.encode(QUEUES))
    text = frame(view.snapshot(now=1_800_000_000.0, finished=5))
    assert [line.split()[:3] for line in text.splitlines() if line.startswith("fleet")] == [["fleet", "-", "11/32"]]
