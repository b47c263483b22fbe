"""NATS JetStream adapter: connection, bootstrap, CloudEvents envelope, consumer loop, tracing, run-state KV.

This package is the only one that imports nats-py (an import-linter contract holds it to that): every nats
exception is translated here, so the rest of taugrid sees only ``taugrid.core.errors`` and the bus errors
below. KV access goes through ``kv`` (create-once, compare-and-set, one reader), objects through ``objects``,
stored messages through ``replay`` and ``streams``.

The package's own names load on first use (PEP 562), so importing a light submodule (``taugrid.bus.envelope``,
which the CLI's views need) does not import nats-py and its HTTP stack: ``tau --help`` and ``tau run validate``
stay cold-start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from taugrid.core.errors import PermissionDenied

if TYPE_CHECKING:
    from taugrid.bus.connection import Bus, connect
    from taugrid.bus.envelope import Event
    from taugrid.bus.kv import Conflict

__all__ = ["Bus", "Conflict", "Event", "PermissionDenied", "connect"]

_LAZY = {"Bus": "taugrid.bus.connection", "connect": "taugrid.bus.connection", "Event": "taugrid.bus.envelope",
         "Conflict": "taugrid.bus.kv"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taugrid.bus' has no attribute {name!r}")
