"""A run's history: RUNS' events as HISTORY and AUDIT keep them, one subject a run each (``topology.FEEDS``, issue 27).

RUNS has interest retention: an event leaves it once every durable whose filter matches acked it, so RUNS holds
only what the stages have still to read. Readers of what a run did (``tau events``, the portal, the evidence's
seal, ``tau verify``, a record rebuilt) read HISTORY, where a run's events sit under ``h.<ws>.<run>``, and AUDIT,
which keeps the kinds verification needs (the request, a cancellation, the end, the seal) under ``a.<ws>.<run>``
and is the run's history for those kinds: HISTORY does not copy them a second time. Each copy reads back as RUNS
stored it (``envelope.from_message`` takes the subject and sequence the server wrote in its source header). A
filter on RUNS' subjects (``run.<ws>.<run>.<stage>.<outcome>``, wildcards allowed) is read as a filter on the runs'
subjects there (``stored_filter``, ``audit_filter``), and what those subjects hold beyond the filter is left out by
each event's own subject (``wanted``).

Four feeds source the two streams (the high lane's events have a sixth token), each at its own pace, so a run's
events may be stored in another order than RUNS stored them: ``run_events`` sorts them by their RUNS sequence, and a
reader that must have the whole run up to an event (``through``) waits until HISTORY and AUDIT hold every event of
the run RUNS still holds up to it (one feed may lag another by seconds while its source is re-established). A copy
seen twice (a source that restarted from an earlier position; anyone's consumer delivering RUNS' messages to a
feed's subject, which only RUNS' own messages could be) reads as the same event at the same sequence and is kept
once.
"""

from __future__ import annotations

import asyncio
import time

from taugrid.bus import auditread, streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.kept import (  # re-exported: readers of a run's history find them here
    RUNS_STREAM,
    audit_filter,
    in_runs_order,
    stored_filter,
    wanted,
    whole,
)
from taugrid.bus.topology import (
    AUDIT_STREAM,
    FEEDS,
    HISTORY_STREAM,
    audit_subject,
    history_subject,
)
from taugrid.core.errors import TemporaryError
from taugrid.core.publishing import subject_matches

__all__ = ["CATCH_UP_S", "HISTORY_STREAM", "RUNS_STREAM", "audit_filter", "in_runs_order", "run_events",
           "stored_filter", "wanted", "whole"]

# how long a reader that needs an event RUNS has stored waits for HISTORY to hold it (the feed's copy takes about
# a millisecond; a source re-established after a server restart takes seconds)
CATCH_UP_S = 10.0


async def run_events(bus: Bus, workspace: str, run_id: str, *, through: int | None = None,
                     wait_s: float = CATCH_UP_S) -> list[Event]:
    """Run ``run_id``'s events in RUNS' order, each at its RUNS sequence: HISTORY's and AUDIT's copies, by direct
    gets on the run's one subject in each (one batch request a stream, no consumer; a replay where AUDIT allows no
    direct gets: an earlier release's). ``through``: a RUNS sequence the caller saw stored (a terminal event it
    handles): they are read again until they hold that one and every earlier event of the run (``_uncopied``), for
    up to ``wait_s``, then ``TemporaryError``; events after it are left out. A run whose request is in neither (an
    earlier release's AUDIT kept it under RUNS' own subject) is completed from there."""
    deadline = time.monotonic() + wait_s
    while True:
        # RUNS first: an event it no longer holds was acked by every feed, so was held before this read
        pending = await _uncopied(bus, workspace, run_id, through) if through is not None else set()
        events = await _held(bus, workspace, run_id)
        if through is None:
            return events
        held = {ev.seq for ev in events}
        if through in held and pending <= held:
            return [ev for ev in events if ev.seq <= through]
        if time.monotonic() >= deadline:
            missing = sorted(({through} | pending) - held)
            raise TemporaryError(f"{HISTORY_STREAM} and {AUDIT_STREAM} do not hold RUNS' events {missing} of run "
                                 f"{run_id} after {wait_s:.0f} s (are their feeds sourcing them?)", delay=1.0)
        await asyncio.sleep(0.002)


async def _held(bus: Bus, workspace: str, run_id: str) -> list[Event]:
    """What HISTORY and AUDIT hold of the run, in RUNS' order."""
    events = await streams.history(bus, HISTORY_STREAM, history_subject(workspace, run_id))
    try:
        events += await streams.history(bus, AUDIT_STREAM, audit_subject(workspace, run_id))
    except streams.DirectGetUnavailable:  # an earlier release's AUDIT, until the break-glass --update
        events += await _audit_replay(bus, f"run.{workspace}.{run_id}.>")
    else:
        if events and not any(ev.type == "submit.requested" for ev in events):
            events += await _audit_replay(bus, f"run.{workspace}.{run_id}.>")  # kept by an earlier release
    return in_runs_order(events)


async def _audit_replay(bus: Bus, subject: str) -> list[Event]:
    return await auditread.run_events(bus, subject)


def _copied(subject: str) -> bool:
    """Whether a feed copies what RUNS stores on ``subject`` (into HISTORY or AUDIT)."""
    return any(subject_matches(f, subject) for feed in FEEDS for f in feed.filters)


async def _uncopied(bus: Bus, workspace: str, run_id: str, through: int) -> set[int]:
    """The RUNS sequences, up to ``through``, of the run's events RUNS still holds: those HISTORY must hold before
    the run's history is whole. Each feed copies in RUNS' order, but the two feeds go at their own pace: one
    re-established after a restart (or at a fresh bootstrap, ~0.1 s) lags the other, so holding ``through`` says
    nothing of an earlier event the other feed copies (a high-lane run's request). The last event of each of the
    run's subjects is enough (one request, not one an event): a subject's events all go through one feed, which
    copies them in RUNS' order, so a copy of its last one follows copies of those before it."""
    try:
        held = await streams.last_per_subject(bus, RUNS_STREAM, f"run.{workspace}.{run_id}.>", up_to=through)
    except streams.DirectGetUnavailable:  # an earlier release's RUNS, until the break-glass --update: ``through``
        return set()  # alone is waited for
    return {ev.seq for ev in held if ev.seq <= through and _copied(ev.nats_subject)}
