"""Messages for one subscription handed over as the wire gave them, for a long replay to read in bulk.

nats-py turns every message it receives into a ``Msg`` (its headers parsed, a queue put, a task woken, a
callback awaited) before anyone sees it: at a replay's tens of thousands of messages a second that is most of
the reading. ``route`` registers a function that receives a subscription's messages instead, as
``(subject, reply, header block, payload)`` bytes from nats-py's protocol parser, and ``stored_events`` reads
them into ``Event``s exactly as a subscription's ``Msg`` would be read: the same header parsing (nats-py's, with
``natsheaders``' faster equal parser), then ``envelope.from_message``. Every other subscription's message goes
through nats-py as before.

The hook is nats-py's ``Client._process_msg``, wrapped on the one connection asked for while a routed
subscription lasts (``unroute`` of the last one puts nats-py's back), and only while nats-py ships the method it
was checked against (its docstring and parameters, as nats-py 2.16 has them); otherwise ``route`` returns False
and the caller reads through an ordinary subscription.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client

from taugrid.bus.envelope import Event, from_message

Sink = Callable[[bytes, bytes, bytes | None, bytes], None]

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
        sink(subject, reply, headers, data)


def route(nc: Client, sid: int, sink: Sink) -> bool:
    """Hand subscription ``sid``'s messages on ``nc`` to ``sink`` (synchronously, from the reading loop, in
    order); False, and nothing changed, when this nats-py is not the one the hook was checked against."""
    if not _CHECKED:
        return False
    router = nc.__dict__.get("_process_msg")
    if not isinstance(router, _Router):
        router = _Router(nc)
        nc._process_msg = router  # type: ignore[method-assign]
    router.sinks[sid] = sink
    return True


def unroute(nc: Client, sid: int) -> None:
    """Stop routing ``sid``; with no subscription left to route, nats-py's own method is back in place (every
    other message then pays nothing for the hook)."""
    router = nc.__dict__.get("_process_msg")
    if isinstance(router, _Router):
        router.sinks.pop(sid, None)
        if not router.sinks:
            del nc.__dict__["_process_msg"]


Raw = tuple[bytes, bytes, "bytes | None", bytes]  # subject, reply, header block, payload


async def stored_events(nc: Client, raws: list[Raw]) -> list[Event]:
    """The Event a subscription would read from each stored message a JetStream consumer delivered
    (``from_message`` over its parsed headers, with its stream sequence and stored time from the reply subject).
    A plain header block (``NATS/1.0`` then header lines, as every stored message has) is parsed here as
    nats-py's ``_process_headers`` parses it; any other (a status line, a block too short to hold one) by
    nats-py itself."""
    parse = Client._parse_header_lines
    out = []
    for subject, reply, block, data in raws:
        headers: dict[str, str] | None = None
        if block:
            try:
                if len(block) > _LINE_END and block[_LINE_SIZE] != 0x20:  # no status after the first line
                    headers = parse(block[_LINE_END:])
                else:
                    headers = await nc._process_headers(block)
            except Exception:  # noqa: BLE001 - as nats-py: its own reading decides (and reports) what is wrong
                headers = await nc._process_headers(block)
        tokens = reply.split(b".")
        out.append(from_message(subject.decode(), headers, data, seq=stream_seq(tokens), stored=stored_at(tokens)))
    return out


_LINE_SIZE = len(_HEADER_LINE)
_LINE_END = _LINE_SIZE + 2  # past the first line's CRLF


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
