"""Read stored messages on a subject filter in stream order: a snapshot (``replay``) or a live feed (``follow``).

``replay``'s consumer is ephemeral (no durable name, no acks, memory state, removed afterwards and by the server's
inactivity threshold should we crash), so replays never disturb service consumers and leave nothing behind.
Reading stops at the pending count taken when the consumer is created: a replay is a snapshot, it never waits
for messages that are still to come. ``batches`` is the same snapshot as Events, a fetched batch at a time (an
audit's `tau events` reads tens of thousands); ``follow`` without ``live`` reads through it, and with ``live``
through an ordered push consumer that keeps going.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from taugrid.bus import kept, rawmsgs
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.errors import MISSING, TIMEOUT, UNAVAILABLE, unavailable
from taugrid.bus.topology import HISTORY_STREAM
from taugrid.core.errors import PermissionDenied, TemporaryError

_BATCH = 256
_REPLAY_BATCH = 4096  # messages per pull request when streaming history: fewer round trips, bounded memory


async def replay(bus: Bus, *, stream: str, subject: str, limit: int = 100_000) -> list[Msg]:
    """All messages of ``stream`` matching ``subject`` (oldest first), at most ``limit``."""
    config = ConsumerConfig(
        # Named, so the create request's subject carries the filter (people's permissions allow only their
        # workspaces' filters).
        name=f"replay-{secrets.token_hex(16)}",
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.ALL,
        mem_storage=True,
        inactive_threshold=30.0,
        filter_subject=subject,
    )
    try:
        psub = await bus.guarded(bus.js.pull_subscribe(subject, stream=stream, config=config))
    except MISSING as exc:
        raise TemporaryError(f"stream {stream} not found (is the bus bootstrapped?)", delay=2.0) from exc
    except UNAVAILABLE as exc:
        raise TemporaryError(f"cannot replay {subject} from {stream}: {exc!r}", delay=1.0) from exc
    out: list[Msg] = []
    name = ""
    try:
        info = await psub.consumer_info()
        name = info.name
        want = min(int(info.num_pending or 0), limit)
        idle = 0
        while len(out) < want and idle < 5:
            try:
                msgs = await psub.fetch(min(_BATCH, want - len(out)), timeout=1.0)
            except TIMEOUT:
                idle += 1
                continue
            out.extend(msgs)
        if len(out) < want:
            raise TemporaryError(f"replay of {subject} from {stream} stalled at {len(out)}/{want}", delay=1.0)
    except UNAVAILABLE as exc:
        raise unavailable(f"replay of {subject} from {stream}", exc) from exc
    finally:
        with contextlib.suppress(*UNAVAILABLE):
            await psub.unsubscribe()
        if name:
            with contextlib.suppress(*UNAVAILABLE):  # MISSING too: the server may have removed it already
                await bus.js.delete_consumer(stream, name)
    return out


@dataclass
class ReplayCursor:
    """Where a ``follow`` stands: ``caught_up()`` says whether everything stored on its subject so far has been
    handed out: the server has nothing left for its consumer, and the last message it delivered (which may still
    be on its way, or in the local buffer) has been yielded."""

    sub: Any = None
    yielded: int = 0  # consumer sequence (the consumer's delivery count) of the last message handed out

    async def caught_up(self) -> bool:
        if self.sub is None:
            return False
        try:
            info = await self.sub.consumer_info()
        except UNAVAILABLE:
            return False  # the ordered consumer is being recreated: not known yet
        delivered = int(info.delivered.consumer_seq or 0) if info.delivered else 0
        return int(info.num_pending or 0) == 0 and self.yielded >= delivered


async def batches(
    bus: Bus, subject: str, *, stream: str = "RUNS", since: dt.datetime | None = None, batch: int = _REPLAY_BATCH,
) -> AsyncGenerator[list[Event], None]:
    """The events stored on ``subject`` (from ``since`` when given) in stream order, one pull request's worth
    (``batch`` messages) at a time, through one ephemeral pull consumer (no acks, memory state, deleted at the
    end). A missing stream yields nothing.

    Built for tens of thousands of events a second: the pull requests are sent by hand (``no_wait``: the server
    answers at once with what it holds, then a status) to an inbox whose messages come raw from the wire
    (``rawmsgs``, ``bulkparse``: each read buffer walked once, no regular expression, ``Msg``, queue, task or
    callback per message) and are read into Events a request at a time (headers and reply subjects in bulk);
    the next request is sent as soon as one is answered, so the server delivers it while this one is read and
    handed over. Where ``rawmsgs`` cannot hook this nats-py, the inbox is an ordinary subscription with a
    callback. Either way a message is read by ``envelope.from_message`` (its run, workspace and type from the
    subject), and one whose headers contradict its subject is left out.

    RUNS (``stream``'s default) is read from HISTORY, where its events stay (``bus/history.py``): ``subject``, a
    filter on RUNS' subjects, is read on the runs' subjects there and what it does not match left out."""
    asked = subject
    if stream == kept.RUNS_STREAM:
        stream, subject = HISTORY_STREAM, kept.stored_filter(subject)
    name = f"tau-{secrets.token_hex(16)}"  # named, so the create request's subject carries the filter
    config = ConsumerConfig(
        name=name,
        ack_policy=AckPolicy.NONE,
        deliver_policy=DeliverPolicy.BY_START_TIME if since else DeliverPolicy.ALL,
        opt_start_time=since,  # nats-py writes it as RFC 3339 in UTC
        mem_storage=True,
        inactive_threshold=30.0,
        filter_subject=subject,
    )
    try:
        info = await bus.guarded(bus.js.add_consumer(stream, config=config))
    except MISSING:
        return
    except UNAVAILABLE as exc:
        raise TemporaryError(f"cannot replay {subject} from {stream}: {exc!r}", delay=1.0) from exc
    inbox = _Inbox()
    sub = None
    try:
        sub = await bus.nc.subscribe(bus.nc.new_inbox(), cb=inbox.collect_msg)
        raw = rawmsgs.route(bus.nc, sub._id, inbox.collect_raw)  # lists of wire messages, a buffer's at a time
        left = int(info.num_pending or 0)
        idle = 0
        request, reply = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}", sub.subject

        async def ask() -> _Request:
            asked = inbox.start(min(batch, left))
            await bus.nc.publish(request, json.dumps({"batch": asked.wanted, "no_wait": True}).encode(), reply=reply)
            return asked

        current = await ask() if left > 0 else None
        while current is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(current.answered.wait(), timeout=1.0)
            left -= current.count
            idle = idle + 1 if not current.count else 0
            ahead = await ask() if left > 0 and idle < 5 else None  # delivered while this one is read
            if current.count:
                events = await rawmsgs.stored_events(bus.nc, current.raws) if raw else current.events()
                if stream == HISTORY_STREAM:
                    events = kept.wanted(asked, events)
                yield [ev for ev in events if not ev.problem]  # contradicting headers: never read
            current = ahead
        if left > 0:
            raise TemporaryError(f"replay of {subject} from {stream} stalled with {left} to go", delay=1.0)
    except UNAVAILABLE as exc:
        raise unavailable(f"replay of {subject} from {stream}", exc) from exc
    finally:
        if sub is not None:
            rawmsgs.unroute(bus.nc, sub._id)
            with contextlib.suppress(*UNAVAILABLE):
                await sub.unsubscribe()
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):  # MISSING too: removed already
            await bus.guarded(bus.js.delete_consumer(stream, name))


@dataclass
class _Request:
    """One pull request's answer so far: its stored messages (raw, or as nats-py's ``Msg`` without the hook),
    and whether it is done (as many as asked for, or a status from the server)."""

    wanted: int
    raws: list[rawmsgs.Raw] = field(default_factory=list)
    msgs: list[Msg] = field(default_factory=list)
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def count(self) -> int:
        return len(self.raws) + len(self.msgs)

    def events(self) -> list[Event]:
        out = []
        for m in self.msgs:
            tokens = m.reply.split(".")
            out.append(from_message(m.subject, m.headers, m.data, seq=rawmsgs.stream_seq(tokens),
                                    stored=rawmsgs.stored_at(tokens)))
        return out


class _Inbox:
    """Where a replay's pull requests are answered. A stored message comes with its ``$JS.ACK…`` reply subject;
    what comes without one is the server's status ending a request (404 no messages, 408 request timeout, 409).
    Messages go to the latest request in the order they arrive, which is stream order: one still arriving for a
    request given up on (slower than a second) is counted with the next."""

    def __init__(self) -> None:
        self.current = _Request(0)

    def start(self, wanted: int) -> _Request:
        self.current = _Request(wanted)
        return self.current

    def collect_raw(self, frames: list[rawmsgs.Raw]) -> None:
        """A run of wire messages; one without a reply subject comes alone (``bulkparse``)."""
        current = self.current
        if not frames[0][1]:
            current.answered.set()
            return
        current.raws += frames
        if len(current.raws) >= current.wanted:
            current.answered.set()

    async def collect_msg(self, msg: Msg) -> None:
        current = self.current
        if not msg.reply:
            current.answered.set()
            return
        current.msgs.append(msg)
        if len(current.msgs) >= current.wanted:
            current.answered.set()


async def follow(
    bus: Bus, subject: str, *, stream: str = "RUNS", since: dt.datetime | None = None, live: bool = False,
    idle_timeout: float = 1.0, cursor: ReplayCursor | None = None,
) -> AsyncGenerator[Event, None]:
    """Events on ``subject`` in stream order (from ``since`` when given) through an ordered consumer; with
    ``live``, keep going with new ones, else stop at the last stored one. A missing stream yields nothing. A
    ``cursor`` is kept up to date with what has been yielded. Without ``live`` or a cursor the stored history
    is read in batches (``batches``). RUNS is read from HISTORY, as ``batches`` says."""
    if not live and cursor is None:
        feed = batches(bus, subject, stream=stream, since=since)
        async with contextlib.aclosing(feed):
            async for got in feed:
                for ev in got:
                    yield ev
        return
    asked = subject
    if stream == kept.RUNS_STREAM:
        stream, subject = HISTORY_STREAM, kept.stored_filter(subject)
    everything = stream != HISTORY_STREAM or kept.whole(asked)
    # Named, so the create request's subject carries the filter and the server's permissions can confine it
    # to the caller's workspaces.
    name = f"tau-{secrets.token_hex(16)}"
    config = ConsumerConfig(
        name=name,
        deliver_policy=DeliverPolicy.BY_START_TIME if since else DeliverPolicy.ALL,
        opt_start_time=since,  # nats-py writes it as RFC 3339 in UTC
        inactive_threshold=60.0,
    )
    try:
        sub = await bus.guarded(bus.js.subscribe(subject, stream=stream, ordered_consumer=True, config=config))
    except MISSING:
        return
    if cursor is not None:
        cursor.sub = sub
    try:
        info = await bus.js.stream_info(stream)
        if not live and info.state.messages == 0:
            return
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_timeout if not live else 3600)
            except TIMEOUT:
                if live:
                    continue
                return
            meta = msg.metadata
            ev = from_message(msg.subject, msg.headers, msg.data, seq=meta.sequence.stream,
                              stored=meta.timestamp.timestamp())
            # headers contradicting the subject: never read (envelope.from_message)
            if not ev.problem and (everything or kept.matches(asked, ev.nats_subject)):
                yield ev
            if cursor is not None:
                cursor.yielded = meta.sequence.consumer
            if not live and meta.num_pending == 0:
                return
    finally:
        with contextlib.suppress(*UNAVAILABLE):  # a draining or closed connection drops it anyway
            await sub.unsubscribe()
        # Unsubscribing leaves the server's consumer until its inactive threshold: a client that replays
        # often (a poll per run) would pile up thousands of them and reach the server's consumer limit.
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
            await bus.guarded(bus.js.delete_consumer(stream, name))
