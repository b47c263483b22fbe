"""Where RUNS' events are kept, as subjects: a filter on RUNS' subjects read as HISTORY's and AUDIT's (pure, no I/O).

HISTORY keeps a run's events under ``h.<ws>.<run>`` and AUDIT the kinds verification needs under ``a.<ws>.<run>``
(``topology.FEEDS``, ``bus/history.py``): a reader's filter on RUNS' subjects is read on the runs' subjects there
(``stored_filter``, ``audit_filter``), and what those hold beyond the filter is left out by each event's own RUNS
subject (``wanted``), which ``envelope.from_message`` reads from the copy's source header.
"""

from __future__ import annotations

from taugrid.bus.envelope import Event
from taugrid.bus.topology import AUDIT_PREFIX, HISTORY_PREFIX
from taugrid.core.publishing import subject_matches

RUNS_STREAM = "RUNS"


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


def audit_filter(subject: str) -> str:
    """AUDIT's filter (its keyed subjects, ``a.<ws>.<run>``) for a filter on RUNS' subjects, as ``stored_filter``."""
    return AUDIT_PREFIX + stored_filter(subject)[len(HISTORY_PREFIX):]


def whole(subject: str) -> bool:
    """Whether ``subject`` asks for everything its HISTORY filter holds (nothing to leave out by type)."""
    parts = subject.split(".")
    return parts[0] == ">" or (len(parts) <= 4 and parts[-1] == ">")


def wanted(subject: str, events: list[Event]) -> list[Event]:
    """The events of ``events`` (read from HISTORY on ``stored_filter(subject)``) that RUNS stored on a subject
    ``subject`` matches."""
    if whole(subject):
        return events
    return [ev for ev in events if subject_matches(subject, ev.nats_subject)]


def in_runs_order(events: list[Event]) -> list[Event]:
    """``events`` by RUNS sequence, each sequence once."""
    seen: dict[int, Event] = {}
    for ev in events:
        seen.setdefault(ev.seq, ev)
    return [seen[seq] for seq in sorted(seen)]
