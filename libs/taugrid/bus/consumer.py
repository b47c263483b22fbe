"""The consumer loop shared by every service.

One durable pull consumer per service (two for the stages before admission: the high priority lane's durable
beside the default one, ``topology.LANE_DURABLES``, each fetched by its own loop so a high-lane event never
waits behind the default lane's backlog); replicas bind to the same durable and the server hands each message to
one of them. Messages are keyed by run (``ce-subject``, else the run its subject names: ``envelope.ordering_key``):
one run's events are handled one after another in stream order (each waits for the previous one of its key to be
handled, not for its ack to be confirmed: the ack round trip is off a run's critical path, and a lost ack only
brings an already handled message back, which every handler takes as a repeat), different runs concurrently. A loop
made ``ordered=False`` hands a run's next event to its handler without waiting, in the order fetched, and the
handler keeps each run's order itself (the run_state projection, ``runrecord.Projector``, which writes the events of
a run that arrive meanwhile together). A fetch is one pull request that the server answers as soon as it holds a
message (``pull.Puller``: nats-py's fetch could keep a delivered message until its request expired, up to the
fetch timeout). Fetching is pipelined:
the next batch is fetched while earlier ones are still being handled, up to ``2 × batch`` messages in flight, so
one slow run never holds the others back. Every verb is confirmed by the server (sent as a request, again until
answered: ``_settle``), so one sent while a server restarts or a cluster elects a new leader is not lost.
Outcome → verb: return → ack; ``PermanentError`` or a payload that does not decode (``msgspec.DecodeError``: it
never will) → copy to DLQ, then term; ``TemporaryError`` → nak with its delay, doubled per delivery; any other
exception → nak with backoff (the server's max-deliver advisory then
lands in the DLQ stream).

Before a handler sees an event, its author is checked (``authors.Authors.problem``): headers that contradict
the subject, a ``ce-source`` that ``publishing.SERVICE_PUBLISH`` does not allow on the subject, or (on a bus with
authentication) a signature that is not that service's, and the event is dead-lettered with the reason and never
handled. While a
handler runs, ``identity.run_user`` holds the run's verified submitter from a service-published run event, so
what the handler emits names the same person.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind

from taugrid.bus import identity, metrics, tracing
from taugrid.bus.authors import Authors
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message, ordering_key, with_id
from taugrid.bus.errors import CLOSED, TIMEOUT, UNAVAILABLE
from taugrid.bus.pull import Puller
from taugrid.core import publishing
from taugrid.core.errors import NotYet, PermanentError, TemporaryError

log = logging.getLogger("taugrid.consumer")

Handler = Callable[[Event], Awaitable[None]]
ACK, TERM = b"+ACK", b"+TERM"
SETTLE_S = 30.0  # how long an ack, nak or term is sent again until the server confirms it
SETTLE_WAIT_S = 2.0  # how long one try waits for the confirmation
STUCK_S = 60.0  # a handler running this long is reported with where it waits


def report_stuck(what: str, task: asyncio.Task[Any] | None) -> None:
    """Log that ``what`` is still running after ``STUCK_S``, with the chain of awaits ``task`` waits in (what
    waits behind it waits too: a run's later events, a timer's next ticks)."""
    frames: list[str] = []
    awaited: Any = task.get_coro() if task else None
    while awaited is not None and len(frames) < 40:  # the chain of awaits, outermost first
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(f"\n  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    log.warning("%s still running after %.0fs, waiting in:%s", what, STUCK_S, "".join(frames) or " (unknown)")


def nak(delay: float) -> bytes:
    """A nak asking for redelivery after ``delay`` seconds (the server reads nanoseconds)."""
    return b"-NAK " + json.dumps({"delay": int(delay * 1e9)}).encode()


async def to_dlq(bus: Bus, msg: Msg, *, durable: str, error: str) -> None:
    """Copy a poison message to ``dlq.<stream>.<durable>`` with the error, deduplicated by stream sequence."""
    meta = msg.metadata
    headers = with_id(msg.subject, msg.headers)  # the event keeps its id; the copy gets the DLQ's
    headers.pop("Nats-Msg-Id", None)
    # a sourced message (a site's SITE_IN, a hub's SITE_<CLUSTER>) names its origin in a header the server refuses
    # in a publish ("message stream source header is not allowed"): the copy keeps it under another name
    origin = headers.pop("Nats-Stream-Source", None)
    if origin is not None:
        headers["x-dlq-stream-source"] = origin
    headers.update({
        "Nats-Msg-Id": f"dlq.{meta.stream}.{durable}.{meta.sequence.stream}",
        "x-dlq-consumer": durable,
        "x-dlq-subject": msg.subject,
        "x-dlq-stream-seq": str(meta.sequence.stream),
        "x-dlq-error": error[:2000],
    })
    await bus.js.publish(f"dlq.{meta.stream}.{durable}", msg.data, headers=headers)


def delivery(msg: Msg) -> tuple[int, int, float]:
    """(stream sequence, deliveries so far, when the stream stored it in epoch seconds) of a delivered message,
    from its reply subject as nats-py's ``Msg.metadata`` reads them (the stored time through the same
    ``datetime``, so rounded to the microsecond alike), without building the rest of the metadata for every
    message: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<timestamp>.<pending>``. Any other form (a
    domain, an account hash) is read by nats-py."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        stored = dt.datetime.fromtimestamp(int(tokens[7]) / 1_000_000_000.0, dt.UTC).timestamp()
        return int(tokens[5]), int(tokens[4]), stored
    meta = msg.metadata
    return meta.sequence.stream, meta.num_delivered, meta.timestamp.timestamp()


def _resolve(handled: asyncio.Future[None] | None) -> None:
    if handled is not None and not handled.done():
        handled.set_result(None)


def retry_delay(exc: TemporaryError, delivered: int) -> float:
    """How long a message that met ``exc`` on its ``delivered``-th delivery waits before the next. The delay doubles
    with each delivery (up to 30 s): what it waits for (a projection, a peer service, the service keys the
    bootstrap records) may be restarting, and a fixed short delay would spend ``max_deliver`` in seconds and lose
    the event to the DLQ (8 deliveries now span about a minute). A ``NotYet`` (a paced submission's slot) is a
    scheduled wait: exactly what it says."""
    if isinstance(exc, NotYet):
        return exc.delay
    return min(30.0, max(exc.delay, exc.delay * 2 ** (delivered - 1)))


class ConsumerLoop:
    def __init__(self, bus: Bus, *, stream: str, durable: str, handler: Handler, batch: int = 32,
                 fetch_timeout: float = 1.0, tails: dict[str, asyncio.Future[None]] | None = None,
                 ordered: bool = True, gate: asyncio.Event | None = None) -> None:
        """``gate``: fetch only while it is set (what was fetched already is handled): a returning site's
        requests wait for its lease renewal (``LocalCluster.lease_held``)."""
        self.bus, self.stream, self.durable, self.handler = bus, stream, durable, handler
        self.gate = gate
        self.ordered = ordered
        self.batch, self.fetch_timeout = batch, fetch_timeout
        # key → when its latest message is handled (set before its ack goes out); the next one of that key waits
        # on it. Shared by the loops of one stage's priority lanes, so one run's events never run concurrently.
        self.tails: dict[str, asyncio.Future[None]] = {} if tails is None else tails
        self.stopping = asyncio.Event()
        self.handled = 0
        # Set while this loop's durable has no backlog: its last fetch came back short of what it asked for. A
        # default lane's loop made to ``yield_to`` the high lane's fetches only while it is set.
        self.drained = asyncio.Event()
        self.drained.set()  # until its first fetch says otherwise: a lane yielding to it starts at once
        self.yields_to: ConsumerLoop | None = None
        self.authors = Authors.of(bus)
        self.checked = stream in publishing.CHECKED_STREAMS  # its events' authors are checked (``Authors``)
        self._series: dict[tuple[str, str], Any] = {}  # (event type, outcome) → its HANDLED series

    def yield_to(self, other: ConsumerLoop) -> None:
        """Fetch only while ``other`` has no backlog (strict priority: a stage's default lane behind its high
        lane). With two lanes each fetched freely, a stage short of CPU spent it on both alike, and a burst of
        ordinary runs still delayed the high lane's by seconds at every stage; the server's backlog of the
        default lane waits instead, and what was fetched already is handled as before."""
        self.yields_to = other

    async def run(self) -> None:
        psub = Puller(self.bus.nc, stream=self.stream, durable=self.durable)
        await psub.start()
        try:
            await self._loop(psub)
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                await psub.unsubscribe()

    async def _loop(self, psub: Any) -> None:
        limit = 2 * self.batch
        inflight: set[asyncio.Task[None]] = set()
        tails = self.tails
        room = asyncio.Event()
        room.set()
        running = asyncio.get_running_loop()

        def done(task: asyncio.Task[None], key: str, handled: asyncio.Future[None]) -> None:
            if tails.get(key) is handled:
                del tails[key]
            finished(task)

        def finished(task: asyncio.Task[None]) -> None:
            inflight.discard(task)
            if len(inflight) <= limit - self.batch:
                room.set()

        try:
            while not self.stopping.is_set():
                await room.wait()
                if self.gate is not None and not self.gate.is_set():
                    with contextlib.suppress(TimeoutError):  # looked at again now and then: it may be stopping
                        await asyncio.wait_for(self.gate.wait(), timeout=self.fetch_timeout)
                    continue
                if self.yields_to is not None and not self.yields_to.drained.is_set():
                    with contextlib.suppress(TimeoutError):  # looked at again now and then: it may be stopping
                        await asyncio.wait_for(self.yields_to.drained.wait(), timeout=self.fetch_timeout)
                    continue
                asked = min(self.batch, limit - len(inflight))
                try:
                    msgs = await psub.fetch(asked, timeout=self.fetch_timeout)
                except TIMEOUT:
                    self.drained.set()
                    continue
                except UNAVAILABLE as exc:  # reconnecting, the API unavailable, or closed (then stop)
                    if self.bus.nc.is_closed:
                        return
                    log.warning("%s: fetch failed (%r); retrying", self.durable, exc)
                    self.drained.set()  # no backlog it can serve: a lane yielding to it must not wait on it
                    await asyncio.sleep(0.5)
                    continue
                if len(msgs) < asked:
                    self.drained.set()
                else:
                    self.drained.clear()
                for m in msgs:
                    if not self.ordered:
                        task = asyncio.create_task(self._one(m))
                        inflight.add(task)
                        task.add_done_callback(finished)
                        continue
                    key = ordering_key(m.subject, m.headers)
                    handled: asyncio.Future[None] = running.create_future()
                    task = asyncio.create_task(self._after(tails.get(key), m, handled))
                    tails[key] = handled
                    inflight.add(task)
                    task.add_done_callback(functools.partial(done, key=key, handled=handled))
                # the batch and its last message are the tasks' now: not kept while the next fetch waits (a
                # long-lived few among a backlog's objects keep the allocator's arenas the backlog filled)
                msgs = m = None
                if len(inflight) > limit - self.batch:
                    room.clear()
        finally:
            self.drained.set()  # stopped: nothing waits on it any more
            if inflight:  # stopping: let in-flight handlers finish so their acks go out before the drain
                await asyncio.wait(inflight)

    async def _after(self, previous: asyncio.Future[None] | None, msg: Msg, handled: asyncio.Future[None]) -> None:
        try:
            if previous is not None:
                await asyncio.wait([previous])  # never raises: it is always resolved with None
            await self._one(msg, handled)
        finally:
            _resolve(handled)

    async def _one(self, msg: Msg, handled: asyncio.Future[None] | None = None) -> None:
        """Handle ``msg`` and settle it; ``handled`` is resolved once the handler's outcome is decided (and any
        DLQ copy written), before the verb's round trip, so the next message of the same key starts then."""
        seq, delivered, stored = delivery(msg)
        subject = msg.subject
        event = from_message(subject, msg.headers, msg.data, seq=seq, stored=stored)
        attrs: dict[str, Any] = {"messaging.system": "nats", "messaging.destination.name": subject,
                                 "messaging.consumer.group.name": self.durable}
        if delivered > 1:
            metrics.child(metrics.REDELIVERED, self.durable).inc()
        started = time.perf_counter()
        outcome = functools.partial(self._outcome, event.type, started)
        problem = event.problem or None
        person = False
        if self.checked and problem is None:
            person, allowed = publishing.verdict(subject)  # once an event: the check and the run's user read it
            try:
                problem = await self.authors.problem(event, verdict=(person, allowed))
            except TemporaryError as exc:  # its author cannot be checked yet: later, never unchecked
                delay = retry_delay(exc, delivered)
                log.info("%s: %s seq=%s waits %.1fs: %s", self.durable, subject, seq, delay, exc)
                _resolve(handled)
                await self._settle(msg, nak(delay))
                outcome("retry")
                return
        if problem is not None:
            log.warning("%s: refusing %s seq=%s: %s", self.durable, subject, seq, problem)
            await self._safe(to_dlq(self.bus, msg, durable=self.durable, error=f"refused: {problem}"))
            _resolve(handled)
            await self._settle(msg, TERM)
            metrics.DEAD_LETTERS.labels(self.durable, "refused").inc()
            outcome("refused")
            return
        if self.checked and event.user and event.subject and not person:
            identity.run_user.set((event.subject, event.user))
        stuck = asyncio.get_running_loop().call_later(STUCK_S, self._report_stuck, asyncio.current_task(), msg)
        try:
            with tracing.span(f"process {event.type}", parent=event.traceparent, kind=SpanKind.CONSUMER,
                              attributes=attrs):
                await self.handler(event)
        except (PermanentError, msgspec.DecodeError) as exc:
            error = str(exc) if isinstance(exc, PermanentError) else f"undecodable {event.type} payload: {exc}"
            log.error("%s: rejecting %s seq=%s permanently: %s", self.durable, subject, seq, error)
            await self._safe(to_dlq(self.bus, msg, durable=self.durable, error=error))
            _resolve(handled)
            await self._settle(msg, TERM)
            metrics.DEAD_LETTERS.labels(self.durable, "permanent" if isinstance(exc, PermanentError)
                                        else "undecodable").inc()
            outcome("dead_letter")
        except TemporaryError as exc:
            delay = retry_delay(exc, delivered)
            log.info("%s: %s seq=%s retry in %.1fs: %s", self.durable, subject, seq, delay, exc)
            _resolve(handled)
            await self._settle(msg, nak(delay))
            outcome("retry")
        except Exception as exc:  # unknown: never treated as a run failure, never retried hot
            delay = min(30.0, 0.5 * 2 ** min(delivered, 6))
            log.exception("%s: handler error on %s seq=%s (delivery %s); retry in %.1fs: %r", self.durable,
                          subject, seq, delivered, delay, exc)
            _resolve(handled)
            await self._settle(msg, nak(delay))
            outcome("error")
        else:
            self.handled += 1
            _resolve(handled)
            await self._settle(msg, ACK)
            outcome("ack")
        finally:
            stuck.cancel()

    def _outcome(self, kind: str, started: float, name: str) -> None:
        """Observe how long handling an event of type ``kind`` took, by outcome ``name`` (the series looked up
        once per type and outcome: ``metrics.child`` builds its key on every call)."""
        series = self._series.get((kind, name))
        if series is None:
            series = self._series[(kind, name)] = metrics.child(metrics.HANDLED, self.durable, kind, name)
        series.observe(time.perf_counter() - started)

    def _report_stuck(self, task: asyncio.Task[Any] | None, msg: Msg) -> None:
        report_stuck(f"{self.durable}: handler for {msg.subject} seq={msg.metadata.sequence.stream}", task)

    async def _settle(self, msg: Msg, verb: bytes) -> None:
        """Ack, nak or term ``msg`` as a request, which the consumer's leader answers, and send it again until it
        does (at most ``SETTLE_S``): a verb sent while a server restarts, or while a cluster elects the consumer's
        new leader, is otherwise lost silently, and the message comes back only after ``ack_wait`` (60 s). Sent
        twice, a verb is harmless (an ack of an acked message, a nak of one already redelivered, are ignored)."""
        deadline = time.monotonic() + SETTLE_S
        pause = 0.2
        while True:
            try:
                await self.bus.replies.request(msg.reply, verb, timeout=SETTLE_WAIT_S)
                return
            except CLOSED:
                return  # stopping: the server redelivers after ack_wait
            except UNAVAILABLE as exc:
                if time.monotonic() + pause >= deadline:
                    log.warning("%s: %s for seq=%s unconfirmed after %.0fs (%r); it comes back after ack_wait",
                                self.durable, verb.split(b" ")[0].decode(), msg.metadata.sequence.stream,
                                SETTLE_S, exc)
                    return
            await asyncio.sleep(pause)
            pause = min(2.0, pause * 2)

    @staticmethod
    async def _safe(aw: Awaitable[Any]) -> None:
        try:
            await aw
        except UNAVAILABLE as exc:
            log.warning("ack/nak failed: %r", exc)
