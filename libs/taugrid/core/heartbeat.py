"""When a node whose agent publishes only changes and heartbeats (``health.change``) is taken to be gone.

Pure: every reader of a node's last sample (``tau nodes``, the portal, ``health.wire.silent``) judges it here, so
they cannot disagree. A node is silent after ``SILENT_AFTER_HEARTBEATS`` heartbeat intervals without a sample: a
heartbeat is published at most one sample interval (itself at most a heartbeat interval) after it is due, so a gap
past two intervals means at least one heartbeat was missed, not merely late.
"""

from __future__ import annotations

# An agent that states no heartbeat (one that publishes every sample) is judged against the default interval's.
UNSTATED_HEARTBEAT_S = 60.0
SILENT_AFTER_HEARTBEATS = 2


def silent_after(heartbeat_s: float) -> float:
    """Seconds without a sample after which the node's agent is taken to have stopped."""
    return SILENT_AFTER_HEARTBEATS * (heartbeat_s or UNSTATED_HEARTBEAT_S)


def silent(last_sample: float, heartbeat_s: float, now: float) -> bool:
    """No sample, not even a heartbeat, for longer than ``silent_after``; False for a node never sampled."""
    return bool(last_sample) and now - last_sample > silent_after(heartbeat_s)
