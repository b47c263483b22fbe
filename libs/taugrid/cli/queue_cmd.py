"""``tau queue``: each ClusterQueue's nominal, used, borrowed and lent quota, and its pending runs.

It reads one KV key on both backends (``local_cluster``/``queues``): the local cluster writes it, and on
Kubernetes kube-bridge writes it from Kueue's ClusterQueue/LocalQueue status and the pending-workloads
visibility API (``taugrid.kube.queues``), so the CLI never needs Kubernetes credentials."""

from __future__ import annotations

import time
from typing import Any

import click
import msgspec

from taugrid.bus import kv
from taugrid.cli.common import EXIT_NOT_FOUND, connected, emit_json, fail, output_option, run_async
from taugrid.cli.views import table


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
