"""Direct reads of single stored stream messages (no consumer), with taugrid's errors.

A direct get costs one request, where a filtered replay would create and delete a consumer: use these for
"the last message on a subject", "the message at a sequence the caller recorded" and "a run's few messages in
stream order" (``history``, on a stream that allows direct gets).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import msgspec
from nats.aio.msg import Msg

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.errors import MISSING, NO_RESPONDERS, UNAVAILABLE, unavailable
from taugrid.core.errors import TemporaryError


async def _get(bus: Bus, stream: str, **where: object) -> Event | None:
    try:
        msg = await bus.js.get_msg(stream, **where)  # type: ignore[arg-type]
    except MISSING:
        return None
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {stream} ({where})", exc) from exc
    # nats-py reads the stored time to the microsecond, truncated: a store-stamped event's time (envelope.store_time)
    # may read a millisecond earlier here than from a delivery, a replay or a direct get (``at_many``: the
    # nanoseconds) for about one message in two thousand (the evidence reads a run's events those ways, and this
    # way only an event they missed)
    return from_message(msg.subject or "", msg.headers, msg.data or b"", seq=int(msg.seq or 0),
                        stored=msg.time.timestamp() if msg.time else 0.0)


async def last(bus: Bus, stream: str, subject: str) -> Event | None:
    """The newest message of ``stream`` on ``subject``, or None when there is none."""
    return await _get(bus, stream, subject=subject)


async def at(bus: Bus, stream: str, seq: int) -> Event | None:
    """The message at sequence ``seq``, or None when it is gone (aged out, deleted) or never existed."""
    return await _get(bus, stream, seq=seq)


async def at_many(bus: Bus, stream: str, seqs: list[int]) -> list[Event | None]:
    """The messages at ``seqs``, each None when gone (as ``at``), read by direct gets sent together: one write
    for them all, and each answer a message with its header block rather than ``at``'s JSON with the message in
    base64 and its headers parsed as RFC 822 (issue 30: the evidence seal's reads of a run's events were about a
    third of its CPU). A stream without direct gets is read by ``at``. A direct get may be answered by a replica
    that has not caught up, so a None means "not read now", as a gone message does for ``at``."""
    try:
        return list(await asyncio.gather(*(_direct(bus, stream, {"seq": seq}) for seq in seqs)))
    except DirectGetUnavailable:
        return [await at(bus, stream, seq) for seq in seqs]


async def holds(bus: Bus, stream: str, subject: str) -> bool:
    """Whether ``stream`` holds any message on ``subject``."""
    return await _get(bus, stream, seq=1, subject=subject, next=True) is not None


async def bounds(bus: Bus, stream: str) -> tuple[int, int]:
    """(first, last) sequence ``stream`` holds; (0, 0) when it is missing."""
    try:
        info = await bus.js.stream_info(stream)
    except MISSING:
        return 0, 0
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {stream}'s state", exc) from exc
    return int(info.state.first_seq or 0), int(info.state.last_seq or 0)


class _Subjects(msgspec.Struct):
    subjects: dict[str, int] = msgspec.field(default_factory=dict)


class _SubjectsAnswer(msgspec.Struct):
    state: _Subjects = msgspec.field(default_factory=_Subjects)
    error: dict[str, object] | None = None


async def count(bus: Bus, stream: str, subject: str) -> int:
    """How many messages ``stream`` holds on ``subject`` (a filter), from the server's subject index (stream info
    with a subjects filter: no scan of the stream's messages). The answer is decoded into its subject counts
    alone, not into nats-py's whole ``StreamInfo`` (the evidence seal asks once a run, issue 30); an error answer
    is asked again through nats-py, which raises it (or says the stream is missing) as before."""
    request = json.dumps({"subjects_filter": subject}).encode()
    try:
        answer = await bus.replies.request(f"$JS.API.STREAM.INFO.{stream}", request, timeout=10.0)
    except UNAVAILABLE as exc:
        raise unavailable(f"counting {stream} on {subject}", exc) from exc
    counted = msgspec.json.decode(answer.data, type=_SubjectsAnswer)
    if counted.error is None:
        return sum(counted.state.subjects.values())
    try:
        info = await bus.js.stream_info(stream, subjects_filter=subject)
    except MISSING:
        return 0
    except UNAVAILABLE as exc:
        raise unavailable(f"counting {stream} on {subject}", exc) from exc
    return sum((info.state.subjects or {}).values())


class DirectGetUnavailable(TemporaryError):
    """The stream answers no direct gets (``allow_direct`` off: a stream made before it was declared)."""


async def history(bus: Bus, stream: str, subject: str, *, through: int | None = None, start: int = 1,
                  since: float | None = None) -> list[Event]:
    """The messages of ``stream`` on ``subject`` (a filter) from sequence ``start`` through sequence ``through``
    (None: through the last one stored now; an empty list when there is none), in stream order, read by direct
    gets, no consumer. On one subject (no wildcard, no ``since``) in batches (``_history_batched``: one request
    for a run's few messages; the server counts the subject's messages from its subject index). On a wildcard
    filter one request per message (``{"seq", "next_by_subj"}``): the batch form counts the filter's pending
    messages, which on a wildcard cost the server ~2 ms per message on a stream of 240k; and the server walks the
    stream from each request's sequence to the next match, so a get costs it the distance between one match and
    the next (on a busy 150k-message RUNS, a run's first get from sequence 1 took ~140 ms and later ones ~10 ms).

    ``since`` (epoch seconds) starts instead at the first message stored at or after that time (the server
    finds it from its index, ``start_time``): where a caller knows when the messages began but not their
    sequence (a run's logs on LOGS, which would otherwise be walked from sequence 1 through days of others).

    Raises ``DirectGetUnavailable`` when the stream does not allow direct gets (the caller falls back to a
    replay), ``TemporaryError`` when the messages read do not reach ``through``, as a replica that has not caught
    up (any replica may answer a direct get) would give: every message before ``through`` is stored before it, so
    an answer that holds ``through`` holds them all."""
    if since is None and not _has_wildcard(subject):
        return await _history_batched(bus, stream, subject, through=through, start=start)
    out: list[Event] = []
    seq = start
    first: dict[str, object] = {"start_time": _rfc3339(since)} if since is not None else {"seq": seq}
    while through is None or seq <= through:
        ev = await _direct_next(bus, stream, first or {"seq": seq}, subject)
        first = {}
        if ev is None:
            break
        if through is not None and ev.seq > through:
            break
        out.append(ev)
        # where the stream stored it: a copy HISTORY or AUDIT keeps reads at its RUNS sequence (``from_message``)
        seq = int(ev.headers.get("Nats-Sequence") or ev.seq) + 1
    if through is not None and (not out or out[-1].seq != through):
        raise TemporaryError(f"{stream} {subject}: seq {through} is not among the messages read back", delay=0.5)
    return out


def _stored_at(stamp: str) -> float:
    """A direct get's ``Nats-Time-Stamp`` (RFC 3339, nanoseconds, UTC) as epoch seconds, the same float a delivery
    gives for the message (its nanoseconds / 1e9), so a store-stamped event's time reads alike (0.0 when absent)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    try:
        second = int(dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp())
        return (second * 1_000_000_000 + int(fraction[:9].ljust(9, "0") or 0)) / 1e9
    except ValueError:
        return 0.0


def _rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat().replace("+00:00", "Z")


# The most messages one batch direct get asks for; a subject holding more is read in several.
BATCH = 1024


def _has_wildcard(subject: str) -> bool:
    return any(token in ("*", ">") for token in subject.split("."))


async def _history_batched(bus: Bus, stream: str, subject: str, *, through: int | None, start: int) -> list[Event]:
    """``history`` on one subject (no wildcard) by batch direct gets (``{"seq", "next_by_subj", "batch"}``): one
    request for a run's few messages, not one a message. The server counts the subject's messages once a batch,
    which for one subject is a lookup in its subject index (on a wildcard it walks the stream: ``history``)."""
    out: list[Event] = []
    seq = start
    while True:
        msgs, more = await _direct_batch(bus, stream, {"seq": seq, "next_by_subj": subject, "batch": BATCH})
        for msg in msgs:
            ev = _event_of(msg)
            if through is not None and ev.seq > through:
                more = False
                break
            out.append(ev)
        if not more or not msgs:
            break
        seq = int((msgs[-1].headers or {}).get("Nats-Sequence") or 0) + 1
    if through is not None and (not out or out[-1].seq != through):
        raise TemporaryError(f"{stream} {subject}: seq {through} is not among the messages read back", delay=0.5)
    return out


async def last_per_subject(bus: Bus, stream: str, subject: str, *, up_to: int) -> list[Event]:
    """The last message at or before sequence ``up_to`` on each subject matching ``subject`` (a filter), in one
    batch direct get (``{"multi_last", "up_to_seq"}``: the server finds the subjects in its subject index), by
    stream sequence; empty when none (and when ``up_to`` is past the stream's last sequence: the server answers
    that with no results, so give one the stream has stored). Raises ``DirectGetUnavailable`` as ``history``
    does, and ``TemporaryError`` when more subjects match than one request may answer (1,024)."""
    msgs, _ = await _direct_batch(bus, stream, {"multi_last": [subject], "up_to_seq": up_to})
    return sorted(map(_event_of, msgs), key=lambda ev: int(ev.headers.get("Nats-Sequence") or 0))


async def _direct_batch(bus: Bus, stream: str, request: dict[str, object]) -> tuple[list[Msg], bool]:
    """The messages a batch direct get ``request`` answers with, and whether more are left past them (the
    server stops a batch at its byte limit too); none when nothing matches."""
    msgs, end, what = await _ask(bus, stream, request, gathered=[])
    headers = end.headers or {}
    status = headers.get("Status", "")
    if status == "404" and not msgs:
        return [], False
    if status != "204":
        raise TemporaryError(f"reading {stream} ({what}) answered {status or 'no end of batch'}", delay=1.0)
    return msgs, int(headers.get("Nats-Num-Pending") or 0) > 0


async def _ask(bus: Bus, stream: str, request: dict[str, object], *,
               gathered: list[Msg] | None = None) -> tuple[list[Msg], Msg, str]:
    """A direct get's answer (with ``gathered``, a batch's: its messages there, the status that ends them as the
    answer), and the request as sent, with taugrid's errors."""
    what = json.dumps(request)
    try:
        answer = await bus.replies.request(f"$JS.API.DIRECT.GET.{stream}", what.encode(), timeout=5.0,
                                           gathered=gathered)
    except NO_RESPONDERS as exc:
        raise DirectGetUnavailable(f"{stream} answers no direct gets (allow_direct is off)", delay=1.0) from exc
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {stream} ({what})", exc) from exc
    return gathered or [], answer, what


def _event_of(msg: Msg) -> Event:
    """A direct get's message as an Event: its subject, sequence and stored time from the server's headers."""
    headers = msg.headers or {}
    return from_message(headers.get("Nats-Subject", ""), headers, msg.data or b"",
                        seq=int(headers.get("Nats-Sequence", "0") or 0),
                        stored=_stored_at(headers.get("Nats-Time-Stamp", "")))


async def _direct_next(bus: Bus, stream: str, where: dict[str, object], subject: str) -> Event | None:
    """The first message on ``subject`` at or after ``where`` (``{"seq": n}`` or ``{"start_time": t}``; a direct
    get), or None when there is none."""
    return await _direct(bus, stream, {**where, "next_by_subj": subject})


async def _direct(bus: Bus, stream: str, request: dict[str, object]) -> Event | None:
    """The message a direct get ``request`` names, or None when there is none."""
    _, msg, what = await _ask(bus, stream, request)
    headers = msg.headers or {}
    status = headers.get("Status", "")
    if status == "404":
        return None
    if status:
        raise TemporaryError(f"reading {stream} ({what}) answered {status}", delay=1.0)
    return _event_of(msg)
