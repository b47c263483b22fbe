"""One ``exec.progress`` line per change, wherever a run's events are shown live (``tau run --follow``, the
portal's event list).

A pod's status changes more often than where it is: its containers' states, its phase and its conditions each
bring an ``exec.progress`` event, while the line a person reads (``summaries.event_detail``: the pod and its
first phase not yet through) says only the latter, so a finished pod would read ``started`` two or three times.
A line that repeats the same pod's last one in the same attempt says nothing new and is left out; the events
themselves stay on the stream (``tau events`` replays every one).
"""

from __future__ import annotations

from typing import Protocol


class _Shown(Protocol):
    type: str
    attempt: int


class ProgressLines:
    """Remembers each pod's last progress line, per attempt, for one reader of one run."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, str], str] = {}

    def repeats(self, ev: _Shown, detail: str) -> bool:
        """Whether ``ev``, shown as ``detail``, only repeats its pod's last line (then it is not shown)."""
        if ev.type != "exec.progress":
            return False
        pod = (ev.attempt, detail.split(":", 1)[0])
        if self._last.get(pod) == detail:
            return True
        self._last[pod] = detail
        return False
