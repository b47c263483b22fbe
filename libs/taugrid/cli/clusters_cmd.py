"""``tau clusters``: the clusters the platform dispatches runs to (docs §13d), each with its link's health, the
reports its link has not delivered yet (lag), its lease on the hub, the runs it holds now, and its capacity and
usage as the site last reported them (``--output json``: the whole record, ``capacity`` and ``usage``)."""

from __future__ import annotations

import click
import msgspec

from taugrid.bus.platformread import PlatformReader
from taugrid.cli.common import EXIT_NOT_FOUND, connected, emit_json, fail, output_option, run_async
from taugrid.cli.views import table
from taugrid.client.clusters import ClusterRow, capacity_text, cluster_rows, usage_text


@click.command(help="Show the clusters runs are dispatched to: health of each link, lease (lost: its runs "
                    "were requeued elsewhere), lag, runs held, capacity (nodes, GPUs, CPUs) and usage (quota "
                    "used of nominal, admitted and pending, as the site last reported), preference and the "
                    "ClusterQueues each serves.")
@output_option
@run_async
async def clusters(output: str) -> None:
    async with connected() as client:
        got = await PlatformReader(client.bus).get()
        if got is None:
            fail("no platform applied yet: `tau platform apply platform.yaml`", EXIT_NOT_FOUND)
            return
        rows = await cluster_rows(client.bus, got[0], await client.list())
    if output == "json":
        emit_json({"clusters": [msgspec.to_builtins(r) for r in rows]})
        return
    click.echo(clusters_view(rows))


def clusters_view(rows: list[ClusterRow]) -> str:
    if not rows:
        return "no clusters declared: runs go to this stack's own backend (platform.yaml clusters, docs §13d)"
    return table([[r.name, r.backend, str(r.preference), r.health, r.lease, "-" if r.lag is None else str(r.lag),
                   str(r.runs), capacity_text(r.capacity), usage_text(r.usage),
                   ", ".join(r.cluster_queues) if r.cluster_queues is not None else "all"] for r in rows],
                 ["cluster", "backend", "preference", "health", "lease", "lag", "runs", "capacity", "usage",
                  "queues"])
