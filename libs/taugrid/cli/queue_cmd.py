"""``tau queue``: each ClusterQueue's nominal, used, borrowed and lent quota, and its pending runs.

It reads one KV key on both backends (``local_cluster``/``queues``): the local cluster writes it, and on
Kubernetes kube-bridge writes it from Kueue's ClusterQueue/LocalQueue status and the pending-workloads
visibility API (``taugrid.kube.queues``), so the CLI never needs Kubernetes credentials.

On a hub whose platform names clusters and whose sites were provisioned (docs §13d) the hub runs no cluster of
its own: ``tau queue`` shows the control plane's quota view instead, each ClusterQueue summed over the clusters
serving it with each cluster's share (``client.clusters.quota_view``, from the records the sites report into
``site_capacity``)."""

from __future__ import annotations

import time
from typing import Any

import click
import msgspec

from taugrid.bus import kv
from taugrid.bus.platformread import PlatformReader
from taugrid.cli.common import EXIT_NOT_FOUND, connected, emit_json, fail, output_option, run_async
from taugrid.cli.views import table
from taugrid.client.clusters import quota_view
from taugrid.core.sitecapacity import QueueTotal


def _fmt(values: dict[str, float]) -> str:
    parts = []
    for r, v in sorted(values.items()):
        shown = f"{v / 2**30:.1f}Gi" if r == "memory" else f"{v:g}"
        parts.append(f"{r.replace('nvidia.com/', '')}={shown}")
    return " ".join(parts) or "-"


@click.command(
    help="Show ClusterQueues: nominal, used, borrowed and lent quota, and pending runs with positions."
)
@click.option(
    "--pending", "show_pending", default=5, show_default=True, help="Pending runs to list per queue."
)
@output_option
@run_async
async def queue(show_pending: int, output: str) -> None:
    async with connected() as client:
        got = await PlatformReader(client.bus).get()
        view = await quota_view(client.bus, got[0]) if got is not None else None
        if got is not None and view is not None:
            reported, totals = view
            names = [c.name for c in got[0].clusters]
            if output == "json":
                emit_json({"clusters": {n: msgspec.to_builtins(reported[n]) for n in names if n in reported},
                           "queues": [msgspec.to_builtins(t) for t in totals]})
                return
            click.echo(clusters_queue_view(totals, show_pending=show_pending,
                                           silent=[n for n in names if n not in reported]))
            return
        entry = await kv.get(client.bus, "local_cluster", "queues")
    if entry is None or not entry.value:
        fail("no queue snapshot yet: is the local cluster running (`tau up`), or on Kubernetes kube-bridge "
             "(it writes one once it sees a ClusterQueue)?", EXIT_NOT_FOUND)
        return
    snap = msgspec.json.decode(entry.value)
    if output == "json":
        emit_json(snap)
        return
    click.echo(queue_view(snap, show_pending=show_pending, now=time.time()))


def queue_view(snap: dict[str, Any], *, show_pending: int, now: float) -> str:
    """The human ``tau queue``: one row per ClusterQueue, its first pending runs, LocalQueues, the age."""
    rows = [
        [
            q["cluster_queue"],
            q["cohort"] or "-",
            _fmt(q["nominal"]),
            _fmt(q["used"]),
            _fmt(q["borrowed"]),
            _fmt(q["lent"]),
            str(q["admitted"]),
            str(q.get("pending_count", len(q["pending"]))),
        ]
        for q in snap["queues"]
    ]
    lines = [table(rows, ["clusterqueue", "cohort", "nominal", "used", "borrowed", "lent", "admitted", "pending"])]
    for q in snap["queues"]:
        if q.get("fair_share"):  # a KAI project (platform.yaml departments): what it may hold right now
            lines.append(f"  {q['cluster_queue']}: fair share {_fmt(q['fair_share'])}")
    for q in snap["queues"]:
        for p in q["pending"][:show_pending]:
            lines.append(f"  {q['cluster_queue']} #{p['position'] + 1}: {p['run_id']}")
    for lq in snap.get("local_queues") or []:
        lines.append(f"  localqueue {lq['namespace']}/{lq['name']} → {lq['cluster_queue']}: "
                     f"{lq['pending']} pending, {lq['admitted']} admitted")
    if snap.get("backend") == "kubernetes":
        if not snap.get("visibility"):
            lines.append("(pending runs are listed only where Kueue's visibility API is served; counts shown)")
        lines.append(f"(snapshot {now - snap['time']:.1f}s old from cluster {snap['cluster']})")
    else:
        lines.append(f"(snapshot {now - snap['time']:.1f}s old from node {snap['node']})")
    return "\n".join(lines)


def clusters_queue_view(totals: list[QueueTotal], *, show_pending: int, silent: list[str]) -> str:
    """The hub's ``tau queue``: each ClusterQueue's total over its clusters (``all``), then each cluster's share,
    its first waiting runs, and the clusters that have not reported."""
    rows = []
    for t in totals:
        rows.append([t.cluster_queue, "all", _fmt(t.nominal), _fmt(t.used), str(t.admitted), str(t.pending)])
        rows += [[t.cluster_queue, s.cluster, _fmt(s.nominal), _fmt(s.used), str(s.admitted), str(s.pending)]
                 for s in t.shares]
    lines = [table(rows, ["clusterqueue", "cluster", "nominal", "used", "admitted", "pending"])] if rows else [
        "no cluster has reported its queues yet"]
    for t in totals:
        for s in t.shares:
            for i, run in enumerate(s.first_pending[:show_pending]):
                lines.append(f"  {t.cluster_queue} at {s.cluster} #{i + 1}: {run}")
    if silent:
        lines.append(f"(no report yet from {', '.join(silent)})")
    lines.append("(summed over the clusters serving each queue, as each last reported: `tau clusters` shows "
                 "each link's health)")
    return "\n".join(lines)
