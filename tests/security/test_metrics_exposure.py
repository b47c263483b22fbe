"""A service's /metrics is neither on every interface nor a way to grow the series: it listens on the loopback
interface unless an address is named, and an event type outside the catalogue is one label value, ``unknown``,
however many a publisher makes up (issue 22: 200 publishes had made 7,174 series)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
import uuid

import psutil
import pytest
from nats.js.api import StreamConfig
from prometheus_client import REGISTRY

from taugrid import settings
from taugrid.bus import Bus, metrics
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.topology import ConsumerSpec
from taugrid.cli.asyncapi import OTHER_CHANNELS
from taugrid.core.events import RUN_EVENTS, ce_type, k8s_subject, run_subject
from taugrid.kube.watch import DEFAULT_RESOURCES
from taugrid.ports import free_port


def listening(port: int) -> set[str]:
    """The addresses this process listens on at ``port``."""
    return {c.laddr.ip for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_metrics_listen_on_loopback_when_no_address_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.ADDR_ENV, raising=False)
    assert metrics.listen_addr(settings.current().metrics) == "127.0.0.1"
    monkeypatch.setenv(metrics.ADDR_ENV, " ")
    assert metrics.listen_addr(settings.current().metrics) == "127.0.0.1"
    port = free_port()
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    assert metrics.serve(settings.current().metrics) == port
    assert listening(port) == {"127.0.0.1"}
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "# TYPE taugrid_handler_seconds histogram" in body


def test_metrics_listen_on_the_address_named(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    monkeypatch.setenv(metrics.ADDR_ENV, "127.0.0.2")  # what the chart does with the pod's IP
    assert metrics.serve(settings.current().metrics) == port
    assert listening(port) == {"127.0.0.2"}


def _type_of(subject: str, ce: str) -> str:
    return from_message(subject, {"ce-type": ce}, b"{}").type


def test_every_type_the_platform_publishes_keeps_its_label() -> None:
    published = {_type_of(run_subject("ws", "run-0123456789abcdef", kind), ce_type(kind)) for kind in RUN_EVENTS}
    for _, address, _, _, kind, family, _, _ in OTHER_CHANNELS:
        if family == "k8s":
            continue  # the bridge and the local cluster type a change by its kind: below
        published.add(_type_of(re.sub(r"\{[^}]+\}", "x", address), ce_type(kind, family=family)))
    for resource, _ in DEFAULT_RESOURCES:
        for change in ("added", "modified", "deleted"):
            published.add(_type_of(k8s_subject("local", resource.kind, "ns", "obj", change),
                                   ce_type(f"{resource.kind.lower()}.{change}", family="k8s")))
    assert {metrics.type_label(t) for t in published} == published
    assert published == metrics.KNOWN_TYPES


@pytest.mark.parametrize("made_up", ["policy.approved.extra", "x.y", "", "exec.running " * 3, "pod.exploded",
                                     "node.sample.v2", "\u00e9xec.failed"])
def test_a_type_outside_the_catalogue_is_unknown(made_up: str) -> None:
    assert metrics.type_label(made_up) == "unknown"


def _handled(durable: str) -> dict[tuple[str, str], float]:
    """(event_type, outcome) -> events handled, of one durable, as a scrape shows them."""
    return {(s.labels["event_type"], s.labels["outcome"]): s.value
            for family in REGISTRY.collect() if family.name == "taugrid_handler_seconds"
            for s in family.samples if s.name == "taugrid_handler_seconds_count" and s.labels["durable"] == durable}


async def test_two_hundred_made_up_types_are_one_label_value(bus: Bus) -> None:
    tag = uuid.uuid4().hex[:8]
    stream, durable = f"MT{tag}", f"metrics-{tag}"  # a stream of its own: no service's durable sees the junk
    await bus.js.add_stream(StreamConfig(name=stream, subjects=[f"mt{tag}.>"]))
    try:
        await ensure_consumer(bus, ConsumerSpec(durable, stream, [f"mt{tag}.>"]))
        seen: list[str] = []

        async def handler(ev: Event) -> None:
            seen.append(ev.type)

        loop = ConsumerLoop(bus, stream=stream, durable=durable, handler=handler, fetch_timeout=0.2)
        task = asyncio.create_task(loop.run())
        try:
            for i in range(200):
                await bus.publish(f"mt{tag}.r{i}.made{i}.up", b"{}", event_type=f"made{i}.up", ce_subject=f"r{i}",
                                  msg_id=f"{tag}-{i}")
            for _ in range(400):
                if sum(_handled(durable).values()) >= 200:
                    break
                await asyncio.sleep(0.05)
        finally:
            loop.stopping.set()
            await asyncio.wait_for(task, 10)
        assert len(set(seen)) == 200  # the handler still sees each type as published
        assert _handled(durable) == {("unknown", "ack"): 200.0}
    finally:
        await bus.js.delete_stream(stream)
