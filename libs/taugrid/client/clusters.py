"""What `tau clusters` shows: each cluster the platform names, the health of its link to the control plane, the
reports its link has not yet delivered (lag), the runs it holds now, and what the site says it has and uses
(capacity and usage: its ``site_capacity`` record, ``core/sitecapacity.py``).

Health comes from the hub's stream of the cluster's reports (``bus.sites.link``): ``ok`` when the hub heard from
the site's stream within ``SILENT_AFTER_S``, ``silent`` after that, ``never reached`` when it has not since the
hub started, ``no link`` when the hub has no stream for it (the site was never provisioned). The lease is the
site's in the hub's ``site_leases`` (``gen N`` while held, ``lost (gen N)`` once the hub declared the cluster lost
and requeued its runs, until the site fences and rejoins; ``-`` before its first renewal). Usage counts the runs
whose record says they went there (``dispatch.chosen``) and that are admitted or running, of the records the
caller passes (``Client.list``: a person's own workspaces, as ``tau nodes`` counts them). Capacity is the site's
pool (nodes, GPUs, CPUs); usage sums the quota of the ClusterQueues the cluster serves (used of nominal,
reservations included, admitted and pending workloads), as the site last reported it: while a link is down the
figures are the last the hub took (the health column says how long ago it heard from the site).

``quota_view`` is the control plane's quota view: each ClusterQueue summed over the clusters serving it, with each
cluster's share (``core.sitecapacity.summed``), what ``tau queue`` shows on a hub with clusters.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec

from taugrid.bus.connection import Bus
from taugrid.bus.sitecapacity import provisioned, reports
from taugrid.bus.sites import Link, SiteLease, leases, link
from taugrid.config.clusters import in_preference_order, serves
from taugrid.config.platform import Platform
from taugrid.core.sitecapacity import QueueTotal, SiteCapacity, Usage, summed, usage
from taugrid.core.states import RunRecord

SILENT_AFTER_S = 30.0
_HOLDING = frozenset({"admitted", "running"})


class ClusterRow(msgspec.Struct, frozen=True):
    name: str
    backend: str
    preference: int
    cluster_queues: list[str] | None  # None: every ClusterQueue
    health: str
    lag: int | None  # reports the hub has not pulled yet; None without a link
    silent_s: float | None
    runs: int  # runs admitted or running there now
    lease: str = "-"
    capacity: SiteCapacity | None = None  # the site's last report; None before its first
    usage: Usage | None = None  # its served ClusterQueues' quota, summed, from that report


def health(found: Link | None) -> str:
    if found is None:
        return "no link"
    if found.silent_s is None:
        return "never reached"
    if found.silent_s > SILENT_AFTER_S:
        return f"silent {found.silent_s:.0f}s"
    return "ok"


def lease_view(lease: SiteLease | None) -> str:
    if lease is None:
        return "-"
    return f"lost (gen {lease.generation})" if lease.lost else f"gen {lease.generation}"


async def cluster_rows(bus: Bus, platform: Platform, records: list[RunRecord]) -> list[ClusterRow]:
    holding: dict[str, int] = {}
    for record in records:
        if record.cluster and record.state in _HOLDING:
            holding[record.cluster] = holding.get(record.cluster, 0) + 1
    rows = []
    held = {name: lease for name, (lease, _) in (await leases(bus)).items()} if platform.clusters else {}
    reported = await reports(bus, [c.name for c in platform.clusters]) if platform.clusters else {}
    for c in platform.clusters:
        found = await link(bus, c.name)
        report = reported.get(c.name)
        rows.append(ClusterRow(name=c.name, backend=c.backend, preference=c.preference,
                               cluster_queues=c.cluster_queues, health=health(found),
                               lag=found.lag if found else None, silent_s=found.silent_s if found else None,
                               runs=holding.get(c.name, 0), lease=lease_view(held.get(c.name)), capacity=report,
                               usage=None if report is None else usage(report, partial(serves, c))))
    return rows


def _short(resource: str) -> str:
    return {"nvidia.com/gpu": "gpu", "amd.com/gpu": "amd-gpu", "habana.ai/gaudi": "gaudi"}.get(resource, resource)


def amount_text(resource: str, value: float) -> str:
    return f"{value / 2**30:.3g}Gi" if resource == "memory" else f"{value:g}"


def capacity_text(report: SiteCapacity | None) -> str:
    """``2 nodes, 16 gpu, 64 cpu``; ``cpu shared`` where a node's CPU is time-shared; ``-`` before a report."""
    if report is None:
        return "-"
    parts = [f"{report.nodes} node" + ("" if report.nodes == 1 else "s")]
    parts += [f"{v:g} {_short(r)}" for r, v in sorted(report.gpus.items())]
    parts.append("cpu shared" if report.cpu is None else f"{report.cpu:g} cpu")
    return ", ".join(parts)


def usage_text(used: Usage | None) -> str:
    """``cpu 1/8, memory 0.0625Gi/16Gi; 1 admitted, 1 pending``: used of nominal per resource (the served
    ClusterQueues' quota, summed), then the workloads admitted (reservations included) and waiting."""
    if used is None:
        return "-"
    quota = ", ".join(f"{_short(r)} {amount_text(r, used.used.get(r, 0.0))}/{amount_text(r, n)}"
                      for r, n in sorted(used.nominal.items()))
    return f"{quota or 'no quota'}; {used.admitted} admitted, {used.pending} pending"


async def quota_view(bus: Bus, platform: Platform) -> tuple[dict[str, SiteCapacity], list[QueueTotal]] | None:
    """The clusters' last reports and the control plane's quota view: each ClusterQueue summed over the clusters
    that serve it and reported, its shares in preference order. None where this stack runs no sites although its
    platform names clusters (``sitecapacity.provisioned``): its own backend's queues are the truth there."""
    if not platform.clusters or not await provisioned(bus):
        return None
    ordered = in_preference_order(platform.clusters)
    by_name = {c.name: c for c in ordered}
    reported = await reports(bus, [c.name for c in ordered])
    return reported, summed(reported, [c.name for c in ordered], lambda name, q: serves(by_name[name], q))


def queue_snapshot(platform: Platform, reported: dict[str, SiteCapacity]) -> dict[str, Any]:
    """The hub's view in the shape of a cluster's own queue snapshot (``local_cluster``/``queues``), for readers
    made for that one (the portal's queues page): a row per cluster's share of each ClusterQueue it serves,
    named ``<queue> @ <cluster>``, in preference order, with its first waiting runs; no ``time`` (each record is
    as its site last wrote it)."""
    rows: list[dict[str, object]] = []
    for c in in_preference_order(platform.clusters):
        report = reported.get(c.name)
        for q in report.queues if report is not None else []:
            if not serves(c, q.cluster_queue):
                continue
            rows.append({"cluster_queue": f"{q.cluster_queue} @ {c.name}", "cohort": q.cohort,
                         "nominal": q.nominal, "used": q.used, "borrowed": q.borrowed, "lent": q.lent,
                         "admitted": q.admitted, "pending_count": q.pending,
                         "pending": [{"run_id": run, "workload": "", "position": i}
                                     for i, run in enumerate(q.first_pending)]})
    return {"queues": rows, "time": None, "clusters": sorted(reported)}
