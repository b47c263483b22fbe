"""The requests a service sends (acks, publishes into a stream, KV writes) answered on its one inbox
subscription (``connection.Replies``), against a real nats-server: each answer reaches its own request exactly as
the server sent it, headers and statuses included, also while a replay's bulk reader holds the same connection."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import nats.errors
import pytest
from nats.aio.msg import Msg

from taugrid.bus import Bus, bulkparse, connect, history, rawmsgs, replay, streams
from taugrid.core.contracts import CancelRequested
from taugrid.core.events import run_subject


async def _responder(bus: Bus, subject: str, *, headers: dict[str, str] | None = None) -> None:
    async def answer(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"re:" + msg.data) if headers is None else \
            await bus.nc.publish(msg.reply, b"re:" + msg.data, headers=headers)

    await bus.nc.subscribe(subject, cb=answer)
    await bus.nc.flush()


async def _ignore(msg: nats.aio.msg.Msg) -> None:
    del msg


async def test_each_answer_reaches_its_own_request_as_nats_py_builds_it(bus: Bus) -> None:
    subject = f"svc.{uuid.uuid4().hex[:8]}"
    await _responder(bus, subject)
    replies = await asyncio.gather(*(bus.replies.request(subject, str(i).encode(), timeout=5) for i in range(50)))
    assert [r.data for r in replies] == [f"re:{i}".encode() for i in range(50)]
    assert {r.headers for r in replies} == {None}
    assert all(r.subject.startswith(bus.replies.prefix) and r.reply == "" for r in replies)


async def test_an_answer_with_headers_keeps_them(bus: Bus) -> None:
    subject = f"svc.{uuid.uuid4().hex[:8]}"
    await _responder(bus, subject, headers={"x-answer": "yes", "x-count": "2"})
    reply = await bus.replies.request(subject, b"q", timeout=5)
    assert (reply.data, reply.headers) == (b"re:q", {"x-answer": "yes", "x-count": "2"})


async def test_nobody_listening_is_no_responders_and_silence_a_timeout(bus: Bus) -> None:
    with pytest.raises(nats.errors.NoRespondersError):  # the server's 503 status, a header block
        await bus.replies.request(f"nobody.{uuid.uuid4().hex[:8]}", b"q", timeout=5)
    silent = f"silent.{uuid.uuid4().hex[:8]}"
    sub = await bus.nc.subscribe(silent, cb=_ignore)  # takes the request, never answers
    await bus.nc.flush()
    with pytest.raises(nats.errors.TimeoutError):
        await bus.replies.request(silent, b"q", timeout=0.3)
    await sub.unsubscribe()
    assert bus.replies._pending == {}


async def test_publishes_are_acked_while_a_replay_reads_the_same_connection_in_bulk(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    seqs = await asyncio.gather(*(bus.emit(workspace=ws, run_id=f"{ws}-r{i}", attempt=1,
                                           event_type="cancel.requested", payload=CancelRequested(reason="x"))
                                  for i in range(200)))
    assert len(set(seqs)) == 200 and all(s > 0 for s in seqs)
    # a replay of RUNS reads the feeds' copies, made after the publishes' acks (failed 1 in 3 at 1d6c7d9 when read
    # at once): the feeds copy in RUNS' order, so once the last one is copied all of them are
    last = max(range(200), key=seqs.__getitem__)
    await history.run_events(bus, ws, f"{ws}-r{last}", through=seqs[last])
    reading = [b async for b in replay.batches(bus, f"run.{ws}.>", batch=50)]
    more = await asyncio.gather(*(bus.emit(workspace=ws, run_id=f"{ws}-more{i}", attempt=1,
                                           event_type="cancel.requested", payload=CancelRequested(reason="y"))
                                  for i in range(20)))
    assert sorted(ev.seq for b in reading for ev in b) == sorted(seqs)
    assert min(more) > max(seqs) and len(set(more)) == 20
    # the replay's sink is gone with it; the bulk reader stays for the connection's own inbox (``Replies``)
    reader = bus.nc._ps
    assert isinstance(reader, bulkparse.BulkParser) and list(reader.sinks) == [str(bus.replies._sid).encode()]
    again = await bus.emit(workspace=ws, run_id=f"{ws}-r0", attempt=1, event_type="cancel.requested",
                           payload=CancelRequested(reason="x"))
    assert again == seqs[0]  # a repeat: the server's duplicate ack names the stored sequence
    assert run_subject(ws, f"{ws}-r0", "cancel.requested") == await bus.subject_at("RUNS", again)


@pytest.mark.parametrize("routed", [True, False])
async def test_answers_read_off_the_wire_are_the_msgs_nats_py_builds(bootstrapped: str, monkeypatch: pytest.MonkeyPatch,
                                                                     routed: bool) -> None:
    """The inbox's answers come from the bulk reader (``rawmsgs.route``) where this nats-py is the one it was
    checked against, else through nats-py's own subscription: either way a request gets the Msg nats-py builds (a
    plain answer, one with headers, a status line the server writes, nobody listening)."""
    if not routed:
        monkeypatch.setattr(rawmsgs, "_CHECKED", False)
    bus = await connect(bootstrapped, name="test-replies")
    try:
        plain, headed = f"svc.{uuid.uuid4().hex[:8]}", f"svc.{uuid.uuid4().hex[:8]}"
        await _responder(bus, plain)
        await _responder(bus, headed, headers={"x-answer": "yes"})
        answer = await bus.replies.request(plain, b"q", timeout=5)
        assert (answer.subject.startswith(bus.replies.prefix), answer.reply, answer.data, answer.headers) == (
            True, "", b"re:q", None)
        answer = await bus.replies.request(headed, b"q", timeout=5)
        assert (answer.data, answer.headers) == (b"re:q", {"x-answer": "yes"})
        missing = await bus.replies.request("$JS.API.DIRECT.GET.HISTORY", msgspec.json.encode({"seq": 10**15}),
                                            timeout=5)
        assert (missing.data, missing.headers) == (b"", {"Status": "404", "Description": "Message Not Found"})
        with pytest.raises(nats.errors.NoRespondersError):
            await bus.replies.request(f"nobody.{uuid.uuid4().hex[:8]}", b"q", timeout=5)
        assert (bus.replies._sid is not None, isinstance(bus.nc._ps, bulkparse.BulkParser)) == (routed, routed)
    finally:
        await bus.close()


@pytest.mark.parametrize("routed", [True, False])
async def test_a_batch_direct_get_gathers_its_messages_then_its_end(bootstrapped: str, monkeypatch: pytest.MonkeyPatch,
                                                                    routed: bool) -> None:
    """``Replies.request(gathered=…)``: every message a batch direct get answers with, in order, then the status
    that ends it (204 with what is left, or 404 when nothing matched), routed off the wire or through nats-py's
    subscription; a plain request made meanwhile gets its own answer. ``streams.history`` on one subject reads the
    same events batched as one at a time, over several batches too; ``last_per_subject`` the last of each
    subject."""
    if not routed:
        monkeypatch.setattr(rawmsgs, "_CHECKED", False)
    bus = await connect(bootstrapped, name="test-replies-batch")
    try:
        name = f"B{uuid.uuid4().hex[:8]}"
        await bus.js.add_stream(name=name, subjects=[f"{name}.>"], allow_direct=True)
        for i in range(5):
            await bus.js.publish(f"{name}.a", f"a{i}".encode(), headers={"x-i": str(i)})
            if i < 3:
                await bus.js.publish(f"{name}.b.{i % 2}", f"b{i}".encode())
        get = f"$JS.API.DIRECT.GET.{name}"
        await _responder(bus, plain := f"svc.{uuid.uuid4().hex[:8]}")
        async def gather(request: dict[str, object]) -> tuple[list[Msg], Msg]:
            msgs: list[Msg] = []
            return msgs, await bus.replies.request(get, msgspec.json.encode(request), timeout=5, gathered=msgs)

        (msgs, end), answer = await asyncio.gather(gather({"seq": 1, "next_by_subj": f"{name}.a", "batch": 10}),
                                                   bus.replies.request(plain, b"q", timeout=5))
        assert answer.data == b"re:q"
        assert [(m.data, m.headers["x-i"], m.headers["Nats-Subject"]) for m in msgs] == [  # type: ignore[index]
            (f"a{i}".encode(), str(i), f"{name}.a") for i in range(5)]
        assert (end.headers or {}).get("Status") == "204" and (end.headers or {})["Nats-Num-Pending"] == "0"
        msgs, end = await gather({"seq": 1, "next_by_subj": f"{name}.a", "batch": 2})
        assert ([m.data for m in msgs], (end.headers or {}).get("Nats-Num-Pending")) == ([b"a0", b"a1"], "3")
        msgs, end = await gather({"seq": 1, "next_by_subj": f"{name}.none", "batch": 2})
        assert (msgs, (end.headers or {}).get("Status")) == ([], "404")

        monkeypatch.setattr(streams, "BATCH", 2)  # three batches for the five
        batched = await streams.history(bus, name, f"{name}.a")
        one_by_one = await streams.history(bus, name, f"{name}.>")  # a wildcard: one direct get a message
        assert [(ev.data, ev.seq, ev.time, ev.stored) for ev in batched] == [
            (ev.data, ev.seq, ev.time, ev.stored) for ev in one_by_one if ev.nats_subject == f"{name}.a"]
        assert [ev.data for ev in batched] == [f"a{i}".encode() for i in range(5)]
        last = await streams.last_per_subject(bus, name, f"{name}.>", up_to=8)  # the stream's last
        assert [(ev.nats_subject, ev.data) for ev in last] == [
            (f"{name}.b.1", b"b1"), (f"{name}.b.0", b"b2"), (f"{name}.a", b"a4")]
        before = await streams.last_per_subject(bus, name, f"{name}.>", up_to=4)  # a0 b0 a1 b1: the last of each
        assert [(ev.nats_subject, ev.data) for ev in before] == [
            (f"{name}.b.0", b"b0"), (f"{name}.a", b"a1"), (f"{name}.b.1", b"b1")]
        assert await streams.last_per_subject(bus, name, f"{name}.none.>", up_to=8) == []
    finally:
        await bus.close()
