"""``pull.Puller``, the consumer loop's fetch, over a real nats-server: a message stored while a fetch waits is
handed over when it is stored, not when the request expires, even when an earlier request that waits for a full
batch (what nats-py's fetch left behind, and the server serves first) takes it; a backlog comes in batches; an
earlier request's late status never ends a later fetch. Each fetch waits up to 10 s, so "at once" below means
well before that."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from taugrid.bus import Bus, bulkparse, connect, rawmsgs
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import delivery
from taugrid.bus.errors import REFUSED
from taugrid.bus.pull import Puller
from taugrid.bus.topology import ConsumerSpec

WAIT_S = 10.0


async def a_durable(bus: Bus) -> tuple[str, str]:
    """A fresh durable on LOGS and the subject prefix its filter takes."""
    tag = uuid.uuid4().hex[:8]
    await ensure_consumer(bus, ConsumerSpec(f"pull-{tag}", "LOGS", [f"log.pull{tag}.*.1"], ack_wait=10))
    return f"pull-{tag}", f"log.pull{tag}"


@contextlib.asynccontextmanager
async def started_puller(bus: Bus, durable: str) -> AsyncIterator[Puller]:
    """``durable``'s Puller, started, unsubscribed at the end."""
    puller = Puller(bus.nc, stream="LOGS", durable=durable)
    await puller.start()
    try:
        yield puller
    finally:
        await puller.unsubscribe()


async def waiting_requests(bus: Bus, durable: str, at_least: int) -> None:
    """Until the server holds ``at_least`` pull requests of ``durable`` (the fetch has asked)."""
    async with asyncio.timeout(WAIT_S):
        while (await bus.js.consumer_info("LOGS", durable)).num_waiting < at_least:
            await asyncio.sleep(0.01)


async def test_a_message_stored_while_a_fetch_waits_is_handed_over_when_stored(bus: Bus) -> None:
    durable, prefix = await a_durable(bus)
    async with started_puller(bus, durable) as puller:
        fetch = asyncio.create_task(puller.fetch(32, WAIT_S))
        await waiting_requests(bus, durable, 1)
        stored = time.monotonic()
        await bus.js.publish(f"{prefix}.r1.1", b"one")
        got = await fetch
        assert [m.data for m in got] == [b"one"]
        assert time.monotonic() - stored < WAIT_S / 2  # not at the request's expiry


async def test_a_message_an_earlier_full_batch_request_takes_is_handed_over_at_once(bus: Bus) -> None:
    """An earlier request of this subscriber that waits for a full batch (no ``no_wait``: nats-py's second ask)
    is the one the server serves first; what it is given reaches the fetch waiting now, without waiting for that
    request's 32 messages or its expiry."""
    durable, prefix = await a_durable(bus)
    async with started_puller(bus, durable) as puller:
        await bus.nc.publish(puller.subject, json.dumps({"batch": 32, "expires": int(WAIT_S * 1e9)}).encode(),
                             reply=f"{puller.prefix}0")
        fetch = asyncio.create_task(puller.fetch(32, WAIT_S))
        await waiting_requests(bus, durable, 2)
        stored = time.monotonic()
        await bus.js.publish(f"{prefix}.r1.1", b"one")
        got = await fetch
        assert [(m.subject, m.data) for m in got] == [(f"{prefix}.r1.1", b"one")]
        assert time.monotonic() - stored < WAIT_S / 2


async def test_a_backlog_comes_in_batches_and_an_empty_durable_times_out(bus: Bus) -> None:
    durable, prefix = await a_durable(bus)
    for i in range(5):
        await bus.js.publish(f"{prefix}.r{i}.1", str(i).encode())
    async with started_puller(bus, durable) as puller:
        first = await puller.fetch(3, WAIT_S)
        rest = await puller.fetch(3, WAIT_S)  # two left: answered at once with them, not at expiry
        assert [m.data for m in first + rest] == [b"0", b"1", b"2", b"3", b"4"]
        for m in first + rest:
            await m.ack()
        with pytest.raises(TimeoutError):
            await puller.fetch(3, 0.2)


async def test_an_earlier_requests_late_status_never_ends_a_later_fetch(bus: Bus) -> None:
    durable, prefix = await a_durable(bus)
    async with started_puller(bus, durable) as puller:
        fetch = asyncio.create_task(puller.fetch(32, WAIT_S))
        await waiting_requests(bus, durable, 1)
        # what a request this side stopped waiting for gets at its expiry, arriving now
        await bus.nc.publish(f"{puller.prefix}0", b"", headers={"Status": "408", "Description": "Request Timeout"})
        await bus.js.publish(f"{prefix}.r1.1", b"one")
        assert [m.data for m in await fetch] == [b"one"]


async def test_a_fetch_whose_durable_is_deleted_meanwhile_raises_rather_than_asking_again_at_once(bus: Bus) -> None:
    """The server cuts the waiting request short (409); with nothing fetched the fetch raises the server's answer, so
    the consumer loop pauses (``ConsumerLoop``: a failed fetch waits 0.5 s) instead of asking again and again."""
    durable, _ = await a_durable(bus)
    async with started_puller(bus, durable) as puller:
        fetch = asyncio.create_task(puller.fetch(32, WAIT_S))
        await waiting_requests(bus, durable, 1)
        await bus.js.delete_consumer("LOGS", durable)
        with pytest.raises(REFUSED) as refused:
            await fetch
        assert refused.value.code == 409  # type: ignore[attr-defined]  # nats-py's APIError


@pytest.mark.parametrize("routed", [True, False])
async def test_a_delivery_read_off_the_wire_is_the_msg_nats_py_builds(
        bootstrapped: str, monkeypatch: pytest.MonkeyPatch, routed: bool) -> None:
    """Deliveries and the requests' statuses come from the bulk reader (``rawmsgs.route``) where this nats-py is
    the one it was checked against, else through nats-py's own subscription: either way a fetch hands over the Msg
    nats-py builds (its headers, its reply subject, which ``consumer.delivery`` reads as ``Msg.metadata`` does),
    and a request that expires empty is a timeout."""
    if not routed:
        monkeypatch.setattr(rawmsgs, "_CHECKED", False)
    bus = await connect(bootstrapped, name="test-pull")
    try:
        durable, prefix = await a_durable(bus)
        stored = await bus.js.publish(f"{prefix}.r1.1", b"one", headers={"ce-source": "/svc/x", "x-y": "a b"})
        async with started_puller(bus, durable) as puller:
            [msg] = await puller.fetch(3, WAIT_S)
            meta = msg.metadata
            assert (msg.subject, msg.data, msg.headers, meta.stream, meta.sequence.stream, meta.num_delivered) == (
                f"{prefix}.r1.1", b"one", {"ce-source": "/svc/x", "x-y": "a b"}, "LOGS", stored.seq, 1)
            assert delivery(msg) == (stored.seq, 1, meta.timestamp.timestamp())
            await msg.ack()
            with pytest.raises(TimeoutError):
                await puller.fetch(3, 0.2)
            reader = bus.nc._ps
            assert (isinstance(reader, bulkparse.BulkParser) and str(puller.sub._id).encode() in reader.sinks) == routed
    finally:
        await bus.close()
