"""HISTORY and AUDIT take what arrives on their feeds' delivery subjects (``topology.FEEDS``: ``feed.<durable>``)
as RUNS' own events, so nobody may put anything there, attacked on a real nats-server with authentication on
(``tests/secure_nats.py``: alice researches in ``vision``, bob in ``language``, carol is a platform admin).

- No identity publishes on a feed subject: not a person, not a service, not the bootstrap identity
  (``permissions.STREAM_GUARD``).
- A person reads only her workspaces' runs in HISTORY (``h.<ws>.>``) and AUDIT (``a.<ws>.>``).
- A push consumer delivers wherever its creator says, whatever she may publish, and a sourcing stream knows its
  feed's deliveries by the consumer name in their ack subject. Taken for the feed's, a delivery would be stored as
  RUNS' event (under a subject and at a sequence of her stream's) and RUNS' genuine events up to that sequence
  skipped: lost, since RUNS lets an event go once the feed's flow control acked it. ``permissions.durable_guard``
  refuses her a consumer of a feed's name on every stream; under any other name nats-server ignores what it
  delivers there. (nats-server 2.15.1 was also seen to ignore a consumer of the feed's name on another stream,
  its delivery sequence made the one the source expects next: the refusal does not rest on that.)
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.errors import NoStreamResponseError

from taugrid.access import permissions
from taugrid.bus import Bus, history, streams
from taugrid.bus.replay import replay
from taugrid.bus.topology import FEEDS, HISTORY_STREAM
from taugrid.core.errors import PermissionDenied
from tests.secure_nats import SecureNats, started


@pytest.fixture
async def alice(secure_nats: SecureNats) -> AsyncIterator[Bus]:
    bus = await secure_nats.connect("alice")
    yield bus
    await bus.close()


async def test_no_person_service_or_bootstrap_publishes_on_a_feed_subject(secure_nats: SecureNats) -> None:
    who = ["alice", "bob", "carol", permissions.BOOTSTRAP, *permissions.SERVICE_ROLES]
    for name in who:
        bus = await secure_nats.connect(name)
        try:
            for feed in FEEDS:
                with pytest.raises(PermissionDenied, match=rf"publish to feed\.{feed.durable} for {name}"):
                    await bus.guarded(bus.js.publish(feed.deliver, b"{}", timeout=5))
        finally:
            await bus.close()
    # the refusals are the permissions': the break-glass identity, allowed everything, is not refused (no stream
    # answers a publish there: only a feed's source listens, on its own subject)
    breakglass = await secure_nats.connect(permissions.BREAK_GLASS)
    try:
        with pytest.raises(NoStreamResponseError):
            await breakglass.guarded(breakglass.js.publish("feed.none", b"{}", timeout=1))
    finally:
        await breakglass.close()


async def _emit(bus: Bus, ws: str, run: str, *, lane: str = "", kind: str = "submit.requested") -> int:
    """A run event stored in RUNS: a person's request (AUDIT keeps it), or as a stage would publish ``kind``."""
    subject = f"run.{ws}.{run}.{kind}" + (f".{lane}" if lane else "")
    ack = await bus.guarded(bus.js.publish(subject, b"{}", headers={"Nats-Msg-Id": uuid.uuid4().hex}))
    return int(ack.seq)


@pytest.mark.parametrize(("stream", "subject"), [
    ("HISTORY", "h.language.>"), ("HISTORY", "h.*.>"), ("HISTORY", ">"), ("AUDIT", "a.language.>"),
    ("AUDIT", "a.*.>"), ("AUDIT", "run.language.>"),
])
async def test_a_researcher_reads_no_other_workspaces_history_or_audit(alice: Bus, stream: str,
                                                                       subject: str) -> None:
    with pytest.raises(PermissionDenied, match=f"consumer.create.{stream.lower()}"):
        await replay(alice, stream=stream, subject=subject)


async def test_a_researcher_reads_her_workspaces_history_and_audit_and_gets_nothing_by_direct_get(
        secure_nats: SecureNats, alice: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    await _emit(alice, "vision", run)  # AUDIT keeps her request; HISTORY what a stage publishes of the run
    boot = await secure_nats.connect("bootstrap")
    try:
        seq = await _emit(boot, "vision", run, kind="submit.accepted")
        await history.run_events(boot, "vision", run, through=seq)
    finally:
        await boot.close()
    assert [m.subject for m in await replay(alice, stream="HISTORY", subject=f"h.vision.{run}")] == [
        f"h.vision.{run}"]
    for _ in range(100):  # AUDIT's feed copies it too
        if got := await replay(alice, stream="AUDIT", subject=f"a.vision.{run}"):
            break
        await asyncio.sleep(0.02)
    assert [m.subject for m in got] == [f"a.vision.{run}"]
    # a direct get names no filter a person's permissions could confine: none is granted, her own run's neither
    for api, body in ((f"DIRECT.GET.HISTORY.h.vision.{run}", {}), (f"DIRECT.GET.HISTORY.h.language.{run}", {}),
                      ("DIRECT.GET.HISTORY", {"seq": 1}), ("STREAM.MSG.GET.HISTORY", {"seq": 1}),
                      ("DIRECT.GET.AUDIT", {"seq": 1}), ("STREAM.PURGE.HISTORY", {}),
                      ("STREAM.MSG.DELETE.HISTORY", {"seq": 1})):
        with pytest.raises(PermissionDenied):
            await alice.guarded(alice.nc.request(f"$JS.API.{api}", json.dumps(body).encode(), timeout=5))


async def _consumer(bus: Bus, stream: str, name: str, filter_subject: str, deliver: str, start: int) -> dict:
    """A push consumer as any client may ask for one (the create subject names its filter)."""
    body = {"stream_name": stream, "config": {
        "name": name, "ack_policy": "none", "filter_subject": filter_subject, "deliver_subject": deliver,
        "deliver_policy": "by_start_sequence", "opt_start_seq": start, "inactive_threshold": 30_000_000_000}}
    reply = await bus.guarded(bus.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter_subject}",
                                             json.dumps(body).encode(), timeout=5))
    return dict(json.loads(reply.data))


async def _held(boot: Bus) -> dict[str, int]:
    info = await boot.js.stream_info(HISTORY_STREAM, subjects_filter=">")
    return dict(info.state.subjects or {})


async def test_a_consumer_delivering_to_a_feed_stores_no_forged_event_and_skips_no_genuine_one(
        tmp_path: Path) -> None:
    """On a server of its own, so the history feed's delivery count is known. Her workspace's HISTORY is padded
    with one laned acceptance more than the history feed has delivered (laned events come through the other feed,
    so its count stays; published by the bootstrap identity, as the submitter would: people publish only the
    requests AUDIT keeps), then aims consumers at the feed's subject, their deliveries counted so the
    last one's delivery sequence is the next the feed's source expects, at a stream sequence past the last it
    took: named as the feed, the server would store it and skip RUNS' events up to that sequence."""
    async with started(tmp_path) as server:
        alice, boot = await server.connect("alice"), await server.connect("bootstrap")
        try:
            run, pad = f"r-{uuid.uuid4().hex[:12]}", f"p-{uuid.uuid4().hex[:12]}"
            first = await _emit(boot, "vision", run, kind="submit.accepted")
            await history.run_events(boot, "vision", run, through=first)
            feed = await boot.js.consumer_info("RUNS", "history")
            delivered = int(feed.delivered.consumer_seq)
            padded = [await _emit(boot, "vision", pad, lane="high", kind="submit.accepted")
                      for _ in range(delivered + 1)]
            await history.run_events(boot, "vision", pad, through=padded[-1])
            _, last = await streams.bounds(boot, HISTORY_STREAM)
            start = last - delivered  # her HISTORY consumer's deliveries: the last `delivered + 1` messages
            for spec in FEEDS:  # a consumer named as a feed is refused on every stream she may read
                for stream, filt in (("HISTORY", "h.vision.>"), ("AUDIT", "a.vision.>"), ("LOGS", "log.vision.>"),
                                     ("RUNS", "run.vision.>")):
                    with pytest.raises(PermissionDenied, match=f"consumer.create.{stream.lower()}.{spec.durable}"):
                        await _consumer(alice, stream, spec.durable, filt, spec.deliver, start)
            # under any other name the server lets her make it, and it delivers there: the source ignores it
            made = [await _consumer(alice, stream, uuid.uuid4().hex, filt, "feed.history", start)
                    for stream, filt in (("HISTORY", "h.vision.>"), ("RUNS", "run.vision.>"))]
            assert [m.get("error") for m in made] == [None, None]
            await asyncio.sleep(1.0)
            got = [await boot.js.consumer_info(m["stream_name"], m["name"]) for m in made]
            assert [c.delivered.consumer_seq for c in got] == [delivered + 1, delivered + 1]  # her padding

            # the feed goes on: a genuine event after it is copied, nothing was skipped nor added
            second = await _emit(boot, "vision", run, kind="submit.accepted")
            events = await history.run_events(boot, "vision", run, through=second)
            assert [(ev.seq, ev.type, ev.nats_subject) for ev in events] == [
                (first, "submit.accepted", f"run.vision.{run}.submit.accepted"),
                (second, "submit.accepted", f"run.vision.{run}.submit.accepted")]
            assert [ev.seq for ev in await history.run_events(boot, "vision", pad)] == padded
            assert await _held(boot) == {f"h.vision.{run}": 2, f"h.vision.{pad}": delivered + 1}
        finally:
            await alice.close()
            await boot.close()
