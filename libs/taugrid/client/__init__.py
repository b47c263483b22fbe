"""The public Python client: submit runs, read their state, follow and replay their events, cancel them.

The ``tau`` CLI is built on it; any program can do the same with a NATS connection and nothing else.
"""

from taugrid.client.client import CancelRefused, Client, open_client
from taugrid.client.snapshot import snapshot

__all__ = ["CancelRefused", "Client", "open_client", "snapshot"]
