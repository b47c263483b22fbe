"""Publishing in tests as the service that owns a subject: every consumer checks ``ce-source`` against the
permission table (``taugrid.core.publishing``), so a test that stands in for a service must say which one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from taugrid.bus import Bus
from taugrid.core.events import run_subject
from taugrid.core.publishing import publishers


@contextlib.contextmanager
def acting_as(bus: Bus, service: str) -> Iterator[Bus]:
    saved = bus.source
    bus.source = service
    try:
        yield bus
    finally:
        bus.source = saved


async def emit_as_owner(bus: Bus, **kw: Any) -> int:
    """``bus.emit(**kw)`` with ``ce-source`` set to the service the table allows to publish that event."""
    owners = publishers(run_subject(kw["workspace"], kw["run_id"], kw["event_type"]))
    with acting_as(bus, owners[0] if owners else bus.source):
        return await bus.emit(**kw)
