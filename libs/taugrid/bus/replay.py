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
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.errors import MISSING, TIMEOUT, UNAVAILABLE, unavailable
from taugrid.core.errors import PermissionDenied, TemporaryError

_BATCH = 256
_REPLAY_BATCH = 1024  # messages per pull request when streaming history: fewer round trips, bounded memory


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
    """The events stored on ``subject`` (from ``since`` when given) in stream order, ``batch`` at a time,
    through one ephemeral pull consumer (no acks, memory state, deleted at the end). A missing stream yields
    nothing.

    The pull requests are sent by hand (``no_wait``: the server answers at once with what it holds, then a status)
    to an inbox whose messages a callback collects, instead of through nats-py's ``fetch``, which awaits every
    message of a batch with a timer of its own (a task and a timeout per message: most of a long replay's time)."""
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
    got: list[Msg] = []
    answered = asyncio.Event()  # the current request is done: its messages, or a status, arrived

    async def collect(msg: Msg) -> None:
        if not msg.data and msg.headers and msg.headers.get("Status"):
            answered.set()  # 404 no messages, 408 request timeout, 409: this request delivers nothing more
            return
        got.append(msg)
        if len(got) >= wanted:
            answered.set()

    inbox = bus.nc.new_inbox()
    sub = None
    wanted = 0
    try:
        sub = await bus.nc.subscribe(inbox, cb=collect)
        left = int(info.num_pending or 0)
        idle = 0
        while left > 0 and idle < 5:
            wanted, got, answered = min(batch, left), [], asyncio.Event()
            await bus.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                                 json.dumps({"batch": wanted, "no_wait": True}).encode(), reply=inbox)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answered.wait(), timeout=1.0)
            if not got:
                idle += 1
                continue
            idle = 0
            left -= len(got)
            # a message whose headers contradict its subject is never read (envelope.from_message)
            yield [ev for ev in (from_message(m.subject, m.headers, m.data, seq=_stream_seq(m.reply),
                                              stored=_stored_at(m.reply)) for m in got) if not ev.problem]
        if left > 0:
            raise TemporaryError(f"replay of {subject} from {stream} stalled with {left} to go", delay=1.0)
    except UNAVAILABLE as exc:
        raise unavailable(f"replay of {subject} from {stream}", exc) from exc
    finally:
        if sub is not None:
            with contextlib.suppress(*UNAVAILABLE):
                await sub.unsubscribe()
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):  # MISSING too: removed already
            await bus.guarded(bus.js.delete_consumer(stream, name))


def _stream_seq(reply: str) -> int:
    """The stream sequence from a JetStream reply subject, as nats-py's ``Msg.metadata`` reads it but without
    building the rest of the metadata per message: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...`` (9
    tokens) or, with a domain and an account hash, ``$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.
    <sseq>...`` (11 or 12 tokens)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5])
    return int(tokens[7]) if len(tokens) >= 11 else 0


def _stored_at(reply: str) -> float:
    """When the stream stored the message (epoch seconds), from the same reply subject: its second-to-last token
    is the store time in nanoseconds (``…<sseq>.<cseq>.<timestamp>.<pending>``)."""
    tokens = reply.split(".")
    return int(tokens[-2]) / 1e9 if len(tokens) >= 9 else 0.0


async def follow(
    bus: Bus, subject: str, *, stream: str = "RUNS", since: dt.datetime | None = None, live: bool = False,
    idle_timeout: float = 1.0, cursor: ReplayCursor | None = None,
) -> AsyncGenerator[Event, None]:
    """Events on ``subject`` in stream order (from ``since`` when given) through an ordered consumer; with
    ``live``, keep going with new ones, else stop at the last stored one. A missing stream yields nothing. A
    ``cursor`` is kept up to date with what has been yielded. Without ``live`` or a cursor the stored history
    is read in batches (``batches``)."""
    if not live and cursor is None:
        feed = batches(bus, subject, stream=stream, since=since)
        async with contextlib.aclosing(feed):
            async for got in feed:
                for ev in got:
                    yield ev
        return
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
            ev = from_message(msg.subject, msg.headers, msg.data, seq=meta.sequence.stream)
            if not ev.problem:  # headers contradicting the subject: never read (envelope.from_message)
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
