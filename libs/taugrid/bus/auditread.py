"""AUDIT read back as the run events it keeps, each at the sequence RUNS stored it under.

AUDIT sources RUNS through its feeds (``topology.FEEDS``), keeping a run's events under one subject a run
(``a.<ws>.<run>``), so its own sequence numbers are not RUNS', and events from its two feeds may land in another
order than RUNS stored them. The server names each sourced message's origin in its ``Nats-Stream-Source`` header
(``RUNS[:C=<consumer>] <seq> <filter> <destination> <subject> <id>``), which ``envelope.from_message`` reads back:
RUNS' subject and sequence, so RUNS' order. An AUDIT an earlier release made holds them under RUNS' own subjects
(sourced one filter at a time, or mirrored: a mirror's messages carry no such header and keep RUNS' sequences as
they are); both are read.
"""

from __future__ import annotations

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import SOURCE_HEADER, Event, from_message, sourced
from taugrid.bus.kept import audit_filter, in_runs_order, wanted
from taugrid.bus.replay import replay
from taugrid.bus.topology import AUDIT_STREAM

__all__ = ["SOURCE_HEADER", "origin_sequence", "run_events"]


def origin_sequence(headers: dict[str, str] | None, seq: int) -> int:
    """RUNS' sequence of an AUDIT message: its source header's, else its own (a mirrored message keeps it)."""
    origin = (headers or {}).get(SOURCE_HEADER)
    return sourced(origin, "", seq)[1] if origin is not None else seq


async def run_events(bus: Bus, subject: str) -> list[Event]:
    """The events AUDIT holds on ``subject`` (a run's: ``run.<ws>.<run>.>``), in RUNS' order, each with its RUNS
    sequence as ``seq``."""
    msgs = [*await replay(bus, stream=AUDIT_STREAM, subject=audit_filter(subject)),
            *await replay(bus, stream=AUDIT_STREAM, subject=subject)]  # an earlier release's AUDIT
    # with the time AUDIT stored each (``Msg.metadata``, as a consumer's delivery reads it): a store-stamped event
    # has no time of its own, and read without it, a run sealed from this reading had its end without one
    events = [from_message(m.subject, m.headers, m.data, seq=(meta := m.metadata).sequence.stream,
                           stored=meta.timestamp.timestamp()) for m in msgs]
    return in_runs_order(wanted(subject, events))
