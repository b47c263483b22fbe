"""Pure helpers for shipping pod logs: timestamped lines, the position already shipped, container order.

A position is (container index, last shipped timestamp, lines shipped with exactly that timestamp). The pod
log API with ``timestamps=true`` prefixes every line with its RFC3339Nano time; ``sinceTime`` has one-second
precision, so a resumed stream repeats lines from the start of that second: ``Position.fresh`` drops every
line before the last shipped timestamp and the first ``at_since`` lines carrying it. Timestamps are compared
as integers (seconds, nanoseconds), never as strings (the kubelet trims trailing zeros).

Invariants: no I/O; the same pod object and position always give the same answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from taugrid.kube.translate import LABEL_ATTEMPT, LABEL_RUN_ID, LABEL_WORKSPACE

_RFC3339 = re.compile(
    r"^(?P<whole>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))?(?P<zone>Z|[+-]\d\d:\d\d)$"
)


def split_line(raw: str) -> tuple[str, str]:
    """``"<ts> <text>"`` → (ts, text); a line without a timestamp (should not happen) → ("", raw)."""
    ts, sep, text = raw.partition(" ")
    if not sep or not ts[:4].isdigit() or "T" not in ts:
        return "", raw
    return ts, text


def ts_key(ts: str) -> tuple[int, int]:
    """RFC3339(Nano) → (unix seconds, nanoseconds); "" or unparseable → (0, 0)."""
    m = _RFC3339.match(ts)
    if not m:
        return 0, 0
    zone = "+00:00" if m["zone"] == "Z" else m["zone"]
    seconds = int(datetime.fromisoformat(m["whole"] + zone).timestamp())
    return seconds, int((m["frac"] or "").ljust(9, "0")[:9] or 0)


def since_param(ts: str) -> str | None:
    """The ``sinceTime`` query value for a position: its second, in UTC (None from the start)."""
    if not ts:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts_key(ts)[0]))


class Position(msgspec.Struct):
    """How far a pod's logs have been shipped, and the chunk being shipped (``pending`` lines) if any."""

    container: int = 0
    since: str = ""
    at_since: int = 0
    seq: int = 0
    pending: int = 0
    done: bool = False

    def advanced(self, stamps: list[str]) -> Position:
        """The position after shipping lines with these timestamps (in order), with the next seq."""
        last = stamps[-1]
        same = sum(1 for s in stamps if ts_key(s) == ts_key(last))
        carried = self.at_since if ts_key(last) == ts_key(self.since) and len(stamps) == same else 0
        return Position(container=self.container, since=last, at_since=carried + same, seq=self.seq + 1)


class Filter:
    """Drops the lines of a resumed stream that a position says were already shipped."""

    def __init__(self, position: Position) -> None:
        self.since = ts_key(position.since)
        self.skip = position.at_since

    def fresh(self, ts: str) -> bool:
        key = ts_key(ts)
        if key < self.since:
            return False
        if key == self.since and self.skip > 0:
            self.skip -= 1
            return False
        return True


def containers(pod: Mapping[str, Any]) -> list[str]:
    """Every container in the order it runs: init containers, then the others."""
    spec = pod.get("spec") or {}
    return [c["name"] for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]


def container_state(pod: Mapping[str, Any], name: str) -> str:
    """``waiting`` | ``running`` | ``terminated`` | ``never`` (the pod finished without starting it)."""
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        if cs.get("name") == name:
            state = cs.get("state") or {}
            if "terminated" in state:
                return "terminated"
            if "running" in state:
                return "running"
    if status.get("phase") in ("Succeeded", "Failed"):
        return "never"
    return "waiting"


def run_of(pod: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """(workspace, run id, attempt) from the tau labels, or None for a pod that is not a run's."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    run, ws, attempt = labels.get(LABEL_RUN_ID), labels.get(LABEL_WORKSPACE), labels.get(LABEL_ATTEMPT, "")
    if not run or not ws or not attempt.isdigit():
        return None
    return ws, run, int(attempt)
