"""Pull requests for a durable consumer that hand over a message as soon as it is stored (``ConsumerLoop``'s fetch).

nats-py's ``fetch(batch)`` asks twice when nothing is waiting: a ``no_wait`` request, then a plain waiting one
for the rest of its timeout; and it reads every request's answers on one inbox. A plain request is answered only
when its batch is full or it expires, so a message it is given waits in it until then (up to the whole timeout),
and a status left over from an earlier request (the server's 408 arriving just after nats-py's own timeout) is
taken as the answer to the next request's first ask, so that plain request is sent while the ``no_wait`` one is
still waiting. The server gives a message to the oldest request waiting: the plain one. Issue 30: in one idle run
of six every stage held its event until its plain request expired (submit → admitted 369 ms, every hop 40-140 ms
of it), and a short run's end waited up to half a second more (``exec.succeeded`` 0.5 s after the Job's end).

Here each fetch sends one request, ``no_wait`` with ``expires``: the server (2.15.1 here; ``tests/bus/test_pull.py``
holds it to this) keeps it until a message comes, hands over what it holds (up to ``batch``), and ends it at once
with a 404 when nothing more waits (or a 408 at expiry when nothing came). A fetch waits for its own request's end
(at most its expiry and a grace after it, or ``FOLLOW_S`` after the last message it got), so in the usual case it
leaves no request behind that could take the next message; each request has a reply subject of its own
(``<inbox>.<n>``, on which the server sends its statuses), so a late status of an earlier one is never taken for
the answer. A message that reaches the subscription while no fetch waits (delivered to a request given up after
the grace or ``FOLLOW_S``, still open at the server) is handed over by the next fetch; until then its ack wait
runs (a loop that stops fetching leaves it to its redelivery).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError

from taugrid.bus import natsheaders, rawmsgs

# How long past the request's own expiry a fetch waits for the server's answer: the server ends every request
# itself, so this only bounds a request lost with its server (a reconnect, a new consumer leader).
ANSWER_GRACE_S = 0.5
# How long a fetch that holds messages waits for the next answer: the server sends a request's messages and its
# end together, so a longer gap means a request that is not ending (one that waits for a full batch, which this
# module never sends, but another subscriber of the inbox could): what it brings later goes to the next fetch.
FOLLOW_S = 0.05
# A header block's first line (``NATS/1.0``, then a blank and a status for a status line) and where the headers
# after it start: nats-py's ``NATS_HDR_LINE`` and CRLF.
_HEADER_LINE_SIZE = len(b"NATS/1.0")
_HEADER_LINE_END = _HEADER_LINE_SIZE + 2
_BLANK = 0x20
# the request is over: nothing more waits (404) or it expired (408); the next fetch asks again
_ENDS = (api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT)


class Puller:
    """One durable's pull requests on one connection (``start`` before the first ``fetch``)."""

    def __init__(self, nc: Any, *, stream: str, durable: str) -> None:
        self.nc = nc
        self.subject = f"{api.DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.prefix = ""
        self.sub: Any = None
        self._count = 0
        # every answer, in the order the server sent them (a Msg, or as the wire gave it: ``_frames``)
        self._arrived: asyncio.Queue[Msg | rawmsgs.Raw] = asyncio.Queue()

    async def start(self) -> None:
        self.prefix = self.nc.new_inbox() + "."
        self.sub = await self.nc.subscribe(self.prefix + "*", cb=self._take)
        # deliveries handed over as the wire gave them (``rawmsgs.route``, where this nats-py is the one it was
        # checked against): no Msg built, queue put and task woken by nats-py for each; made into a Msg as nats-py
        # builds it when a fetch takes it (``_read``)
        rawmsgs.route(self.nc, self.sub._id, self._frames)

    async def _take(self, msg: Msg) -> None:
        self._arrived.put_nowait(msg)

    def _frames(self, frames: list[rawmsgs.Raw]) -> None:
        for frame in frames:
            self._arrived.put_nowait(frame)

    async def _read(self, got: Msg | rawmsgs.Raw) -> Msg:
        """A delivery or status as nats-py reads it (``Client._build_message``; a plain header block by nats-py's
        parser, ``natsheaders``, a status line through ``Client._process_headers``)."""
        if not isinstance(got, tuple):  # built by nats-py already (the ordinary subscription)
            return got
        subject, reply, block, data = got
        headers: dict[str, str] | None = None
        if block is not None:
            if len(block) > _HEADER_LINE_END and block[_HEADER_LINE_SIZE] != _BLANK:
                headers = natsheaders.parse_header_lines(block[_HEADER_LINE_END:]) or None
            else:
                headers = await self.nc._process_headers(block)
        return Msg(self.nc, subject.decode(), reply.decode(), data, headers, _sid=self.sub._id)

    async def unsubscribe(self) -> None:
        if self.sub is not None:
            rawmsgs.unroute(self.nc, self.sub._id)
            await self.sub.unsubscribe()

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to ``batch`` messages: those delivered to earlier requests first, else as soon as the server has any
        (waiting up to ``timeout``). Raises ``TimeoutError`` when none came, nats-py's ``APIError`` when the server
        refuses the request (no such consumer, say)."""
        got: list[Msg] = []
        while len(got) < batch and not self._arrived.empty():  # delivered while nobody waited: handed over first
            msg = await self._read(self._arrived.get_nowait())
            if not _status(msg):  # an earlier request's status: that request is over, nothing to do
                got.append(msg)
        if got:
            return got
        self._count += 1
        reply = f"{self.prefix}{self._count}"
        await self.nc.publish(self.subject, json.dumps(
            {"batch": batch, "expires": int(timeout * 1e9), "no_wait": True}).encode(), reply=reply)
        deadline = time.monotonic() + timeout + ANSWER_GRACE_S
        while len(got) < batch:
            left = deadline - time.monotonic() if not got else min(deadline - time.monotonic(), FOLLOW_S)
            try:
                arrived = self._arrived.get_nowait() if not self._arrived.empty() else await asyncio.wait_for(
                    self._arrived.get(), timeout=max(0.0, left))
            except TimeoutError:  # lost with its server, or it holds what it was given: the caller asks again
                break
            msg = await self._read(arrived)
            status = _status(msg)
            if not status:
                got.append(msg)
            elif msg.subject != reply or status == api.StatusCode.CONTROL_MESSAGE:
                continue  # an earlier request's end (a status comes on its request's own subject), or a heartbeat
            elif status in _ENDS or (status == api.StatusCode.CONFLICT and got):
                break  # or a 409 cut it short (its consumer deleted, a new leader): what came is handed over
            else:  # refused, or cut short with nothing: raised, so the loop pauses instead of asking at once again
                raise APIError.from_msg(msg)
        if not got:
            raise TimeoutError(f"no message for {self.subject} within {timeout:.1f}s")
        return got


def _status(msg: Msg) -> str | None:
    return msg.headers.get(api.Header.STATUS) if msg.headers else None
