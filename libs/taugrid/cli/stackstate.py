"""The embedded stack's state file (``<data dir>/stack.json``, written by its supervisor) as the CLI reads it:
``tau up``/``down``/``stack`` and ``tau portal`` (which finds the stack's portal in it) share these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taugrid.local.pods import pid_alive


def read_state(d: Path) -> dict[str, Any] | None:
    """The state file of the stack in data dir ``d``; None when there is none or it does not parse."""
    try:
        return json.loads((d / "stack.json").read_text())
    except (OSError, ValueError):
        return None


def running(d: Path) -> dict[str, object] | None:
    """The state of the stack in ``d`` when it is up (ready, its supervisor alive); else None."""
    state = read_state(d)
    if state and state.get("phase") == "ready" and pid_alive(state.get("pid")):
        return state
    return None
