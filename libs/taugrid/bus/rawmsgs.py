"""Messages for one subscription handed over as the wire gave them, for a long replay to read in bulk.

nats-py turns every message it receives into a ``Msg`` (its control line matched by regular expressions, its
headers parsed, a queue put, a task woken, a callback awaited) before anyone sees it: at a replay's tens of
thousands of messages a second that is most of the reading. ``route`` registers a sink that receives a
subscription's messages instead, as lists of ``(subject, reply, header block, payload)`` bytes, and
``stored_events`` reads them into ``Event``s exactly as a subscription's ``Msg`` would be read: the same header
parsing (nats-py's, through ``natsheaders``, a batch at a time), then ``envelope.from_message``. Every other
subscription's message goes through nats-py as before.

Two hooks on the one connection asked for, while a routed subscription lasts (``unroute`` of the last one puts
nats-py's back): ``bulkparse.BulkParser`` in place of the connection's protocol parser reads the routed
messages of each buffer in one pass; and a wrapper of ``Client._process_msg`` catches a routed message nats-py's
own parser still reads (a frame after a line the bulk reader leaves to nats-py). Each only while nats-py ships
what it was checked against (``_process_msg``'s docstring and parameters, the parser's expressions, as nats-py
2.16 has them); without the first, ``route`` returns False and the caller reads through an ordinary
subscription.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from itertools import repeat
from operator import truediv
from typing import Any

import msgspec
from nats.aio.client import Client

from taugrid.bus import bulkparse, natsheaders
from taugrid.bus.envelope import Event, from_message

Raw = bulkparse.Frame
Sink = bulkparse.Sink

_ORIGINAL = Client.__dict__["_process_msg"]
_CHECKED = (inspect.getdoc(_ORIGINAL) or "").strip() == "Process MSG sent by server." and \
    list(inspect.signature(_ORIGINAL).parameters) == ["self", "sid", "subject", "reply", "data", "headers"]
_HEADER_LINE = b"NATS/1.0"  # every header block's first line; a status adds " <code> <description>"


class _Router:
    """The wrapper installed on one connection: a registered subscription's messages to its sink, every other
    message to nats-py."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.original: Callable[..., Awaitable[None]] = nc._process_msg
        self.sinks: dict[int, Sink] = {}

    async def __call__(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        sink = self.sinks.get(sid)
        if sink is None:
            await self.original(sid, subject, reply, data, headers)
            return
        stats = self.nc.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        sink([(subject, reply, headers, data)])


def route(nc: Client, sid: int, sink: Sink) -> bool:
    """Hand subscription ``sid``'s messages on ``nc`` to ``sink`` (synchronously, from the reading loop, in
    order, in lists); False, and nothing changed, when this nats-py is not the one the hook was checked
    against."""
    if not _CHECKED:
        return False
    router = nc.__dict__.get("_process_msg")
    if not isinstance(router, _Router):
        router = _Router(nc)
        nc._process_msg = router  # type: ignore[method-assign]
    router.sinks[sid] = sink
    if bulkparse.CHECKED:
        reader: Any = nc._ps
        if not isinstance(reader, bulkparse.BulkParser):
            reader = bulkparse.BulkParser(nc, reader)
            nc._ps = reader
        reader.sinks[str(sid).encode()] = sink  # the id as SUB wrote it, and the server writes it back
    return True


def unroute(nc: Client, sid: int) -> None:
    """Stop routing ``sid``; with no subscription left to route, nats-py's own methods are back in place (every
    other message then pays nothing for the hooks)."""
    reader: Any = nc._ps
    if isinstance(reader, bulkparse.BulkParser):
        reader.sinks.pop(str(sid).encode(), None)
        if not reader.sinks:
            reader.detach()
    router = nc.__dict__.get("_process_msg")
    if isinstance(router, _Router):
        router.sinks.pop(sid, None)
        if not router.sinks:
            del nc.__dict__["_process_msg"]


async def stored_events(nc: Client, raws: list[Raw]) -> list[Event]:
    """The Event a subscription would read from each stored message a JetStream consumer delivered
    (``from_message`` over its parsed headers, with its stream sequence and stored time from the reply subject).
    A plain header block (``NATS/1.0`` then header lines, as every stored message has) is parsed here as
    nats-py's ``_process_headers`` parses it, the batch's together (``natsheaders.parse_header_blocks``); any
    other (a status line, a block too short to hold one) by nats-py itself. The frames are taken apart column by
    column in one C pass (``zip``), the reply subjects split together when they all have the usual nine tokens,
    and the subjects decoded together (a subject holds no blank: the control line it came in is split on blanks,
    so one joined by blanks splits back the same)."""
    if not raws:
        return []
    subjects, replies, blocks, payloads = zip(*raws, strict=True)  # each frame four items
    headers: list[dict[str, str] | None]
    if _all_plain(blocks):  # a replay's usual batch: every block a plain one
        headers = natsheaders.parse_header_blocks(blocks, _LINE_END)  # type: ignore[assignment]
    else:  # a status line or no headers here and there: each in its place
        bodies = [block[_LINE_END:] if block and len(block) > _LINE_END and block[_LINE_SIZE] != 0x20 else None
                  for block in blocks]
        parsed = iter(natsheaders.parse_header_blocks([body for body in bodies if body is not None]))
        headers = []
        for block, body in zip(blocks, bodies, strict=True):
            headers.append(next(parsed) if body is not None else await nc._process_headers(block) if block else None)
    seqs, stored = _places(replies)
    names = b" ".join(subjects).decode().split(" ")
    return list(map(from_message, names, headers, payloads, seqs, stored))


def _all_plain(blocks: Sequence[bytes | None]) -> bool:
    """Whether every block is a plain header block: ``NATS/1.0``, its line end and more (what ``stored_events``
    reads from ``_LINE_END`` on; a status line has a blank after ``NATS/1.0``), no block missing."""
    try:
        plain = all(map(bytes.startswith, blocks, repeat(_PLAIN_START)))  # type: ignore[arg-type]
        return plain and min(map(len, blocks)) > _LINE_END  # type: ignore[arg-type]
    except TypeError:  # a message without headers (None): ``bytes.startswith`` takes bytes only
        return False


_INTS = msgspec.json.Decoder(list[int])


def _places(replies: Sequence[bytes]) -> tuple[list[int], list[float]]:
    """The stream sequence and stored time of each message, from its reply subject (``stream_seq``,
    ``stored_at``): all the subjects split at once when each has the nine tokens of a consumer without a domain,
    and their numbers read as two JSON arrays of integers (in C; where one is not written as JSON writes it, a
    leading zero, a plus sign, an underscore, each is read by ``int`` as ``stream_seq`` reads it)."""
    tokens = b".".join(replies).split(b".")
    count = len(replies)
    if len(tokens) == 9 * count and tokens[0::9].count(b"$JS") == count and tokens[1::9].count(b"ACK") == count:
        try:  # a token holding a comma would read as two numbers: the counts must agree
            seqs, stamps = _INTS.decode(b"[" + b",".join(tokens[5::9]) + b"]"), \
                _INTS.decode(b"[" + b",".join(tokens[7::9]) + b"]")
        except msgspec.DecodeError:
            seqs = stamps = []
        if len(seqs) == count == len(stamps):
            return seqs, list(map(truediv, stamps, repeat(1e9)))
        return list(map(int, tokens[5::9])), [int(ns) / 1e9 for ns in tokens[7::9]]
    seqs, stored = [], []
    for reply in replies:
        each = reply.split(b".")
        seqs.append(stream_seq(each))
        stored.append(stored_at(each))
    return seqs, stored


_LINE_SIZE = len(_HEADER_LINE)
_LINE_END = _LINE_SIZE + 2  # past the first line's CRLF
_PLAIN_START = _HEADER_LINE + b"\r\n"


def stream_seq(tokens: Sequence[str | bytes]) -> int:
    """The stream sequence from a JetStream reply subject's tokens, as nats-py's ``Msg.metadata`` reads it but
    without building the rest of the metadata per message: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.
    <cseq>.<timestamp>.<pending>`` (9 tokens) or, with a domain and an account hash, ``$JS.ACK.<domain>.<hash>.
    <stream>.<consumer>.<delivered>.<sseq>.<cseq>.<timestamp>.<pending>[.<random>]`` (11 or 12 tokens)."""
    if len(tokens) == 9:
        return int(tokens[5])
    return int(tokens[7]) if len(tokens) >= 11 else 0


def stored_at(tokens: Sequence[str | bytes]) -> float:
    """When the stream stored the message (epoch seconds), from the same tokens: the store time in nanoseconds."""
    if len(tokens) == 9:
        return int(tokens[7]) / 1e9
    return int(tokens[9]) / 1e9 if len(tokens) >= 11 else 0.0
