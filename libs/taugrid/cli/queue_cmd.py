"""``tau queue``: each ClusterQueue's nominal, used, borrowed and lent quota, and its pending runs."""

from __future__ import annotations

import time

import click
import msgspec
import nats

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
        kv = await client.bus.kv("local_cluster")
        try:
            entry = await kv.get("queues")
        except nats.js.errors.KeyNotFoundError:
            entry = None
    if entry is None or not entry.value:
        fail("no queue snapshot yet: is the local cluster running (`tau up`)?", EXIT_NOT_FOUND)
        return
    snap = msgspec.json.decode(entry.value)
    if output == "json":
        emit_json(snap)
        return
    rows = [
        [
            q["cluster_queue"],
            q["cohort"] or "-",
            _fmt(q["nominal"]),
            _fmt(q["used"]),
            _fmt(q["borrowed"]),
            _fmt(q["lent"]),
            str(q["admitted"]),
            str(len(q["pending"])),
        ]
        for q in snap["queues"]
    ]
    click.echo(
        table(rows, ["clusterqueue", "cohort", "nominal", "used", "borrowed", "lent", "admitted", "pending"])
    )
    for q in snap["queues"]:
        for p in q["pending"][:show_pending]:
            click.echo(f"  {q['cluster_queue']} #{p['position'] + 1}: {p['run_id']}")
    click.echo(f"(snapshot {time.time() - snap['time']:.1f}s old from node {snap['node']})")
