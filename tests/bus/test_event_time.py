"""``Event.happened``: accounting times an event by its own ``ce-time``, and by its store time only when it has
no readable one."""

from __future__ import annotations

from taugrid.bus.envelope import Event


def event(time: str, stored: float) -> Event:
    return Event(id="x", type="exec.running", source="/svc/admission-watcher", subject="r", time=time, data=b"",
                 stored=stored)


def test_an_event_happened_at_its_ce_time_not_when_it_was_stored() -> None:
    assert event("2026-01-01T00:00:02.250Z", stored=1767225605.0).happened == 1767225602.25


def test_an_event_without_a_readable_time_happened_when_it_was_stored() -> None:
    assert event("", stored=1767225605.5).happened == 1767225605.5
    assert event("yesterday", stored=1767225605.5).happened == 1767225605.5
