"""The public Python client: submit runs, read their state, follow and replay their events, cancel them.

The ``tau`` CLI is built on it; any program can do the same with a NATS connection and nothing else.
The package's names load on first use (PEP 562), so a light submodule (``taugrid.client.locate``: where the
stack's data lives) does not bring in nats-py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taugrid.client.client import CancelRefused, Client, open_client
    from taugrid.sources.archive import snapshot

__all__ = ["CancelRefused", "Client", "open_client", "snapshot"]

_LAZY = {"CancelRefused": "taugrid.client.client", "Client": "taugrid.client.client",
         "open_client": "taugrid.client.client", "snapshot": "taugrid.sources.archive"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taugrid.client' has no attribute {name!r}")
