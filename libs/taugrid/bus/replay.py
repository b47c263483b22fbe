"""Read stored messages on a subject filter in stream order: a snapshot (``replay``) or a live feed (``follow``).

``replay``'s consumer is ephemeral (no durable name, no acks, memory state, removed afterwards and by the server's
inactivity threshold should we crash), so replays never disturb service consumers and leave nothing behind.
Reading stops at the pending count taken when the consumer is created: a replay is a snapshot, it never waits
for messages that are still to come. ``batches`` is the same snapshot as Events, a fetched batch at a time (an
audit's `tau events` reads tens of thousands); ``follow`` without ``live`` reads through it, and with ``live``
through ordered push consumers that keep going.

RUNS (``batches``' and ``follow``'s default stream) keeps only what the stages have still to read (interest
retention): its events are read where they stay, HISTORY (``h.<ws>.<run>``) and, for the kinds AUDIT keeps and
HISTORY does not copy (the request, a cancellation's request, the end, the seal: ``topology.AUDIT_KEPT_EVENTS``),
AUDIT (``a.<ws>.<run>``): one consumer on each, merged by the RUNS sequence every copy reads back at
(``envelope.from_message``), each sequence once (``bus/kept.py``). An earlier release's AUDIT kept its events under
RUNS' own subjects (``run.<ws>.<run>.<stage>.<outcome>``): those are not read here (``bus/auditread`` reads them for
the evidence), so a run such an AUDIT alone still keeps reads without its kept kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import json
import secrets
import time
from bisect import bisect_right
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from taugrid.bus import kept, rawmsgs
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.errors import MISSING, TIMEOUT, UNAVAILABLE, unavailable
from taugrid.bus.topology import AUDIT_STREAM, HISTORY_STREAM
from taugrid.core.errors import PermissionDenied, TemporaryError
from taugrid.core.publishing import subject_matches

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


_STALL_S = 1.0  # a live follow hands out what it holds back for a lagging consumer after this long without news
_SEQ = attrgetter("seq")
_PROBLEM = attrgetter("problem")


@dataclass
class _Part:
    """One ordered consumer of a ``follow``: what it has delivered, and what of that is still held back."""

    stream: str
    name: str
    sub: Any
    backlog: int  # messages its filter matched when it was made (delivered by then, or pending)
    # A copy (HISTORY, AUDIT) read beside RUNS' own live tail: only what it held when it was made is read from it;
    # a copy made after that is of an event RUNS itself hands out (``follow``)
    backlog_only: bool = False
    received: int = 0
    pending: int = 0  # the server's pending count with the last message received
    last: int = 0  # the highest sequence (``Event.seq``) received
    yielded: int = 0  # consumer sequence (the consumer's delivery count) of the last message handed out
    held: int = 0  # received and not handed out yet (a merge waiting for the other part)
    upto: int = 0  # the highest consumer sequence received

    def behind(self) -> bool:
        """Whether it has stored messages still to deliver (as the server said with its last one, or with its
        consumer before the first; for ``backlog_only``, of those it held when made): the merge holds back what
        comes after its last."""
        if self.backlog_only:
            return self.upto < self.backlog
        return self.pending > 0 if self.received else self.backlog > 0

    async def caught_up(self) -> bool:
        if self.held:
            return False
        try:
            info = await self.sub.consumer_info()
        except UNAVAILABLE:
            return False  # the ordered consumer is being recreated: not known yet
        delivered = int(info.delivered.consumer_seq or 0) if info.delivered else 0
        return int(info.num_pending or 0) == 0 and self.yielded >= delivered


@dataclass
class ReplayCursor:
    """Where a ``follow`` stands: ``caught_up()`` says whether everything stored on its subject so far has been
    handed out: for each of its consumers (two for RUNS: HISTORY's and AUDIT's), the server has nothing left, and
    the last message it delivered (which may still be on its way, in the local buffer, or held back to be handed
    out in sequence order) has been yielded."""

    parts: list[_Part] = field(default_factory=list)

    async def caught_up(self) -> bool:
        if not self.parts:
            return False
        return all([await part.caught_up() for part in self.parts])


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

    RUNS (``stream``'s default) is read from HISTORY and AUDIT, where its events stay (module docstring): one such
    consumer on each (``subject``, a filter on RUNS' subjects, read on the runs' subjects there, ``since`` on
    both), merged as they stream in (``_in_runs_order``: nothing is read whole), and what ``subject`` does not
    match left out. A batch is then what the merge can hand out in order, not ``batch`` events."""
    if stream != kept.RUNS_STREAM:
        feed = _stored(bus, stream, subject, since=since, batch=batch)
        async with contextlib.aclosing(feed):
            async for events in feed:
                yield [ev for ev in events if not ev.problem]  # contradicting headers: never read
        return
    feeds = [_stored(bus, HISTORY_STREAM, kept.stored_filter(subject), since=since, batch=batch),
             _stored(bus, AUDIT_STREAM, kept.audit_filter(subject), since=since, batch=batch)]
    async with contextlib.AsyncExitStack() as stack:
        for feed in feeds:  # each consumer goes as soon as the caller stops reading
            await stack.enter_async_context(contextlib.aclosing(feed))
        async for events in _in_runs_order(feeds):
            got = kept.wanted(subject, events)
            if any(map(_PROBLEM, got)):  # contradicting headers: never read
                got = [ev for ev in got if not ev.problem]
            if got:
                yield got


async def _in_runs_order(feeds: list[AsyncGenerator[list[Event], None]]) -> AsyncGenerator[list[Event], None]:
    """The events of ``feeds`` (each roughly in RUNS' order: one stream's copies, which two feeds write at their
    own pace) merged by ``Event.seq``, each sequence once, as they come: what every feed still going has passed
    (its highest sequence so far, the lowest of those) is handed out, the rest held until then, all of it at the
    end. The next batch is asked of the feed holding the merge back, so what is held stays about a batch. An
    event a feed delivers after a later one was handed out (its feed lagging the other's) comes in the next
    batch."""
    last = [0] * len(feeds)  # the highest sequence each has given; 0: nothing yet (a sequence is at least 1)
    going = list(range(len(feeds)))
    held: list[Event] = []
    seen = _Seen()
    while going:
        i = min(going, key=last.__getitem__)
        try:
            got = await anext(feeds[i])
        except StopAsyncIteration:
            going.remove(i)
            got = []
        if got:
            top = max(map(_SEQ, got))
            last[i] = max(last[i], top)
            held += got
        if not held:
            continue
        marks = [last[j] for j in going]
        if 0 in marks:
            continue  # a feed that has given nothing yet may start anywhere
        held.sort(key=_SEQ)  # two sorted runs, mostly: linear
        cut = bisect_right(held, min(marks), key=_SEQ) if marks else len(held)
        out, held = seen.fresh(held[:cut]), held[cut:]
        if out:
            yield out


class _Seen:
    """The sequences handed out, a bit each from the first (a set would cost ~60 bytes a sequence over an audit's
    hundreds of thousands): a copy delivered twice (a feed re-established from an earlier position) goes once."""

    def __init__(self) -> None:
        self.base: int | None = None
        self.bits = bytearray()
        self.below: set[int] = set()  # the few earlier than the first (a lagging feed's)
        self.top = 0  # the highest sequence seen (0: none; a sequence is at least 1)

    def fresh(self, events: list[Event]) -> list[Event]:
        """``events`` (in sequence order) less those seen before, now seen. A batch of consecutive sequences all
        past the highest seen (a replay's usual batch: HISTORY's and AUDIT's copies together hold RUNS' sequences
        one after another) is all fresh: its bits are set a byte at a time, not an event at a time."""
        if not events:
            return events
        first, last = events[0].seq, events[-1].seq
        if self.base is None:
            self.base = first
        base, bits, out = self.base, self.bits, []
        need = ((last - base) >> 3) + 1
        if need > len(bits):
            bits.extend(bytes(need - len(bits) + 4096))
        if first > self.top and last - first + 1 == len(events) and len(set(map(_SEQ, events))) == len(events):
            _set_bits(bits, first - base, last - base)
            self.top = last
            return events
        self.top = max(self.top, last)
        for ev in events:
            off = ev.seq - base
            if off < 0:
                if ev.seq in self.below:
                    continue
                self.below.add(ev.seq)
            else:
                byte, bit = off >> 3, 1 << (off & 7)
                if bits[byte] & bit:
                    continue
                bits[byte] |= bit
            out.append(ev)
        return out


def _set_bits(bits: bytearray, low: int, high: int) -> None:
    """Set bits ``low`` to ``high`` (both included; bit ``i`` is ``1 << (i & 7)`` of byte ``i >> 3``)."""
    first, last = low >> 3, high >> 3
    low_mask, high_mask = (0xFF << (low & 7)) & 0xFF, (1 << ((high & 7) + 1)) - 1
    if first == last:
        bits[first] |= low_mask & high_mask
        return
    bits[first] |= low_mask
    bits[first + 1:last] = b"\xff" * (last - first - 1)
    bits[last] |= high_mask


async def _stored(
    bus: Bus, stream: str, subject: str, *, since: dt.datetime | None, batch: int,
) -> AsyncGenerator[list[Event], None]:
    """``batches``' read of one stream: every message stored on ``subject`` as Events (those with contradicting
    headers too), a pull request's worth at a time."""
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
                yield await rawmsgs.stored_events(bus.nc, current.raws) if raw else current.events()
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
    ``live``, keep going with new ones, else stop at the last stored one (or after ``idle_timeout`` seconds
    without one). A missing stream yields nothing. A ``cursor`` is kept up to date with what has been yielded.
    Without ``live`` or a cursor the stored history is read in batches (``batches``).

    RUNS is read from HISTORY and AUDIT, as ``batches`` says: an ordered consumer on each, their events handed
    out as they come, except that while one has stored messages still to deliver, what the other gives after its
    last is held back, so the stored history comes in RUNS' order (unless that one gives nothing to hand out for
    ``_STALL_S`` seconds: a consumer being re-established); each sequence once.

    With ``live``, RUNS' own events come from a third ordered consumer, on RUNS, made first: RUNS keeps every
    event until each feed copied it (interest retention), so what it no longer holds then is in the copies' stored
    history, and what it holds or stores later it hands out itself, in its order. The copies are read only as far
    as they held when made. Read live from the copies alone, an event could come before an earlier one whose copy
    was not made yet (AUDIT's ``recovery.gave_up`` before HISTORY's ``exec.failed``, HISTORY's feed lagging):
    nothing told the merge to wait for it. Where RUNS cannot be read (no stream, no permission) the copies are
    followed live as before."""
    if not live and cursor is None:
        feed = batches(bus, subject, stream=stream, since=since)
        async with contextlib.aclosing(feed):
            async for got in feed:
                for ev in got:
                    yield ev
        return
    asked = subject
    if stream == kept.RUNS_STREAM:
        targets = [(HISTORY_STREAM, kept.stored_filter(subject)), (AUDIT_STREAM, kept.audit_filter(subject))]
        everything = kept.whole(asked)
    else:
        targets, everything = [(stream, subject)], True
    parts: list[_Part] = []
    pumps: list[asyncio.Task[None]] = []
    queue: asyncio.Queue[tuple[int, Msg | BaseException]] = asyncio.Queue()
    tail: _Part | None = None  # RUNS' own live tail (the docstring)
    try:
        if live and stream == kept.RUNS_STREAM:
            with contextlib.suppress(PermissionDenied):
                tail = await _open(bus, stream, asked, since=since)
        for target in targets:
            part = await _open(bus, *target, since=since)
            if part is not None:
                part.backlog_only = tail is not None
                parts.append(part)
        if tail is not None:
            parts.append(tail)
        if cursor is not None:
            cursor.parts = parts
        pumps = [asyncio.create_task(_pump(i, part, queue)) for i, part in enumerate(parts)]
        held: list[tuple[int, int, int, int, Event]] = []  # (seq, arrival, part, consumer sequence, event)
        seen, arrivals, holding = _Seen(), 0, 0.0  # holding: since when the held back have waited for progress
        while parts:
            if not live and not held and not any(part.behind() for part in parts):
                return  # everything stored has come
            item: Msg | BaseException | None
            try:
                i, item = await asyncio.wait_for(queue.get(), timeout=max(0.0, holding + _STALL_S - time.monotonic())
                                                 if live and held else None if live else idle_timeout)
            except TimeoutError:
                if not live and not held:
                    return
                i, item = -1, None  # a consumer lagging (re-established): hand out what is held
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                part, meta = parts[i], item.metadata
                part.upto = max(part.upto, meta.sequence.consumer)
                if part.backlog_only and meta.sequence.consumer > part.backlog:
                    part.yielded = max(part.yielded, meta.sequence.consumer)  # RUNS' tail hands this event out
                    continue
                ev = from_message(item.subject, item.headers, item.data, seq=meta.sequence.stream,
                                  stored=meta.timestamp.timestamp())
                part.received += 1
                part.pending = int(meta.num_pending or 0)
                part.last = max(part.last, ev.seq)
                part.held += 1
                arrivals += 1
                if not held:
                    holding = time.monotonic()
                heapq.heappush(held, (ev.seq, arrivals, i, meta.sequence.consumer, ev))
            lagging = [part.last for part in parts if part.behind()]
            stalled = i < 0 or time.monotonic() - holding > _STALL_S
            mark = min(lagging) if lagging and not stalled else None
            if held and (mark is None or held[0][0] <= mark):
                holding = time.monotonic()  # progress: what is still held waits afresh
            while held and (mark is None or held[0][0] <= mark):
                _, _, j, consumer_seq, ev = heapq.heappop(held)
                # headers contradicting the subject: never read (envelope.from_message)
                if seen.fresh([ev]) and not ev.problem and (everything or subject_matches(asked, ev.nats_subject)):
                    yield ev
                parts[j].held -= 1
                parts[j].yielded = max(parts[j].yielded, consumer_seq)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for part in parts:
            with contextlib.suppress(*UNAVAILABLE):  # a draining or closed connection drops it anyway
                await part.sub.unsubscribe()
            # Unsubscribing leaves the server's consumer until its inactive threshold: a client that replays
            # often (a poll per run) would pile up thousands of them and reach the server's consumer limit.
            with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
                await bus.guarded(bus.js.delete_consumer(part.stream, part.name))


async def _open(bus: Bus, stream: str, subject: str, *, since: dt.datetime | None) -> _Part | None:
    """An ordered consumer of ``stream`` on ``subject``, and how many stored messages it matched; None when the
    stream is missing."""
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
        return None
    part = _Part(stream, name, sub, backlog=0)
    try:
        info = await sub.consumer_info()
    except BaseException:
        with contextlib.suppress(*UNAVAILABLE):
            await sub.unsubscribe()
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
            await bus.guarded(bus.js.delete_consumer(stream, name))
        raise
    part.backlog = int(info.num_pending or 0) + (int(info.delivered.consumer_seq or 0) if info.delivered else 0)
    return part


async def _pump(i: int, part: _Part, queue: asyncio.Queue[tuple[int, Msg | BaseException]]) -> None:
    """``part``'s messages onto ``queue`` as they come, tagged with ``i``; a failure too, for ``follow`` to raise."""
    try:
        while True:
            try:
                msg = await part.sub.next_msg(timeout=3600)
            except TIMEOUT:
                continue
            await queue.put((i, msg))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
        await queue.put((i, exc))
