"""The NATS protocol stream read in bulk for the subscriptions a long replay routes (``rawmsgs.route``).

nats-py's ``Parser`` matches each control line against regular expressions (the first of seven that fits),
copies each payload out of a bytearray it shrinks from the front, and awaits ``Client._process_msg`` for every
message. ``BulkParser`` stands in for it on one connection while a routed subscription lasts: it walks each
buffer the reading loop hands over with ``bytes.find`` and ``bytes.split`` (no regular expression), and hands a
routed subscription's messages to its sink as one list per buffer, ``(subject, reply, header block or None,
payload)`` bytes as nats-py would pass them to ``_process_msg``. Everything else goes to nats-py's own parser, a
whole frame at a time, so it behaves exactly as before: other subscriptions' messages, PING/PONG, INFO,
``+OK``/``-ERR``, and any control line this reader does not recognise (from there on, until nats-py's parser is
back at a frame boundary).

Invariants: frames reach sinks and nats-py in the order the server sent them; this parser only ever stops at a
frame boundary (an incomplete frame is kept from its control line on, and a long one gathered in pieces without
copying the pieces again per read), so handing back to nats-py's parser (``detach``, from ``rawmsgs.unroute``)
gives it whole frames; ``reset`` (nats-py's reconnect) drops a partial frame as nats-py's does. Installed only
while nats-py's parser is the one this was checked against (``CHECKED``: its regular expressions and states).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nats.protocol import parser as nats_parser

Frame = tuple[bytes, bytes, "bytes | None", bytes]  # subject, reply ("" for none), header block, payload
Sink = Callable[[list[Frame]], None]

_CRLF = b"\r\n"
_GATHER = 1 << 16  # an incomplete frame longer than this is gathered in pieces and joined once, not re-copied
# The protocol as nats-py 2.16 reads it; another parser (an upgrade) keeps nats-py's own reading.
CHECKED = (
    nats_parser.MSG_RE.pattern == b"\\AMSG\\s+([^\\s]+)\\s+([^\\s]+)\\s+(([^\\s]+)[^\\S\r\n]+)?(\\d+)\r\n"
    and nats_parser.HMSG_RE.pattern
    == b"\\AHMSG\\s+([^\\s]+)\\s+([^\\s]+)\\s+(([^\\s]+)[^\\S\r\n]+)?([\\d]+)\\s+(\\d+)\r\n"
    and nats_parser.AWAITING_CONTROL_LINE == 1
    and all(hasattr(nats_parser.Parser, name) for name in ("parse", "reset"))
)


class BulkParser:
    """nats-py's parser for one connection, with ``sinks`` (subscription id as the wire writes it → sink)
    read in bulk. ``original`` is nats-py's parser of that connection, used for every other frame."""

    def __init__(self, nc: Any, original: nats_parser.Parser) -> None:
        self.nc = nc
        self.original = original
        self.sinks: dict[bytes, Sink] = {}
        self.rest = b""  # an incomplete frame, from its control line
        self.pieces: list[bytes] = []  # a long incomplete frame, gathered until ``need`` bytes are here
        self.have = 0
        self.need = 0
        # nats-py's parser may hold part of a frame when this takes over: it reads until it is at a boundary
        self.delegating = bool(original.buf) or original.state != nats_parser.AWAITING_CONTROL_LINE
        self.busy = False
        self.detaching = False

    def reset(self) -> None:
        """A reconnect (nats-py calls this): what was partly read is gone, as with nats-py's parser."""
        self.original.reset()
        self.rest, self.pieces, self.have, self.need, self.delegating = b"", [], 0, 0, False

    def detach(self) -> None:
        """Put nats-py's parser back on the connection, now or, while a buffer is being read, once it is read."""
        if self.busy:
            self.detaching = True
            return
        if not self.delegating:  # at a frame boundary: what is left is the start of the next frame
            self.original.buf.extend(b"".join(self.pieces) if self.pieces else self.rest)
        self.rest, self.pieces, self.have, self.need = b"", [], 0, 0
        if self.nc._ps is self:
            self.nc._ps = self.original

    async def parse(self, data: bytes = b"") -> None:
        self.busy = True
        try:
            await self._parse(data)
        finally:
            self.busy = False
            if self.detaching:
                self.detaching = False
                if not self.sinks:  # unless a replay was routed again meanwhile
                    self.detach()

    async def _parse(self, data: bytes) -> None:
        original = self.original
        if self.delegating:
            await original.parse(data)
            self.delegating = bool(original.buf) or original.state != nats_parser.AWAITING_CONTROL_LINE
            return
        if self.need:
            self.pieces.append(data)
            self.have += len(data)
            if self.have < self.need:
                return
            data, self.pieces, self.have, self.need = b"".join(self.pieces), [], 0, 0
        elif self.rest:
            data, self.rest = self.rest + data, b""
        batch = _Batch(self.nc.stats)
        try:
            await self._frames(data, batch)
        finally:
            batch.flush()

    async def _frames(self, data: bytes, batch: _Batch) -> None:
        """Read the frames of ``data`` (which starts at a frame): routed ones into ``batch``, others to nats-py's
        parser; keep an incomplete last one."""
        sinks = self.sinks
        size = len(data)
        pos = 0
        find = data.find
        current, append = batch.sink, batch.frames.append  # the run being gathered (again after each add, flush)
        while pos < size:
            eol = find(_CRLF, pos)
            if eol < 0:
                self._keep(data, pos, 0)
                return
            head = data[pos:eol].split()
            # A replay's usual frame first: a stored message (with its reply subject) for the run's sink, whole
            # in this buffer; the same outcome as the general reading below, in fewer steps.
            if len(head) == 6 and head[0] == b"HMSG" and sinks.get(head[2]) is current is not None and \
                    head[5].isdigit() and head[4].isdigit():
                start = eol + 2
                end = start + int(head[5])
                if end + 2 <= size:
                    split = start + int(head[4])
                    append((head[1], head[3], data[start:split] if split > start else None, data[split:end]))
                    pos = end + 2
                    continue
            count = len(head)
            op = head[0] if count else b""
            if op == b"HMSG" and (count == 5 or count == 6):
                header_size, total, with_reply = head[-2], head[-1], count == 6
            elif op == b"MSG" and (count == 4 or count == 5):
                header_size, total, with_reply = b"0", head[-1], count == 5
            else:  # PING, PONG, INFO, +OK, -ERR (one line each) or a line this reader does not know
                batch.flush()
                if not await self._hand_over(data, pos, eol + 2, size):
                    return
                current, append = batch.sink, batch.frames.append
                pos = eol + 2
                continue
            if not (total.isdigit() and header_size.isdigit()):  # malformed: nats-py's parser says so
                batch.flush()
                await self._delegate(data[pos:])
                return
            start = eol + 2
            end = start + int(total)
            if end + 2 > size:
                self._keep(data, pos, end + 2 - pos)
                return
            sink = sinks.get(head[2])
            if sink is None:  # another subscription's message: nats-py's own way
                batch.flush()
                if not await self._hand_over(data, pos, end + 2, size):
                    return
                current, append = batch.sink, batch.frames.append
                pos = end + 2
                continue
            split = start + int(header_size)
            frame = (head[1], head[3] if with_reply else b"", data[start:split] if split > start else None,
                     data[split:end])
            if sink is batch.sink and with_reply:
                batch.frames.append(frame)
            else:
                batch.add(sink, frame)
            current, append = batch.sink, batch.frames.append
            pos = end + 2

    def _keep(self, data: bytes, pos: int, need: int) -> None:
        """Keep the incomplete frame at ``pos`` (``need`` bytes in all when known) for the next buffer."""
        if need > _GATHER:
            self.pieces, self.have, self.need = [data[pos:]], len(data) - pos, need
        else:
            self.rest = data[pos:]

    async def _hand_over(self, data: bytes, pos: int, end: int, size: int) -> bool:
        """Give nats-py's parser the whole frame ``data[pos:end]``; False when it did not end at a boundary (a line
        it reads otherwise), so it reads the rest of this buffer and what follows until it does."""
        original = self.original
        await original.parse(data[pos:end])
        if original.buf or original.state != nats_parser.AWAITING_CONTROL_LINE:
            await self._delegate(data[end:size])
            return False
        return True

    async def _delegate(self, data: bytes) -> None:
        original = self.original
        if data:
            await original.parse(data)
        self.delegating = bool(original.buf) or original.state != nats_parser.AWAITING_CONTROL_LINE


class _Batch:
    """The routed frames of one buffer, handed to their sink in runs: one list per run of frames for the same
    sink, and a frame without a reply subject (the server's status ending a request) alone, so a sink sees
    exactly where it falls. Counts them in the connection's statistics as nats-py would."""

    __slots__ = ("frames", "sink", "stats")

    def __init__(self, stats: dict[str, int]) -> None:
        self.frames: list[Frame] = []
        self.sink: Sink | None = None
        self.stats = stats

    def add(self, sink: Sink, frame: Frame) -> None:
        if sink is not self.sink or not frame[1]:
            self.flush()
            self.sink = sink
        self.frames.append(frame)
        if not frame[1]:
            self.flush()

    def flush(self) -> None:
        frames = self.frames
        if frames and self.sink is not None:
            self.frames = []
            self.stats["in_msgs"] += len(frames)
            self.stats["in_bytes"] += sum(len(frame[3]) for frame in frames)
            self.sink(frames)
