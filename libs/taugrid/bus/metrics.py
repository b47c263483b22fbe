"""Prometheus metrics of a service's consumers: how long each event type takes to handle and how it ends, what is
redelivered and dead-lettered, and each durable's pending and ack-pending counts.

Off the wire by default: a service serves ``/metrics`` only when ``TAU_METRICS_PORT`` is set (the embedded stack
sets one port per service replica when ``tau up`` runs with ``TAU_METRICS_BASE_PORT``). The metrics live in the
process's default registry, so a scrape sees every loop of the service.
"""

from __future__ import annotations

import os

from prometheus_client import Counter, Gauge, Histogram, start_http_server

PORT_ENV = "TAU_METRICS_PORT"
ADDR_ENV = "TAU_METRICS_ADDR"

HANDLED = Histogram(
    "taugrid_handler_seconds", "Time to handle one event, by durable, event type and outcome "
    "(ack | retry | error | dead_letter | refused)", ["durable", "event_type", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
REDELIVERED = Counter("taugrid_redeliveries_total", "Events delivered again (after a nak or an ack timeout)",
                      ["durable"])
DEAD_LETTERS = Counter("taugrid_dead_letters_total", "Events a consumer dead-lettered, by why",
                       ["durable", "why"])
PENDING = Gauge("taugrid_consumer_pending", "Events in the stream the durable has not been handed yet", ["durable"])
ACK_PENDING = Gauge("taugrid_consumer_ack_pending", "Events handed out and not yet acknowledged", ["durable"])


def serve_from_env() -> int | None:
    """Serve ``/metrics`` on ``TAU_METRICS_PORT`` (address ``TAU_METRICS_ADDR``, default all interfaces, for a
    Prometheus in the cluster); the port, or None when metrics are off."""
    port = os.environ.get(PORT_ENV, "").strip()
    if not port:
        return None
    start_http_server(int(port), addr=os.environ.get(ADDR_ENV, "0.0.0.0"))
    return int(port)
