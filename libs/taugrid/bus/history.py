"""A run's history: RUNS' events as HISTORY keeps them, one subject a run (``topology.FEEDS``, issue 27).

RUNS has interest retention: an event leaves it once every durable whose filter matches acked it, so RUNS holds
only what the stages have still to read. Readers of what a run did (``tau events``, the portal, the evidence's
seal, ``tau verify``, a record rebuilt) read HISTORY, where the run's events sit under ``h.<ws>.<run>`` and each
reads back as RUNS stored it (``envelope.from_message`` takes the subject and sequence the server wrote in its
source header). A filter on RUNS' subjects (``run.<ws>.<run>.<stage>.<outcome>``, wildcards allowed) is read as
HISTORY's filter on the run's subject (``stored_filter``), and what that subject holds beyond the filter is left
out by the event's own subject (``wanted``).

Two feeds source HISTORY (the high lane's events have a sixth token), so a run's events may be stored in another
order than RUNS stored them: ``run_events`` sorts them by their RUNS sequence, and a reader that must have the whole
run up to an event (``through``) waits until HISTORY holds every event of the run RUNS still holds up to it (one
feed may lag the other by seconds while its source is re-established). A copy seen twice (a source that
restarted from an earlier position; anyone's consumer delivering RUNS' messages to a feed's subject, which only
RUNS' own messages could be) reads as the same event at the same sequence and is kept once.
"""

from __future__ import annotations

import asyncio
import time

from taugrid.bus import streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.topology import FEEDS, HISTORY_PREFIX, HISTORY_STREAM, history_subject
from taugrid.core.errors import TemporaryError

RUNS_STREAM = "RUNS"
# how long a reader that needs an event RUNS has stored waits for HISTORY to hold it (the feed's copy takes about
# a millisecond; a source re-established after a server restart takes seconds)
CATCH_UP_S = 10.0


def stored_filter(subject: str) -> str:
    """HISTORY's filter for a filter on RUNS' subjects: the run's subject (``h.<ws>.<run>``, either token a
    wildcard), or every run of a workspace, or all (``>`` in the workspace or run token)."""
    parts = subject.split(".")
    if parts[0] not in ("run", "*", ">"):
        raise ValueError(f"{subject!r} is not a filter on RUNS' run events (run.<ws>.<run>.<stage>.<outcome>)")
    if parts[0] == ">":
        return f"{HISTORY_PREFIX}.>"
    out = [HISTORY_PREFIX]
    for tok in parts[1:3]:
        if tok == ">":
            return ".".join([*out, ">"])
        out.append(tok)
    if len(out) < 3:  # ``run`` or ``run.<ws>``: no run event has so few tokens
        raise ValueError(f"{subject!r} matches no run event (run.<ws>.<run>.<stage>.<outcome>)")
    return ".".join(out)


def whole(subject: str) -> bool:
    """Whether ``subject`` asks for everything its HISTORY filter holds (nothing to leave out by type)."""
    parts = subject.split(".")
    return parts[0] == ">" or (len(parts) <= 4 and parts[-1] == ">")


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more at the end."""
    want, got = pattern.split("."), subject.split(".")
    for i, tok in enumerate(want):
        if tok == ">":
            return len(got) > i
        if i >= len(got) or (tok != "*" and tok != got[i]):
            return False
    return len(want) == len(got)


def wanted(subject: str, events: list[Event]) -> list[Event]:
    """The events of ``events`` (read from HISTORY on ``stored_filter(subject)``) that RUNS stored on a subject
    ``subject`` matches."""
    if whole(subject):
        return events
    return [ev for ev in events if matches(subject, ev.nats_subject)]


def in_runs_order(events: list[Event]) -> list[Event]:
    """``events`` by RUNS sequence, each sequence once."""
    seen: dict[int, Event] = {}
    for ev in events:
        seen.setdefault(ev.seq, ev)
    return [seen[seq] for seq in sorted(seen)]


async def run_events(bus: Bus, workspace: str, run_id: str, *, through: int | None = None,
                     wait_s: float = CATCH_UP_S) -> list[Event]:
    """Run ``run_id``'s events in RUNS' order, each at its RUNS sequence (direct gets on its HISTORY subject, one
    request a message, no consumer). ``through``: a RUNS sequence the caller saw stored (a terminal event it
    handles): HISTORY is read again until it holds that one and every earlier event of the run (``_uncopied``),
    for up to ``wait_s``, then ``TemporaryError``; events after it are left out."""
    subject = history_subject(workspace, run_id)
    deadline = time.monotonic() + wait_s
    while True:
        # RUNS first: an event it no longer holds was acked by both feeds, so HISTORY held it before this read
        pending = await _uncopied(bus, workspace, run_id, through) if through is not None else set()
        events = in_runs_order(await streams.history(bus, HISTORY_STREAM, subject))
        if through is None:
            return events
        held = {ev.seq for ev in events}
        if through in held and pending <= held:
            return [ev for ev in events if ev.seq <= through]
        if time.monotonic() >= deadline:
            missing = sorted(({through} | pending) - held)
            raise TemporaryError(f"{HISTORY_STREAM} does not hold RUNS' events {missing} of run {run_id} after "
                                 f"{wait_s:.0f} s (is its feed sourcing it?)", delay=1.0)
        await asyncio.sleep(0.002)


def _copied(subject: str) -> bool:
    """Whether a feed copies what RUNS stores on ``subject`` into HISTORY."""
    return any(matches(f, subject) for feed in FEEDS if feed.into == HISTORY_STREAM for f in feed.filters)


async def _uncopied(bus: Bus, workspace: str, run_id: str, through: int) -> set[int]:
    """The RUNS sequences, up to ``through``, of the run's events RUNS still holds: those HISTORY must hold before
    the run's history is whole. Each feed copies in RUNS' order, but the two feeds go at their own pace: one
    re-established after a restart (or at a fresh bootstrap, ~0.1 s) lags the other, so holding ``through`` says
    nothing of an earlier event the other feed copies (a high-lane run's request)."""
    try:
        held = await streams.history(bus, RUNS_STREAM, f"run.{workspace}.{run_id}.>")
    except streams.DirectGetUnavailable:  # an earlier release's RUNS, until the break-glass --update: ``through``
        return set()  # alone is waited for
    return {ev.seq for ev in held if ev.seq <= through and _copied(ev.nats_subject)}
