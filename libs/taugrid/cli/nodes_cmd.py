"""``tau nodes``: each node the health monitor knows, its GPUs (count, vendor and model), health verdict and failing
conditions, whether it is cordoned and why, its repair steps (the one asked, how many, the last outcome), and the
runs on it (of the workspaces you may read; a run is on every node one of its pods runs on). It reads two KV
buckets, the health monitor's ``node_state`` and ``run_state``, the same on both backends, and, for a local pool,
each node's topology domain from the platform's ``local.nodes`` labels (``pool_domains``; Kubernetes nodes' labels
are not on the bus, so their domain is left empty). A node without a sample, not even a heartbeat, for two of its
agent's heartbeat intervals shows as silent (``core.heartbeat``): its verdict is only as fresh as that sample."""

from __future__ import annotations

import time

import click

from taugrid.cli.common import connected, emit_json, output_option, run_async
from taugrid.cli.views import table
from taugrid.client.summaries import gpu_kind, node_rows, pool_domains


@click.command(help="Show nodes: GPUs (vendor/model), health verdict, failing conditions, cordon and its reason, and "
                    "the runs on each (from the health monitor's node_state, the same on both backends).")
@output_option
@run_async
async def nodes(output: str) -> None:
    from taugrid.bus import kv, platformstore
    from taugrid.health.wire import NodeState

    async with connected() as client:
        states = await kv.values(client.bus, "node_state", NodeState, prefix="node.")
        records = await client.list()
        platform = await platformstore.get_text(client.bus)
    rows = node_rows(states, records, time.time(), pool_domains(platform[0]) if platform else None)
    if output == "json":
        emit_json(rows)
        return
    if not rows:
        click.echo("no nodes yet: the health monitor lists a node once its agent has sent a sample")
        return
    domains = any(r["domain"] for r in rows)  # a column only where the pool declares topology levels
    click.echo(table([[r["node"], str(r["gpus"]), gpu_kind(r),
                       r["verdict"] + (f" (silent {r['last_sample_age_s']:.0f}s)" if r["silent"] else ""),
                       ("cordoned: " + (r["cordon_reason"] or "?")) if r["cordoned"] else "schedulable",
                       *(["/".join(r["domain"].values()) or "-"] if domains else []),
                       str(len(r["runs"])), "; ".join(f"{k} {v}" for k, v in r["conditions"].items()) or "-"]
                      for r in rows], ["node", "gpus", "vendor/model", "health", "scheduling",
                                       *(["domain"] if domains else []),
                                       "runs", "failing conditions"]))
    for r in rows:
        if r["runs"]:
            click.echo(f"  {r['node']}: {', '.join(r['runs'])}")
        repair = r["repair"]
        if repair["wanted"] or repair["last"]:
            doing = f"{repair['wanted']} asked; " if repair["wanted"] else ""
            click.echo(f"  {r['node']} repair: {doing}{repair['steps']} step(s); last: {repair['last'] or '-'}")
