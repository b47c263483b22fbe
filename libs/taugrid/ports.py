"""Loopback port helpers that every layer may use (the stack's nats-server, the local cluster's rendezvous,
the tests). Kept apart from ``taugrid.stack`` so that lower layers need not import it."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the usual bind-to-0 probe; racy by nature)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a TCP port on 127.0.0.1 can be bound now (racy by nature, as ``free_port``)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a port in TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
