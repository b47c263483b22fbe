"""``streams.history`` by direct gets against a real nats-server: from a sequence, or from a time (the server
finds where that time starts in the stream, so a run's logs are not looked for through all of LOGS)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from taugrid.bus import Bus, streams
from taugrid.core.events import log_subject


async def test_history_from_a_time_starts_where_that_time_starts_in_the_stream(bus: Bus) -> None:
    ws, run = "hist", f"r{uuid.uuid4().hex[:8]}"
    other = f"o{uuid.uuid4().hex[:8]}"
    for i in range(3):
        await bus.js.publish(log_subject(ws, run, 1), f"early {i}".encode())
    await bus.js.publish(log_subject(ws, other, 1), b"someone else's")
    await asyncio.sleep(0.05)
    since = time.time()
    await asyncio.sleep(0.05)
    for i in range(2):
        await bus.js.publish(log_subject(ws, run, 2), f"late {i}".encode())
    requests: list[dict[str, object]] = []

    async def spy(msg) -> None:  # type: ignore[no-untyped-def]
        requests.append(json.loads(msg.data))

    sub = await bus.nc.subscribe("$JS.API.DIRECT.GET.LOGS", cb=spy)
    subject = f"log.*.{run}.*"
    everything = await streams.history(bus, "LOGS", subject)
    later = await streams.history(bus, "LOGS", subject, since=since)
    await bus.nc.flush()
    await sub.unsubscribe()
    assert [ev.data for ev in everything] == [b"early 0", b"early 1", b"early 2", b"late 0", b"late 1"]
    assert [ev.data for ev in later] == [b"late 0", b"late 1"]
    assert [ev.seq for ev in later] == [ev.seq for ev in everything[3:]]
    assert requests[0] == {"seq": 1, "next_by_subj": subject}
    asked_from_time = requests[len(everything) + 1]  # the first get of the second walk (each walk ends on a 404)
    assert set(asked_from_time) == {"start_time", "next_by_subj"}
    assert await streams.history(bus, "LOGS", subject, since=time.time() + 60) == []


async def test_at_many_reads_each_sequence_by_direct_gets_and_none_for_one_gone(bus: Bus) -> None:
    """``streams.at_many`` (the evidence seal's read of a run's events): the messages at the sequences asked,
    in that order, by direct gets at those sequences; None for a sequence the stream does not hold; the same
    events ``at`` reads one by one (subject, headers, data)."""
    run = f"r{uuid.uuid4().hex[:8]}"
    acks = [await bus.js.publish(log_subject("many", run, 1), f"line {i}".encode(), headers={"k": str(i)})
            for i in range(3)]
    seqs = [acks[2].seq, acks[0].seq, acks[2].seq + 10_000]
    requests: list[dict[str, object]] = []

    async def spy(msg) -> None:  # type: ignore[no-untyped-def]
        requests.append(json.loads(msg.data))

    sub = await bus.nc.subscribe("$JS.API.DIRECT.GET.LOGS", cb=spy)
    got = await streams.at_many(bus, "LOGS", seqs)
    await bus.nc.flush()
    await sub.unsubscribe()
    assert got[2] is None and sorted(r["seq"] for r in requests) == sorted(seqs)  # type: ignore[type-var]
    one_by_one = [await streams.at(bus, "LOGS", seq) for seq in seqs[:2]]
    assert [(ev.nats_subject, ev.seq, ev.data, ev.headers["k"]) for ev in got[:2] if ev is not None] == [
        (ev.nats_subject, ev.seq, ev.data, ev.headers["k"]) for ev in one_by_one if ev is not None] == [
        (log_subject("many", run, 1), acks[2].seq, b"line 2", "2"), (log_subject("many", run, 1), acks[0].seq,
                                                                      b"line 0", "0")]


async def test_count_reads_the_subject_index_and_a_missing_stream_holds_none(bus: Bus) -> None:
    run, other = f"r{uuid.uuid4().hex[:8]}", f"o{uuid.uuid4().hex[:8]}"
    for attempt in (1, 1, 2):
        await bus.js.publish(log_subject("count", run, attempt), b"x")
    await bus.js.publish(log_subject("count", other, 1), b"y")
    assert await streams.count(bus, "LOGS", f"log.*.{run}.*") == 3
    assert await streams.count(bus, "LOGS", f"log.*.{run}.2") == 1
    assert await streams.count(bus, "LOGS", f"log.*.{uuid.uuid4().hex[:8]}.*") == 0
    assert await streams.count(bus, f"NOSUCH{uuid.uuid4().hex[:6].upper()}", "x.>") == 0
