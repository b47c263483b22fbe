"""What each cluster of a many-cluster platform holds, and the control plane's quota view: their sum.

A site's local cluster reports one ``SiteCapacity`` record about itself (its pool's nodes, GPUs and CPUs, by
ResourceFlavor, and each of its ClusterQueues' nominal quota and use: admitted, used, borrowed, lent, pending);
the hub keeps the latest record of each cluster, keyed by the cluster's name (``bus/sitecapacity.py``). The
control plane's view of a ClusterQueue is the sum of the shares of the clusters that serve it (``summed``), each
share keeping its cluster's name, as MultiKueue's manager sees its workers' quota.

Pure: no I/O, no clock. Invariants: a share of a ClusterQueue a cluster does not serve (``platform.yaml``
``clusters[].cluster_queues``) never counts towards the sum, whatever the site says it has (a site admits by the
whole platform, so its record lists every ClusterQueue, but only the served ones can receive runs there); the
figures are the site's word (it owns its server): the hub vouches only for which cluster said them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

# The run ids of a ClusterQueue's first waiting runs a record carries (``tau queue --pending`` shows 5 by default):
# more would make the record, written on change, grow with the queue.
FIRST_PENDING = 5


class FlavorCapacity(msgspec.Struct, frozen=True, omit_defaults=True):
    """The pool nodes a ResourceFlavor selects (its ``node_labels`` all match) and what they hold."""

    flavor: str
    nodes: int = 0
    gpus: float = 0.0
    cpu: float | None = None  # None: a node's CPU is time-shared (quota is its only bound)


class QueueShare(msgspec.Struct, frozen=True, omit_defaults=True):
    """One ClusterQueue at one cluster: its quota there (resource → amount: cores, bytes, devices) and its use."""

    cluster_queue: str
    cohort: str = ""
    nominal: dict[str, float] = msgspec.field(default_factory=dict)
    used: dict[str, float] = msgspec.field(default_factory=dict)  # admitted workloads' requests (reserved included)
    borrowed: dict[str, float] = msgspec.field(default_factory=dict)
    lent: dict[str, float] = msgspec.field(default_factory=dict)
    admitted: int = 0
    pending: int = 0
    first_pending: list[str] = msgspec.field(default_factory=list)  # run ids, first FIRST_PENDING, in order


class SiteCapacity(msgspec.Struct, frozen=True, omit_defaults=True):
    """One cluster's report: its pool and its ClusterQueues. Written only when it changes (no clock in it)."""

    nodes: int = 0
    gpus: dict[str, float] = msgspec.field(default_factory=dict)  # by resource: nvidia.com/gpu, amd.com/gpu, …
    cpu: float | None = None  # the pool's cores; None: time-shared somewhere (quota alone bounds it)
    memory: float = 0.0  # bytes
    flavors: list[FlavorCapacity] = msgspec.field(default_factory=list)
    queues: list[QueueShare] = msgspec.field(default_factory=list)


class ClusterShare(msgspec.Struct, frozen=True):
    """A cluster's part of a ClusterQueue in the control plane's view."""

    cluster: str
    nominal: dict[str, float]
    used: dict[str, float]
    admitted: int
    pending: int
    first_pending: list[str]


class QueueTotal(msgspec.Struct, frozen=True):
    """A ClusterQueue across clusters: the sum of its shares, and the shares themselves."""

    cluster_queue: str
    nominal: dict[str, float]
    used: dict[str, float]
    admitted: int
    pending: int
    shares: list[ClusterShare]


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for resource, amount in more.items():
        into[resource] = into.get(resource, 0.0) + amount


def summed(reports: Mapping[str, SiteCapacity], order: list[str],
           serves: Callable[[str, str], bool]) -> list[QueueTotal]:
    """Each ClusterQueue's total over the clusters in ``order`` (the platform's, in preference order) that
    reported and that serve it (``serves(cluster, cluster_queue)``); the queues in the order first met."""
    totals: dict[str, QueueTotal] = {}
    for cluster in order:
        report = reports.get(cluster)
        if report is None:
            continue
        for q in report.queues:
            if not serves(cluster, q.cluster_queue):
                continue
            total = totals.setdefault(q.cluster_queue, QueueTotal(q.cluster_queue, {}, {}, 0, 0, []))
            _add(total.nominal, q.nominal)
            _add(total.used, q.used)
            total.shares.append(ClusterShare(cluster, dict(q.nominal), dict(q.used), q.admitted, q.pending,
                                             list(q.first_pending)))
    return [msgspec.structs.replace(t, admitted=sum(s.admitted for s in t.shares),
                                    pending=sum(s.pending for s in t.shares)) for t in totals.values()]


class Usage(msgspec.Struct, frozen=True):
    """A cluster's use of the quota of the ClusterQueues it serves, all together."""

    nominal: dict[str, float]
    used: dict[str, float]
    admitted: int
    pending: int


def usage(report: SiteCapacity, serves: Callable[[str], bool]) -> Usage:
    """The sum over the report's ClusterQueues that ``serves`` accepts."""
    nominal: dict[str, float] = {}
    used: dict[str, float] = {}
    admitted = pending = 0
    for q in report.queues:
        if serves(q.cluster_queue):
            _add(nominal, q.nominal)
            _add(used, q.used)
            admitted += q.admitted
            pending += q.pending
    return Usage(nominal, used, admitted, pending)
