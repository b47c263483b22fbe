"""Prometheus metrics of a service's consumers: how long each event type takes to handle and how it ends, what is
redelivered and dead-lettered, and each durable's pending and ack-pending counts; the local cluster's (or
kube-bridge's) queue depth and quota per ClusterQueue; the health monitor's GPU figures, XIDs and cordons per node;
and in every process, how long each KV and object-store operation through ``bus/kv.py`` / ``bus/objects.py`` takes.

Off the wire by default: a service serves ``/metrics`` only when ``TAU_METRICS_PORT`` is set (the embedded stack
sets one port per service replica when ``tau up`` runs with ``TAU_METRICS_BASE_PORT``), and then on the loopback
interface unless ``TAU_METRICS_ADDR`` names another address (the Helm chart gives each pod its own IP, behind a
NetworkPolicy): the endpoint has no authentication. The metrics live in the process's default registry, so a
scrape sees every loop of the service.

Label values are bounded: an event type outside the catalogue (``KNOWN_TYPES``) is counted as ``unknown``, since
anyone who may publish on a subject chooses its type, and every label value is a new series in every scrape.

prometheus_client is imported only where something is recorded (issue 27: it and the http.server, wsgiref and
urllib.request modules it brings are about 2 MB resident in each process). A metric here is a ``Metric`` that
makes its prometheus_client metric, with every other one, on its first use; a service started without
``TAU_METRICS_PORT`` records nothing (``record(False)``, from ``taugrid.service.run``), so it never imports
prometheus_client and every observation on its hot paths is a no-op. Any other process (the CLI, the tests)
records as before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from taugrid.core.events import RUN_EVENTS
from taugrid.settings.model import MetricsSettings

PORT_ENV = "TAU_METRICS_PORT"
ADDR_ENV = "TAU_METRICS_ADDR"
DEFAULT_ADDR = "127.0.0.1"  # the endpoint has no authentication: nothing off the machine reaches it unless asked

UNKNOWN_TYPE = "unknown"
# Event types outside the run lifecycle as ``Event.type`` reads them (``envelope.from_message``): node reports,
# backend requests, log chunks, and a watch change ``<kind>.<change>`` of every kind kube-bridge watches
# (``kube.watch.DEFAULT_RESOURCES``) or the local cluster publishes. tests/security/test_metrics_exposure.py keeps
# these lists equal to what the platform publishes.
WATCHED_KINDS = ("workload", "job", "rayjob", "pod", "node", "event", "clusterqueue", "localqueue")
OTHER_TYPES = frozenset({"node.sample", "node.condition", "node.cordon", "node.uncordon", "node.validation",
                         "node.repair", "backend.apply", "backend.delete", "backend.reserve", "log.chunk"})
KNOWN_TYPES = frozenset(RUN_EVENTS) | OTHER_TYPES | frozenset(
    f"{kind}.{change}" for kind in WATCHED_KINDS for change in ("added", "modified", "deleted"))


# Whether this process records metrics at all (``record``).
_recording = True
_DECLARED: list[Metric] = []
_MAKING = threading.Lock()


class Ignored:
    """What ``Metric.labels`` gives where nothing is recorded: every observation a no-op."""

    __slots__ = ()

    def observe(self, amount: float) -> None:
        pass

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass


IGNORED = Ignored()


class Metric:
    """A prometheus_client metric (``kind``: Counter, Gauge or Histogram) declared here and made on first use, with
    every other declared one, in the process's default registry; a no-op while the process does not record."""

    __slots__ = ("kind", "name", "documentation", "labelnames", "buckets", "made")

    def __init__(self, kind: str, name: str, documentation: str, labelnames: list[str],
                 buckets: tuple[float, ...] = ()) -> None:
        self.kind, self.name, self.documentation, self.labelnames = kind, name, documentation, labelnames
        self.buckets = buckets
        self.made: Any = None
        _DECLARED.append(self)

    def labels(self, *values: str) -> Any:
        """The child for ``values`` (prometheus_client's ``labels``), or ``IGNORED`` while nothing is recorded."""
        if not _recording:
            return IGNORED
        if self.made is None:
            make_all()
        return self.made.labels(*values)


def counter(name: str, documentation: str, labelnames: list[str]) -> Metric:
    return Metric("Counter", name, documentation, labelnames)


def gauge(name: str, documentation: str, labelnames: list[str]) -> Metric:
    return Metric("Gauge", name, documentation, labelnames)


def histogram(name: str, documentation: str, labelnames: list[str], *, buckets: tuple[float, ...]) -> Metric:
    return Metric("Histogram", name, documentation, labelnames, buckets)


def make_all() -> None:
    """Make every declared metric in prometheus_client's default registry (once): what a scrape lists."""
    with _MAKING:
        if _DECLARED[0].made is not None:
            return
        import prometheus_client

        for m in _DECLARED:
            kind = getattr(prometheus_client, m.kind)
            extra = {"buckets": m.buckets} if m.buckets else {}
            m.made = kind(m.name, m.documentation, m.labelnames, **extra)


def record(on: bool) -> None:
    """Whether this process records metrics from now on: ``taugrid.service.run`` says no where no ``/metrics``
    is served (nothing would ever read them)."""
    global _recording
    _recording = on
    _CHILDREN.clear()  # no child looked up before outlives the change


def type_label(event_type: str) -> str:
    """``event_type`` when the catalogue knows it, else ``unknown``: one series for every made-up type."""
    return event_type if event_type in KNOWN_TYPES else UNKNOWN_TYPE


HANDLED = histogram(
    "taugrid_handler_seconds", "Time to handle one event, by durable, event type and outcome "
    "(ack | retry | error | dead_letter | refused)", ["durable", "event_type", "outcome"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
REDELIVERED = counter("taugrid_redeliveries_total", "Events delivered again (after a nak or an ack timeout)",
                      ["durable"])
DEAD_LETTERS = counter("taugrid_dead_letters_total", "Events a consumer dead-lettered, by why",
                       ["durable", "why"])
PENDING = gauge("taugrid_consumer_pending", "Events in the stream the durable has not been handed yet", ["durable"])
ACK_PENDING = gauge("taugrid_consumer_ack_pending", "Events handed out and not yet acknowledged", ["durable"])


def listen_addr(given: MetricsSettings) -> str:
    """Where ``/metrics`` listens: ``TAU_METRICS_ADDR``, else the loopback interface."""
    return given.addr.strip() or DEFAULT_ADDR


# Whether this process serves ``/metrics`` (``serve``): gauges that grow with the platform are set only then.
SERVED = False


def serve(given: MetricsSettings) -> int | None:
    """Serve ``/metrics`` on ``TAU_METRICS_PORT`` at ``listen_addr``; the port, or None when metrics are off."""
    global SERVED
    if given.port is None:
        return None
    make_all()
    from prometheus_client import start_http_server

    start_http_server(given.port, addr=listen_addr(given))
    SERVED = True
    return given.port


# ---------------------------------------------------------------- queues (local cluster; kube-bridge on Kubernetes)
QUEUE_PENDING = gauge("taugrid_queue_pending", "Workloads waiting in a ClusterQueue", ["cluster_queue"])
QUEUE_ADMITTED = gauge("taugrid_queue_admitted", "Workloads admitted in a ClusterQueue", ["cluster_queue"])
QUEUE_QUOTA = gauge("taugrid_queue_quota", "A ClusterQueue's quota by resource and kind (nominal | used | "
                    "borrowed | lent); cpu in cores, memory in bytes, GPUs in devices",
                    ["cluster_queue", "resource", "kind"])


def observe_queues(queues: list[dict[str, Any]]) -> None:
    """Set the queue gauges from a ``tau queue`` snapshot's ``queues`` (the same shape on both backends), in a
    process that serves ``/metrics`` only: a series is four objects and a lock, and 1,000 ClusterQueues make
    about 4,000 series (2.6 MB) that no one could read where metrics are off, as in the embedded stack by default."""
    if not SERVED:
        return
    for q in queues:
        name = str(q["cluster_queue"])
        QUEUE_PENDING.labels(name).set(float(q.get("pending_count", len(q.get("pending") or []))))
        QUEUE_ADMITTED.labels(name).set(float(q.get("admitted") or 0))
        for kind in ("nominal", "used", "borrowed", "lent"):
            for resource, value in (q.get(kind) or {}).items():
                QUEUE_QUOTA.labels(name, resource, kind).set(float(value))


# ---------------------------------------------------------------- GPUs and nodes (health monitor)
GPU_TEMPERATURE = gauge("taugrid_gpu_temperature_celsius", "GPU temperature", ["node", "gpu"])
GPU_UTILIZATION = gauge("taugrid_gpu_utilization_percent", "GPU utilisation", ["node", "gpu"])
GPU_MEMORY_USED = gauge("taugrid_gpu_memory_used_bytes", "GPU memory in use", ["node", "gpu"])
GPU_MEMORY_TOTAL = gauge("taugrid_gpu_memory_total_bytes", "GPU memory", ["node", "gpu"])
GPU_ECC_UNCORRECTED = gauge("taugrid_gpu_ecc_uncorrected", "Uncorrectable ECC errors (volatile count)",
                            ["node", "gpu"])
GPU_XIDS = counter("taugrid_gpu_xid_events_total", "XID events reported by the node agent", ["node", "gpu", "xid"])
NODE_CORDONED = gauge("taugrid_node_cordoned", "1 while the health monitor keeps the node cordoned", ["node"])
NODE_UNHEALTHY = gauge("taugrid_node_unhealthy", "1 while the node's verdict is not healthy", ["node"])


def observe_sample(sample: Any) -> None:
    """Set the GPU gauges from one ``NodeSample`` (and count its XID events)."""
    for g in sample.gpus:
        labels = (sample.node, str(g.index))
        if g.temperature_c is not None:
            GPU_TEMPERATURE.labels(*labels).set(g.temperature_c)
        if g.utilization_pct is not None:
            GPU_UTILIZATION.labels(*labels).set(g.utilization_pct)
        GPU_MEMORY_USED.labels(*labels).set(g.memory_used_mb * 2**20)
        GPU_MEMORY_TOTAL.labels(*labels).set(g.memory_total_mb * 2**20)
        if g.ecc_volatile_uncorrected is not None:
            GPU_ECC_UNCORRECTED.labels(*labels).set(g.ecc_volatile_uncorrected)
        for xid in g.xid_events:
            GPU_XIDS.labels(*labels, str(xid)).inc()


def observe_node(state: Any) -> None:
    """Set a node's cordon and health gauges from its ``NodeState``."""
    NODE_CORDONED.labels(state.node).set(1.0 if state.cordoned else 0.0)
    NODE_UNHEALTHY.labels(state.node).set(0.0 if state.verdict == "healthy" else 1.0)


# ---------------------------------------------------------------- KV and object-store operations (every process)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
KV_SECONDS = histogram(
    "taugrid_kv_seconds", "Time of one KV operation, by bucket, operation (get | create | save | put | delete | "
    "keys | filtered | last | mark) and outcome (ok | absent | exists | conflict | error)", ["bucket", "op", "outcome"],
    buckets=STORE_BUCKETS)
OBJECT_SECONDS = histogram(
    "taugrid_object_seconds", "Time of one object-store operation, by store, operation (download | exists | read | "
    "write) and outcome (ok | absent | error)", ["store", "op", "outcome"], buckets=STORE_BUCKETS)


_CHILDREN: dict[tuple[Any, ...], Any] = {}
# Where a metric's event type label sits among its labels: ``child`` folds it with ``type_label``.
_EVENT_TYPE_AT = {HANDLED: 1}


def child(metric: Metric, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label set (``labels`` takes a lock and builds a tuple on
    every call, and every message a service handles observes one or more). An event type label outside the
    catalogue becomes ``unknown`` before the lookup, so neither the series nor this cache grow with made-up
    types."""
    if not _recording:
        return IGNORED
    at = _EVENT_TYPE_AT.get(metric)
    if at is not None and labels[at] not in KNOWN_TYPES:
        labels = (*labels[:at], type_label(labels[at]), *labels[at + 1:])
    key = (metric, *labels)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*labels)
    return found


class Timing:
    """The outcome of the operation being timed; ``ok`` unless the code says otherwise or it raises. A context
    manager (a class rather than a generator: it wraps every KV operation)."""

    __slots__ = ("histogram", "labels", "outcome", "start")

    def __init__(self, histogram: Metric, labels: tuple[str, ...]) -> None:
        self.histogram, self.labels, self.outcome = histogram, labels, "ok"
        self.start = 0.0

    def __enter__(self) -> Timing:
        self.start = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if not _recording:
            return
        if kind is not None and self.outcome == "ok":
            self.outcome = "error"
        child(self.histogram, *self.labels, self.outcome).observe(time.perf_counter() - self.start)


def timed(histogram: Metric, *labels: str) -> Timing:
    """Observe the block's duration in ``histogram`` with ``labels`` and the outcome the block set (``error``
    when it raised without setting one)."""
    return Timing(histogram, labels)
