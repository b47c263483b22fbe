"""History in batches against a real nats-server: every stored event once, in stream order, with its stream
sequence, and `tau events --output json`'s JSON Lines equal to each event's ``to_json``. RUNS' history is read from
HISTORY and AUDIT (the kinds AUDIT keeps: cancel.requested, which most of these tests store), merged in RUNS'
order (``replay.batches``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from taugrid.bus import Bus, auditread, history, rawmsgs, replay
from taugrid.cli.views import event_json_lines
from taugrid.core.contracts import CancelRequested, ExecRunning


async def _emit_many(bus: Bus, ws: str, count: int) -> None:
    # run ids unique to the test: message ids (`<run>.<attempt>.<type>`) are deduplicated across workspaces
    seqs = await asyncio.gather(*(bus.emit(workspace=ws, run_id=f"{ws}-r{i}", attempt=1,
                                           event_type="cancel.requested", payload=CancelRequested(reason=f"n{i}"))
                                  for i in range(count)))
    await _copied(bus, ws, f"{ws}-r{max(range(count), key=seqs.__getitem__)}", max(seqs))


async def _copied(bus: Bus, ws: str, run: str, seq: int) -> None:
    """Once HISTORY or AUDIT holds RUNS' event ``seq`` of ``run``, and so every earlier five-token event of its kind
    (one feed copies them into each, in RUNS' order): a replay reads them, which copy an event a moment after RUNS
    stored it."""
    await history.run_events(bus, ws, run, through=seq)


@contextlib.asynccontextmanager
async def _following(bus: Bus, subject: str) -> AsyncIterator[tuple[replay.ReplayCursor, list[Any]]]:
    """A live ``replay.follow`` of ``subject`` read in the background: its cursor and the events so far."""
    cursor, live = replay.ReplayCursor(), []

    async def read() -> None:
        async with contextlib.aclosing(replay.follow(bus, subject, live=True, cursor=cursor)) as feed:
            async for ev in feed:
                live.append(ev)

    reading = asyncio.create_task(read())
    try:
        yield cursor, live
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


async def test_history_comes_in_fetched_batches_in_stream_order_with_stream_sequences(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 2500)
    got = [batch async for batch in replay.batches(bus, f"run.{ws}.>", batch=1000)]
    assert [len(b) for b in got] == [1000, 1000, 500]
    events = [ev for b in got for ev in b]
    # read from AUDIT, which alone keeps cancel.requested (bus/kept.py), each at its RUNS sequence: what nats-py's
    # own parse of the copies' source headers gives (one feed copies these five-token events, in RUNS' order)
    stored = await replay.replay(bus, stream="AUDIT", subject=f"a.{ws}.>")
    assert [ev.seq for ev in events] == [auditread.origin_sequence(m.headers, 0) for m in stored]
    assert sorted(ev.subject for ev in events) == sorted(f"{ws}-r{i}" for i in range(2500))
    assert [ev async for ev in replay.follow(bus, f"run.{ws}.>")] == events  # follow reads the same path


async def test_history_and_audit_are_merged_in_runs_order_each_sequence_once(bus: Bus) -> None:
    """A kind HISTORY keeps (exec.running) and one only AUDIT keeps (cancel.requested), stored in turn: one replay
    reads both in RUNS' order, in batches of about ``batch`` (not all at once), and ``follow`` (a snapshot's
    ordered consumers, and live ones) the same."""
    ws = f"w{uuid.uuid4().hex[:6]}"
    kinds = [("cancel.requested", CancelRequested(reason="m")), ("exec.running", ExecRunning(node="n", pod="p"))]
    seqs = [await bus.emit(workspace=ws, run_id=f"{ws}-r{i // 2}", attempt=1, event_type=kinds[i % 2][0],
                           payload=kinds[i % 2][1]) for i in range(600)]
    for k in range(2):  # each feed's last copy: every earlier one of its kind is held too
        last = max(range(k, 600, 2), key=seqs.__getitem__)
        await _copied(bus, ws, f"{ws}-r{last // 2}", seqs[last])
    got = [batch async for batch in replay.batches(bus, f"run.{ws}.>", batch=100)]
    events = [ev for b in got for ev in b]
    assert [ev.seq for ev in events] == sorted(seqs)  # each once, in RUNS' order
    assert [ev.type for ev in events] == [kinds[i % 2][0] for i in range(600)]
    assert len(got) > 3 and max(len(b) for b in got) <= 200  # streamed: about a batch of each at a time
    copies = [*await replay.replay(bus, stream="HISTORY", subject=f"h.{ws}.>"),
              *await replay.replay(bus, stream="AUDIT", subject=f"a.{ws}.>")]
    assert sorted(auditread.origin_sequence(m.headers, 0) for m in copies) == sorted(seqs)
    # a filter on one kind reads only the stream that keeps it
    only = [ev for b in [b async for b in replay.batches(bus, f"run.{ws}.*.exec.running")] for ev in b]
    assert [ev.seq for ev in only] == [ev.seq for ev in events if ev.type == "exec.running"]
    def seen(evs: list[Any]) -> list[Any]:  # (an ordered consumer's stored time is the metadata's, rounded apart)
        return [(ev.seq, ev.nats_subject, ev.id, ev.data, ev.headers) for ev in evs]

    followed = [ev async for ev in replay.follow(bus, f"run.{ws}.>", cursor=replay.ReplayCursor())]
    assert seen(followed) == seen(events)
    async with _following(bus, f"run.{ws}.>") as (cursor, live):
        for _ in range(200):  # caught up: both consumers' stored events handed out
            if await cursor.caught_up():
                break
            await asyncio.sleep(0.05)
        # HISTORY's and AUDIT's consumers, and RUNS' own live tail
        assert seen(live) == seen(events) and len(cursor.parts) == 3


async def test_the_merge_hands_out_each_sequence_once_as_far_as_every_source_has_come() -> None:
    from taugrid.bus.envelope import from_message

    def evs(*seqs: int) -> list[Any]:
        return [from_message("run.ws.r.exec.running", {"ce-type": "io.taugrid.run.exec.running.v1"}, b"{}", seq=s)
                for s in seqs]

    async def feed(*got: list[Any]) -> Any:
        for b in got:
            yield b

    # HISTORY's two feeds at their own pace (9 after 10), a copy seen twice (4), AUDIT between
    history_feed = feed(evs(1, 2, 4, 6), evs(10, 9, 4), evs(12))
    audit_feed = feed(evs(3, 5), evs(7, 11))
    got = [[ev.seq for ev in b] async for b in replay._in_runs_order([history_feed, audit_feed])]
    # each batch as far as both have come; 9, delivered after 10 was handed out, comes with the next
    assert got == [[1, 2, 3, 4, 5], [6], [7, 9, 10], [11], [12]]
    assert [b async for b in replay._in_runs_order([feed(), feed()])] == []


def test_the_merge_hands_out_each_sequence_once_across_runs_of_consecutive_sequences_and_repeats() -> None:
    from taugrid.bus.envelope import from_message

    def evs(*seqs: int) -> list[Any]:
        return [from_message("run.ws.r.exec.running", {}, b"{}", seq=s) for s in seqs]

    seen = replay._Seen()
    handed = [[ev.seq for ev in seen.fresh(evs(*batch))] for batch in (
        range(5, 21),  # consecutive, from the first: bits set a byte at a time (5..20 spans three bytes)
        range(21, 24),  # consecutive within one byte
        (18, 19, 24),  # two seen before, one new
        range(25, 40),
        (3, 4, 30),  # below the first sequence (a lagging feed's), and a repeat
        (3, 40, 41),
        (42, 42, 43),  # a copy delivered twice in one batch
        (44, 46, 47),  # a gap: 45 may still come
        (45, 46),
        (48, 48, 50),  # as many as 48..50 holds, but 49 is not among them
        (49, 50),
    )]
    assert handed == [list(range(5, 21)), [21, 22, 23], [24], list(range(25, 40)), [3, 4], [40, 41], [42, 43],
                      [44, 46, 47], [45], [48, 50], [49]]


async def test_a_filter_with_no_history_yields_no_batch(bus: Bus) -> None:
    assert [b async for b in replay.batches(bus, f"run.w{uuid.uuid4().hex[:6]}.>")] == []


async def test_json_lines_equal_each_events_to_json(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 3)
    [events] = [b async for b in replay.batches(bus, f"run.{ws}.>")]
    lines = event_json_lines(events).decode().splitlines()
    assert [json.loads(line) for line in lines] == [ev.to_json() for ev in events]
    assert sorted(json.loads(line)["data"]["reason"] for line in lines) == ["n0", "n1", "n2"]


async def _publish_raw(port: int, subject: str, header_block: bytes, payload: bytes) -> None:
    """One message exactly as written on the wire (HPUB), as any client of the server may write it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n'
                 + f"HPUB {subject} {len(header_block)} {len(header_block) + len(payload)}\r\n".encode()
                 + header_block + payload + b"\r\nPING\r\n")
    await writer.drain()
    assert await reader.readline() == b"PONG\r\n"
    writer.close()


async def test_raw_reading_gives_the_events_nats_py_would_and_skips_contradicting_headers(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 5)
    port = int(bus.nc.connected_url.port)  # type: ignore[union-attr]
    # a workspace header that says another workspace than the subject: refused, never read (§4)
    forged = b"NATS/1.0\r\nce-type: io.taugrid.run.cancel.requested.v1\r\nce-workspace: other\r\n\r\n"
    await _publish_raw(port, f"run.{ws}.{ws}-forged.cancel.requested", forged, b'{"reason":"x"}')
    await _emit_many(bus, ws, 2)  # after the forged one: reading carries on past it
    routed = _routes(bus)
    raw = [ev for b in [b async for b in replay.batches(bus, f"run.{ws}.>", batch=3)] for ev in b]
    assert _routes(bus) == routed  # the replay's routes are gone with it
    monkeypatch.setattr(rawmsgs, "_CHECKED", False)  # as with a nats-py the hook was not checked against
    via_msgs = [ev for b in [b async for b in replay.batches(bus, f"run.{ws}.>", batch=3)] for ev in b]
    assert raw == via_msgs
    assert len(raw) == 5  # 5 + 2 emitted, 2 deduplicated (same ids), the forged one left out
    assert [ev.seq for ev in raw] == sorted(ev.seq for ev in raw)
    assert all(ev.stored > 0 and ev.workspace == ws and ev.headers["ce-workspace"] == ws for ev in raw)


async def test_a_stored_message_shaped_like_a_status_is_read_not_taken_for_the_end_of_a_request(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's status (404, 408) comes without a reply subject; a stored message always has one, whatever
    its header block says, so a publisher cannot end a request early and stall someone's replay."""
    ws = f"w{uuid.uuid4().hex[:6]}"
    port = int(bus.nc.connected_url.port)  # type: ignore[union-attr]
    await _emit_many(bus, ws, 2)
    await _publish_raw(port, f"run.{ws}.{ws}-s.exec.running", b"NATS/1.0 404 No Messages\r\n\r\n", b"")
    await _emit_many(bus, ws, 4)
    events = [ev for b in [b async for b in replay.batches(bus, f"run.{ws}.>", batch=2)] for ev in b]
    assert sorted(ev.subject for ev in events) == sorted([f"{ws}-r{i}" for i in range(4)] + [f"{ws}-s"])
    [odd] = [ev for ev in events if ev.subject == f"{ws}-s"]
    assert (odd.type, odd.data, odd.workspace) == ("exec.running", b"", ws)
    monkeypatch.setattr(rawmsgs, "_CHECKED", False)
    assert [ev for b in [b async for b in replay.batches(bus, f"run.{ws}.>", batch=2)] for ev in b] == events


def test_reply_subject_tokens_give_the_stream_sequence_and_the_stored_time() -> None:
    plain = b"$JS.ACK.RUNS.tau-1.1.42.7.1700000000123456789.0".split(b".")
    domain = ["$JS", "ACK", "hub", "ACCHASH", "RUNS", "tau-1", "1", "42", "7", "1700000000123456789", "0"]
    with_token = [*domain, "r4nd0m"]
    for tokens in (plain, domain, with_token):
        assert (rawmsgs.stream_seq(tokens), rawmsgs.stored_at(tokens)) == (42, 1700000000.1234567)
    assert (rawmsgs.stream_seq(["_INBOX", "x"]), rawmsgs.stored_at(["_INBOX", "x"])) == (0, 0.0)


def test_reply_subjects_read_together_give_what_each_read_alone_gives() -> None:
    usual = [f"$JS.ACK.HISTORY.tau-1.1.{seq}.{seq}.17000000001234{seq:05d}.{9 - seq}".encode() for seq in range(1, 6)]
    # numbers JSON does not write as ``int`` reads them (a leading zero, a plus sign, an underscore, a comma that
    # would read as two numbers), a domain's reply, a subject that is no reply at all
    odd = [b"$JS.ACK.RUNS.c.1.007.7.1700000000123456789.0", b"$JS.ACK.RUNS.c.1.+8.7.1700000000123456789.0",
           b"$JS.ACK.RUNS.c.1.9.7.1_700_000_000_123_456_789.0", b"$JS.ACK.RUNS.c.1.1,2.7.1700000000123456789.0",
           b"$JS.ACK.RUNS.c.1.3.7.1,2.0", b"$JS.ACK.hub.H.RUNS.c.1.42.7.1700000000123456789.0", b"_INBOX.x"]
    for replies in [usual, *([*usual[:2], one] for one in odd)]:
        try:
            alone = ([rawmsgs.stream_seq(r.split(b".")) for r in replies],
                     [rawmsgs.stored_at(r.split(b".")) for r in replies])
        except ValueError:  # "1,2" is no number: reading it together fails the same way
            with pytest.raises(ValueError):
                rawmsgs._places(replies)
            continue
        assert rawmsgs._places(replies) == alone, replies
    assert rawmsgs._places(usual)[1][0] == 1700000000.1234


async def test_json_lines_of_an_undecodable_payload_say_why_after_the_data() -> None:
    from taugrid.bus.envelope import from_message

    ev = from_message("run.ws.r1.exec.running", {"ce-type": "io.taugrid.run.exec.running.v1"}, b"{not json", seq=3)
    [line] = event_json_lines([ev]).splitlines()
    doc = json.loads(line)
    assert list(doc) == [*ev.to_json_head(), "data", "undecodable"]
    assert (doc["data"], doc["seq"], doc["type"]) == (None, 3, "io.taugrid.run.exec.running.v1")
    assert doc["undecodable"].startswith("JSON is malformed")


def test_json_lines_read_deep_many_bracketed_foreign_and_non_run_payloads_as_events_to_json_says() -> None:
    from taugrid.bus.envelope import from_message

    deep = b'{"a":' * 70 + b"1" + b"}" * 70  # nests past EVENT_MAX_DEPTH (64)
    shallow = b'{"a":[' + b",".join([b"[]"] * 70) + b"]}"  # more brackets than the limit, two levels deep
    foreign = b'{"node":5}'  # not exec.running's Struct (its node is a string): shown as stored
    events = [from_message("run.ws.r1.exec.running", {}, body, seq=n) for n, body in enumerate((deep, foreign), 1)]
    events += [from_message("node.n1.report", {"ce-type": "io.taugrid.node.report.v1"}, shallow, seq=3)]
    docs = [json.loads(line) for line in event_json_lines(events).splitlines()]
    assert docs[0]["data"] is None and docs[0]["undecodable"].startswith("JSON nests deeper than 64 levels")
    assert (docs[1]["data"], docs[2]["data"]) == ({"node": 5}, {"a": [[]] * 70})
    assert docs[1:] == [ev.to_json() for ev in events[1:]]


ODD_HEADERS = [  # each beside the CloudEvents attributes of a cancel.requested, as any client may write them
    b"x-note: a: b\r\n", b'x-quote: say "hi" \\o/\r\n', b"x-lead:  spaced \r\n", b"x-utf: caf\xc3\xa9\r\n",
    b"x-dup: 1\r\nx-dup: 2\r\n", b"bad name: x\r\n", b"x-tab:\tv\r\n", b"x-empty: \r\n", b"x-colon:x\r\n",
    b"x-blank: 1\r\n\r\nx-after: 2\r\n", b"x-bad: \xff\xfe\r\n",
]


async def _store_odd_history(bus: Bus, ws: str) -> None:
    """Odd headers, two large events, nine ordinary ones, then another workspace's event between this one's last
    three and its last two: a gap in the sequences the replay reads (HISTORY denies deleting one)."""
    port = int(bus.nc.connected_url.port)  # type: ignore[union-attr]
    for i, extra in enumerate(ODD_HEADERS):
        subject = f"run.{ws}.{ws}-odd{i}.cancel.requested"
        block = (b"NATS/1.0\r\nce-type: io.taugrid.run.cancel.requested.v1\r\nce-id: " + f"{ws}-odd{i}".encode()
                 + b"\r\nce-workspace: " + ws.encode() + b"\r\n" + extra + b"\r\n")
        await _publish_raw(port, subject, block, b'{"reason":"odd"}')
    # past nats-py's 32 KB reads and past the bulk reader's 64 KB, so both are read in pieces
    for size in (40_000, 300_000):
        await bus.emit(workspace=ws, run_id=f"{ws}-big{size}", attempt=1, event_type="cancel.requested",
                       payload=CancelRequested(reason="x" * size))
    await _emit_many(bus, ws, 9)
    await bus.emit(workspace=f"{ws}x", run_id=f"{ws}x-gap", attempt=1, event_type="cancel.requested",
                   payload=CancelRequested(reason="elsewhere"))
    for i in range(2):
        seq = await bus.emit(workspace=ws, run_id=f"{ws}-late{i}", attempt=1, event_type="cancel.requested",
                             payload=CancelRequested(reason=f"late {i}"))
    await _copied(bus, ws, f"{ws}-late1", seq)


def _routes(bus: Bus) -> tuple[set[Any], set[Any]]:
    """The subscriptions routed on ``bus``'s connection: the bulk reader's and the ``_process_msg`` hook's (the
    bus's own request inbox may keep both for its answers; a replay leaves them as it found them)."""
    from taugrid.bus import bulkparse

    reader, router = bus.nc._ps, bus.nc.__dict__.get("_process_msg")
    return (set(reader.sinks) if isinstance(reader, bulkparse.BulkParser) else set(),
            set(router.sinks) if isinstance(router, rawmsgs._Router) else set())


async def _read_all(bus: Bus, subject: str) -> list[Any]:
    return [ev for b in [b async for b in replay.batches(bus, subject, batch=4)] for ev in b]


async def test_the_bulk_reader_gives_what_nats_py_gives_with_odd_headers_large_messages_and_a_gap(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    from taugrid.bus import bulkparse

    ws = f"w{uuid.uuid4().hex[:6]}"
    await _store_odd_history(bus, ws)
    before = await _read_all(bus, f"run.{ws}.>")
    assert [b.seq - a.seq for a, b in zip(before[-3:-1], before[-2:], strict=True)] == [2, 1]  # the gap
    read_in_bulk = []
    frames = bulkparse.BulkParser._frames

    async def counted(self: bulkparse.BulkParser, data: bytes, batch: Any) -> None:
        read_in_bulk.append(len(data))
        await frames(self, data, batch)

    monkeypatch.setattr(bulkparse.BulkParser, "_frames", counted)
    routed = _routes(bus)
    bulk = await _read_all(bus, f"run.{ws}.>")
    assert sum(read_in_bulk) > 340_000  # the history came through the bulk reader
    monkeypatch.undo()
    assert bulk == before
    assert _routes(bus) == routed  # the connection's reading is as the replay found it
    monkeypatch.setattr(bulkparse, "CHECKED", False)  # the wire read by nats-py, each message handed over raw
    per_message = await _read_all(bus, f"run.{ws}.>")
    monkeypatch.setattr(rawmsgs, "_CHECKED", False)  # no hook at all: nats-py's Msg, as any subscriber reads
    via_msgs = await _read_all(bus, f"run.{ws}.>")
    assert bulk == per_message == via_msgs
    assert event_json_lines(bulk) == event_json_lines(per_message) == event_json_lines(via_msgs)
    assert len(bulk) == len(ODD_HEADERS) + 2 + 9 + 2  # not the other workspace's
    assert sorted(len(ev.data) for ev in bulk)[-2:] == [40_000 + 31, 300_000 + 31]  # {"reason":"…","requested_by":""}
    headers = {ev.subject: ev.headers for ev in bulk}
    assert headers[f"{ws}-odd0"]["x-note"] == "a: b" and headers[f"{ws}-odd2"]["x-lead"] == "spaced"
    assert headers[f"{ws}-odd4"]["x-dup"] == "2" and "bad name" not in headers[f"{ws}-odd5"]


async def test_two_replays_at_once_beside_another_subscription_on_the_same_connection(bus: Bus) -> None:
    from nats.aio.msg import Msg

    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 300)
    plain: list[bytes] = []
    arrived = asyncio.Event()

    async def collect(msg: Msg) -> None:
        plain.append(msg.data)
        if len(plain) == 50:
            arrived.set()

    sub = await bus.nc.subscribe(f"plain.{ws}", cb=collect)
    routed = _routes(bus)

    async def publish() -> None:
        for i in range(50):
            await bus.nc.publish(f"plain.{ws}", str(i).encode())
            await asyncio.sleep(0)

    first, second, _ = await asyncio.gather(_read_all(bus, f"run.{ws}.>"), _read_all(bus, f"run.{ws}.>"), publish())
    await asyncio.wait_for(arrived.wait(), timeout=5)
    await sub.unsubscribe()
    assert first == second and len(first) == 300
    assert plain == [str(i).encode() for i in range(50)]  # nats-py's own reading, in order, meanwhile
    assert _routes(bus) == routed  # both replays' routes gone, the rest as they were


async def _pause_feed(bus: Bus, feed: str, until: dt.datetime | None) -> None:
    """Pause (until ``until``) or resume (None) RUNS' feed ``feed`` into its copy: its copies are not made."""
    body = {"pause_until": until.isoformat().replace("+00:00", "Z")} if until else {}
    reply = await bus.nc.request(f"$JS.API.CONSUMER.PAUSE.RUNS.{feed}", json.dumps(body).encode(), timeout=5)
    answer = json.loads(reply.data)
    assert "error" not in answer, answer
    assert answer["paused"] is (until is not None)


async def test_a_live_follow_keeps_runs_order_while_one_copy_lags_the_other(bus: Bus) -> None:
    """HISTORY's feed held back (a loaded server's lag, made certain by pausing it): a run's exec.running (a kind
    HISTORY keeps) then its cancel.requested (one AUDIT keeps) are followed live in RUNS' order, the first though
    its copy is not made yet; once the feed copies it, it is not handed out again."""
    ws = f"w{uuid.uuid4().hex[:6]}"
    run = f"{ws}-r0"
    async with _following(bus, f"run.{ws}.>") as (cursor, live):
        await _pause_feed(bus, "history", dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
        try:
            for _ in range(100):
                if len(cursor.parts) == 3:
                    break
                await asyncio.sleep(0.05)
            ran = await bus.emit(workspace=ws, run_id=run, attempt=1, event_type="exec.running",
                                 payload=ExecRunning(node="n", pod="p"))
            asked = await bus.emit(workspace=ws, run_id=run, attempt=1, event_type="cancel.requested",
                                   payload=CancelRequested(reason="m"))
            for _ in range(100):
                if len(live) == 2:
                    break
                await asyncio.sleep(0.05)
            assert [(ev.seq, ev.type) for ev in live] == [(ran, "exec.running"), (asked, "cancel.requested")]
            assert await replay.replay(bus, stream="HISTORY", subject=f"h.{ws}.>") == []  # not copied yet
        finally:
            await _pause_feed(bus, "history", None)
        await _copied(bus, ws, run, ran)  # the feed copies it now
        await asyncio.sleep(0.3)
        assert [(ev.seq, ev.type) for ev in live] == [(ran, "exec.running"), (asked, "cancel.requested")]
