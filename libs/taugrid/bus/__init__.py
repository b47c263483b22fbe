"""NATS JetStream adapter: connection, bootstrap, CloudEvents envelope, consumer loop, tracing, run-state KV.

Every nats exception is translated here; services see only ``taugrid.core.errors``.
"""

from taugrid.bus.connection import Bus, connect
from taugrid.bus.envelope import Event

__all__ = ["Bus", "Event", "connect"]
