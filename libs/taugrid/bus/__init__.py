"""NATS JetStream adapter: connection, bootstrap, CloudEvents envelope, consumer loop, tracing, run-state KV.

This package is the only one that imports nats-py (an import-linter contract holds it to that): every nats
exception is translated here, so the rest of taugrid sees only ``taugrid.core.errors`` and the bus errors
below. KV access goes through ``kv`` (create-once, compare-and-set, one reader), objects through ``objects``,
stored messages through ``replay`` and ``streams``.
"""

from taugrid.bus.connection import Bus, connect
from taugrid.bus.envelope import Event
from taugrid.bus.kv import Conflict
from taugrid.core.errors import PermissionDenied

__all__ = ["Bus", "Conflict", "Event", "PermissionDenied", "connect"]
