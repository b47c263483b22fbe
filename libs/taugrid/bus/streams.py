"""Direct reads of single stored stream messages (no consumer), with taugrid's errors.

A direct get costs one request, where a filtered replay would create and delete a consumer: use these for
"the last message on a subject" and "the message at a sequence the caller recorded".
"""

from __future__ import annotations

import nats

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.core.errors import TemporaryError


async def _get(bus: Bus, stream: str, **where: object) -> Event | None:
    try:
        msg = await bus.js.get_msg(stream, **where)  # type: ignore[arg-type]
    except nats.js.errors.NotFoundError:
        return None
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"reading {stream} ({where}) failed: {exc!r}", delay=1.0) from exc
    return from_message(msg.subject or "", msg.headers, msg.data or b"", seq=int(msg.seq or 0))


async def last(bus: Bus, stream: str, subject: str) -> Event | None:
    """The newest message of ``stream`` on ``subject``, or None when there is none."""
    return await _get(bus, stream, subject=subject)


async def at(bus: Bus, stream: str, seq: int) -> Event | None:
    """The message at sequence ``seq``, or None when it is gone (aged out, deleted) or never existed."""
    return await _get(bus, stream, seq=seq)


async def holds(bus: Bus, stream: str, subject: str) -> bool:
    """Whether ``stream`` holds any message on ``subject``."""
    return await _get(bus, stream, seq=1, subject=subject, next=True) is not None


async def bounds(bus: Bus, stream: str) -> tuple[int, int]:
    """(first, last) sequence ``stream`` holds; (0, 0) when it is missing."""
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return 0, 0
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"reading {stream}'s state failed: {exc!r}", delay=1.0) from exc
    return int(info.state.first_seq or 0), int(info.state.last_seq or 0)
