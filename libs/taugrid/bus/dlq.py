"""Dead letters: what the consumers gave up on, read back and replayed (``tau dlq``).

The DLQ stream holds two kinds of entries: a copy of each message a consumer refused or could not decode
(``dlq.<stream>.<durable>``, written by ``consumer.to_dlq`` with the reason in ``x-dlq-error``), and the server's
max-deliveries advisory for a message whose handler kept failing
(``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<durable>``, JSON naming the stream sequence). Both point
at the original message by stream and sequence.

Replay republishes the original (its subject, data and every header, the CloudEvent attributes and signature
included) from its own stream, under a new message id, then deletes the dead letter. An interest-retention stream
(RUNS, K8S, BACKEND) drops a refused message once its readers are done with it (terminated by the one that
refused it, acked by the others): it is republished from its copy. One whose handler kept failing stays in its
stream, which the durable that gave up never acked (nats-server keeps it), and is read there by sequence. Every
consumer of that subject sees it again, not only the one that gave up: handlers are idempotent by message id (what
they publish is deduplicated by the server), which is what makes this safe. Publishing a service's subject is what
only that service may do, so replay needs the bootstrap identity (the operator's break-glass credentials).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable

import msgspec

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import with_id
from taugrid.bus.errors import MISSING, UNAVAILABLE
from taugrid.core.errors import NotFound, PermanentError, PermissionDenied

STREAM = "DLQ"
ADVISORY_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
_UNREADABLE: tuple[type[Exception], ...] = (*UNAVAILABLE, PermissionDenied)


class DeadLetter(msgspec.Struct, frozen=True):
    seq: int  # in the DLQ stream; what `tau dlq replay` takes
    time: float
    kind: str  # "refused" (a consumer dead-lettered it, with a reason) | "max-deliveries" (its handler kept failing)
    stream: str  # where the original message is
    stream_seq: int
    durable: str
    subject: str  # the original message's subject ("" when it is no longer in its stream)
    error: str


def _parse(seq: int, subject: str, headers: dict[str, str] | None, data: bytes, when: float) -> DeadLetter | None:
    if subject.startswith("dlq."):
        _, stream, durable = subject.split(".", 2)
        h = headers or {}
        return DeadLetter(seq=seq, time=when, kind="refused", stream=stream,
                          stream_seq=int(h.get("x-dlq-stream-seq", "0") or 0), durable=durable,
                          subject=h.get("x-dlq-subject", ""), error=h.get("x-dlq-error", ""))
    if subject.startswith(ADVISORY_PREFIX):
        try:
            advisory = json.loads(data)
        except ValueError:
            return None
        return DeadLetter(seq=seq, time=when, kind="max-deliveries", stream=str(advisory.get("stream", "")),
                          stream_seq=int(advisory.get("stream_seq", 0)), durable=str(advisory.get("consumer", "")),
                          subject="", error=f"handler failed {advisory.get('deliveries', '?')} deliveries")
    return None


async def _original_subject(bus: Bus, stream: str, seq: int) -> str:
    try:
        return str((await bus.guarded(bus.js.get_msg(stream, seq))).subject or "")
    except _UNREADABLE:  # aged out of its stream, or not readable by this identity
        return ""


async def dead_letters(bus: Bus, *, durable: str | None = None, limit: int | None = None) -> list[DeadLetter]:
    """The dead letters still held, oldest first (the newest ``limit`` when given), optionally of one durable."""
    info = await bus.guarded(bus.js.stream_info(STREAM))
    out: list[DeadLetter] = []
    for seq in range(info.state.last_seq, max(info.state.first_seq, 1) - 1, -1):  # newest first: `limit` is cheap
        if limit is not None and len(out) >= limit:
            break
        try:
            msg = await bus.guarded(bus.js.get_msg(STREAM, seq))
        except MISSING:  # deleted (replayed) or a gap
            continue
        when = msg.time.timestamp() if msg.time is not None else time.time()
        letter = _parse(seq, str(msg.subject), dict(msg.headers or {}), msg.data or b"", when)
        if letter is None or (durable and letter.durable != durable):
            continue
        if not letter.subject:
            letter = msgspec.structs.replace(letter, subject=await _original_subject(bus, letter.stream,
                                                                                    letter.stream_seq))
        out.append(letter)
    return out[::-1]


async def replay(bus: Bus, seqs: Iterable[int]) -> list[DeadLetter]:
    """Republish each dead letter's original message and delete the dead letter; returns what was replayed.

    ``NotFound`` when a sequence holds no dead letter; ``PermanentError`` when the original message has left its
    stream (nothing to replay); ``PermissionDenied`` (from the server) for an identity that may not publish it."""
    done: list[DeadLetter] = []
    for seq in seqs:
        try:
            msg = await bus.guarded(bus.js.get_msg(STREAM, seq))
        except MISSING:
            raise NotFound(f"no dead letter #{seq}: `tau dlq list` shows the ones held") from None
        letter = _parse(seq, str(msg.subject), dict(msg.headers or {}), msg.data or b"", time.time())
        if letter is None:
            raise NotFound(f"DLQ #{seq} is not a dead letter ({msg.subject})")
        try:
            original = await bus.js.get_msg(letter.stream, letter.stream_seq)
            subject, data = str(original.subject), original.data or b""
            headers = with_id(subject, original.headers)  # the event keeps its id (a compact one's: derived)
            first_id = headers.get("Nats-Msg-Id") or f"{letter.stream}.{letter.stream_seq}"
        except MISSING:
            if letter.kind != "refused" or not letter.subject:
                raise PermanentError(
                    f"dead letter #{seq}: its original ({letter.stream} #{letter.stream_seq}) is no longer in its "
                    "stream (aged out or purged); nothing to replay") from None
            # An interest-retention stream (RUNS, K8S, BACKEND) drops a message its durables are done with, a
            # refused (terminated) one too; the letter is its copy: its data and headers (its id and signature among
            # them) as stored.
            subject, data = letter.subject, msg.data or b""
            headers = {k: v for k, v in (msg.headers or {}).items()
                       if not k.startswith("x-dlq-") and k != "Nats-Msg-Id"}
            first_id = headers.get("ce-id") or f"{letter.stream}.{letter.stream_seq}"
        headers["Nats-Msg-Id"] = f"{first_id}.replay-{seq}"  # else the server would drop it as a duplicate
        headers["x-replay-of"] = f"{letter.stream}.{letter.stream_seq}"
        ack = await bus.guarded(bus.js.publish(subject, data, headers=headers))
        if ack.duplicate and await bus.subject_at(ack.stream, ack.seq) != subject:
            # The replay's id was taken first on another subject (people may set any Nats-Msg-Id on their requests
            # into RUNS, and the original's id and the letter's number are no secret): the replay was dropped as a
            # duplicate, and its dead letter would have been deleted with nothing replayed. It goes again under
            # an id nobody can have taken.
            headers["Nats-Msg-Id"] = f"{first_id}.replay-{seq}.{secrets.token_hex(16)}"
            await bus.guarded(bus.js.publish(subject, data, headers=headers))
        await bus.guarded(bus.js.delete_msg(STREAM, seq))
        done.append(msgspec.structs.replace(letter, subject=subject))
    return done
