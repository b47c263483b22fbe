"""Consumer metrics on a real nats-server: each handled event is counted by durable, type and outcome, with
redeliveries and dead letters; a service serves them on /metrics only when TAU_METRICS_PORT is set."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid

import pytest
from prometheus_client import REGISTRY

from taugrid import settings
from taugrid.bus import Bus, metrics
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.topology import ConsumerSpec
from taugrid.core.contracts import SubmitAccepted
from taugrid.core.errors import TemporaryError
from taugrid.ports import free_port
from tests.owners import acting_as


def count(durable: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("taugrid_handler_seconds_count", {
        "durable": durable, "event_type": "submit.accepted", "outcome": outcome}) or 0.0


async def test_outcomes_redeliveries_and_dead_letters_are_counted(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    durable = f"metrics-{ws}"
    await ensure_consumer(bus, ConsumerSpec(durable, "RUNS", [f"run.{ws}.*.submit.accepted"]))
    busy = {"flaky": 1}  # the run whose first delivery meets a temporary error

    async def handler(ev: Event) -> None:
        if busy.get(ev.subject):
            busy[ev.subject] -= 1
            raise TemporaryError("busy", delay=0.1)
        ev.payload(SubmitAccepted)

    loop = ConsumerLoop(bus, stream="RUNS", durable=durable, handler=handler, fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    good = b'{"submission_id": "s", "config": {}, "config_hash": "h"}'
    try:
        with acting_as(bus, "submitter"):
            for run, body in (("ok", good), ("flaky", good), ("bad", b"[]")):
                await bus.publish(f"run.{ws}.{run}.submit.accepted", body, event_type="submit.accepted",
                                  ce_subject=run, msg_id=f"{ws}-{run}", workspace=ws)
        for _ in range(200):
            if count(durable, "ack") == 2 and count(durable, "dead_letter") == 1:
                break
            await asyncio.sleep(0.05)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, 10)
    assert (count(durable, "ack"), count(durable, "retry"), count(durable, "dead_letter")) == (2.0, 1.0, 1.0)
    assert REGISTRY.get_sample_value("taugrid_redeliveries_total", {"durable": durable}) == 1.0
    assert REGISTRY.get_sample_value("taugrid_dead_letters_total", {"durable": durable, "why": "undecodable"}) == 1.0


def test_metrics_are_served_only_when_a_port_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.PORT_ENV, raising=False)
    assert metrics.serve(settings.current().metrics) is None
    port = free_port()
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    monkeypatch.setenv(metrics.ADDR_ENV, "127.0.0.1")
    assert metrics.serve(settings.current().metrics) == port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "# TYPE taugrid_handler_seconds histogram" in body
    assert "# TYPE taugrid_consumer_ack_pending gauge" in body


def test_the_embedded_stack_gives_each_replica_its_own_metrics_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from taugrid.stack.supervisor import METRICS_BASE_ENV, SERVICES, metrics_port

    monkeypatch.delenv(METRICS_BASE_ENV, raising=False)
    assert metrics_port("renderer", 0, settings.current().metrics.base_port) is None
    monkeypatch.setenv(METRICS_BASE_ENV, "19000")
    ports = [metrics_port(s, r, settings.current().metrics.base_port) for s in SERVICES for r in range(32)]
    assert len(set(ports)) == len(ports) == 32 * len(SERVICES) and min(ports) == 19000  # type: ignore[type-var]


def test_queue_gauges_follow_the_queue_snapshot_and_scrape_with_the_standard_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.setattr(metrics, "SERVED", True)  # as after ``serve``: the process has a /metrics endpoint
    metrics.observe_queues([{"cluster_queue": "mq", "pending": [{"run_id": "a"}, {"run_id": "b"}], "admitted": 3,
                             "nominal": {"nvidia.com/gpu": 8.0, "cpu": 64.0}, "used": {"nvidia.com/gpu": 6.0},
                             "borrowed": {"nvidia.com/gpu": 1.0}, "lent": {}}])
    parsed = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(generate_latest(REGISTRY).decode())
              for s in family.samples}
    assert parsed[("taugrid_queue_pending", (("cluster_queue", "mq"),))] == 2.0
    assert parsed[("taugrid_queue_admitted", (("cluster_queue", "mq"),))] == 3.0
    quota = {(dict(k)["kind"], dict(k)["resource"]): v for (name, k), v in parsed.items()
             if name == "taugrid_queue_quota" and dict(k)["cluster_queue"] == "mq"}
    assert quota == {("nominal", "nvidia.com/gpu"): 8.0, ("nominal", "cpu"): 64.0, ("used", "nvidia.com/gpu"): 6.0,
                     ("borrowed", "nvidia.com/gpu"): 1.0}


async def test_the_health_monitor_sets_gpu_and_cordon_gauges_from_each_sample(bus: Bus) -> None:
    import time

    from taugrid.core.contracts import GpuSample, NodeSample
    from taugrid.health.monitor import HealthMonitor
    from taugrid.health.rules import Policy

    node = f"m{uuid.uuid4().hex[:8]}"
    gpus = [GpuSample(index=0, memory_total_mb=16000, memory_used_mb=1000, utilization_pct=35, temperature_c=61,
                      ecc_volatile_uncorrected=0),
            GpuSample(index=1, memory_total_mb=16000, memory_used_mb=0, utilization_pct=0, temperature_c=40,
                      ecc_volatile_uncorrected=2, xid_events=[79])]
    roomy = Policy(max_cordoned=10_000, max_cordoned_fraction=1.0)  # other tests' nodes share this bus
    await HealthMonitor(bus, policy=roomy).process(NodeSample(node=node, time=time.time(), cpus=8, memory_bytes=2**34,
                                                gpus=gpus, gpu_source="declared"))

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"node": node, **labels})

    assert (value("taugrid_gpu_temperature_celsius", gpu="0"), value("taugrid_gpu_utilization_percent", gpu="0"),
            value("taugrid_gpu_memory_used_bytes", gpu="0")) == (61.0, 35.0, 1000.0 * 2**20)
    assert value("taugrid_gpu_ecc_uncorrected", gpu="1") == 2.0
    assert value("taugrid_gpu_xid_events_total", gpu="1", xid="79") == 1.0
    assert value("taugrid_node_unhealthy") == 1.0  # XID 79 and uncorrectable ECC
    assert value("taugrid_node_cordoned") == 1.0


def _kv_count(bucket: str, op: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("taugrid_kv_seconds_count", {"bucket": bucket, "op": op,
                                                                   "outcome": outcome}) or 0.0


def _object_count(op: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("taugrid_object_seconds_count", {"store": "evidence", "op": op,
                                                                       "outcome": outcome}) or 0.0


async def test_kv_and_object_store_operations_are_timed_and_served(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from taugrid.bus import kv, objects, platformstore

    before = {k: _kv_count("submissions", *k) for k in [("create", "ok"), ("create", "exists"), ("get", "ok"),
                                                          ("get", "absent"), ("save", "conflict"), ("put", "ok")]}
    before_obj = {k: _object_count(*k) for k in [("write", "ok"), ("read", "ok"), ("read", "absent"),
                                                  ("exists", "absent")]}
    key = f"metrics-{uuid.uuid4().hex[:8]}"
    revision = await kv.create(bus, "submissions", key, b"one")
    assert revision is not None and await kv.create(bus, "submissions", key, b"again") is None
    assert (await kv.get(bus, "submissions", key)) == kv.Record(value=b"one", revision=revision)
    assert await kv.get(bus, "submissions", key + "-none") is None
    with pytest.raises(kv.Conflict):
        await kv.save(bus, "submissions", key, b"two", revision=revision + 1000)
    await kv.put(bus, "submissions", key, b"three")
    name = f"runs/{key}/bundle.json"
    await objects.write(bus, name, b"{}", workspace="default")
    assert await objects.read(bus, name) == b"{}"
    assert await objects.read(bus, name + ".none") is None
    assert not await objects.exists(bus, name + ".none")

    platform_reads = _kv_count("platform", "get", "ok") + _kv_count("platform", "get", "absent")
    await platformstore.get_local_user(bus)  # present or not on this session's server: one timed read either way
    assert _kv_count("platform", "get", "ok") + _kv_count("platform", "get", "absent") == platform_reads + 1

    grew = {k: _kv_count("submissions", *k) - v for k, v in before.items()}
    assert grew == {("create", "ok"): 1, ("create", "exists"): 1, ("get", "ok"): 1, ("get", "absent"): 1,
                    ("save", "conflict"): 1, ("put", "ok"): 1}
    assert {k: _object_count(*k) - v for k, v in before_obj.items()} == {
        ("write", "ok"): 1, ("read", "ok"): 1, ("read", "absent"): 1, ("exists", "absent"): 1}

    # what a scrape of the service's endpoint shows, read with the standard Prometheus parser
    port = free_port()
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    monkeypatch.setenv(metrics.ADDR_ENV, "127.0.0.1")
    assert metrics.serve(settings.current().metrics) == port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["taugrid_kv_seconds"].type == "histogram"
    assert families["taugrid_object_seconds"].type == "histogram"
    scraped = {(s.name, s.labels.get("op"), s.labels.get("outcome")): s.value
               for s in families["taugrid_kv_seconds"].samples
               if s.labels.get("bucket") == "submissions" and s.name.endswith("_count")}
    assert scraped[("taugrid_kv_seconds_count", "save", "conflict")] == _kv_count("submissions", "save", "conflict")
    read_sum = next(s.value for s in families["taugrid_object_seconds"].samples
                    if s.name == "taugrid_object_seconds_sum" and s.labels == {"store": "evidence", "op": "read",
                                                                                "outcome": "ok"})
    assert read_sum > 0


def test_queue_gauges_are_not_kept_where_no_metrics_are_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default (the embedded stack): a platform of 1,000 ClusterQueues would hold 4,000 series no one reads."""
    monkeypatch.setattr(metrics, "SERVED", False)
    metrics.observe_queues([{"cluster_queue": "unserved", "pending": [], "admitted": 1, "nominal": {"cpu": 4.0}}])
    assert REGISTRY.get_sample_value("taugrid_queue_admitted", {"cluster_queue": "unserved"}) is None
    assert REGISTRY.get_sample_value("taugrid_queue_quota",
                                     {"cluster_queue": "unserved", "resource": "cpu", "kind": "nominal"}) is None

