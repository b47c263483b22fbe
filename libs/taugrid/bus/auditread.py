"""AUDIT read back as the run events it keeps, each at the sequence RUNS stored it under.

AUDIT sources RUNS, one source per kept filter (``topology.AUDIT_FILTERS``), so its own sequence numbers are not
RUNS', and events from different sources may land in another order than RUNS stored them. The server names each
sourced message's origin in its ``Nats-Stream-Source`` header (``RUNS <seq> <filter> <destination> <subject>
<id>``): readers get RUNS' sequence and RUNS' order back. An AUDIT an earlier release made mirrors all of RUNS: its
messages carry no such header and keep RUNS' sequences as they are.
"""

from __future__ import annotations

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, from_message
from taugrid.bus.replay import replay
from taugrid.bus.topology import AUDIT_STREAM

SOURCE_HEADER = "Nats-Stream-Source"


def origin_sequence(headers: dict[str, str] | None, seq: int) -> int:
    """RUNS' sequence of an AUDIT message: its source header's, else its own (a mirrored message keeps it)."""
    parts = (headers or {}).get(SOURCE_HEADER, "").split(" ")
    if len(parts) >= 2 and parts[0].split(":")[0] == "RUNS" and parts[1].isdigit():
        return int(parts[1])
    return seq


async def run_events(bus: Bus, subject: str) -> list[Event]:
    """The events AUDIT holds on ``subject`` (a run's: ``run.<ws>.<run>.>``), in RUNS' order, each with its RUNS
    sequence as ``seq``."""
    msgs = await replay(bus, stream=AUDIT_STREAM, subject=subject)
    events = [from_message(m.subject, m.headers, m.data,
                           seq=origin_sequence(m.headers, m.metadata.sequence.stream)) for m in msgs]
    return sorted(events, key=lambda ev: ev.seq)
