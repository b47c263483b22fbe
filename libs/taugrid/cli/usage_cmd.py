"""``tau usage``: queue wait, run time, GPU-seconds and estimated cost, rolled up per user, workspace, queue, run,
GPU vendor or GPU model from the event history (the runs you may read), priced by each compute profile's
``gpu_hour_price``. A run's GPU model is its compute profile's ``gpu_model``, else that of the node it ran on: a
local pool node's ``gpu_model`` from the platform, else what the node's agent read (the health monitor's
``node_state``)."""

from __future__ import annotations

import datetime as dt
import time

import click

from taugrid.cli.common import connected, emit_json, output_option, run_async
from taugrid.cli.views import table


def _since(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    units = {"m": 60, "h": 3600, "d": 86400}
    if value[-1] in units and value[:-1].isdigit():
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(value[:-1]) * units[value[-1]])
    raise click.BadParameter("use a duration like 30m, 12h or 7d", param_hint="--since")


@click.command(help="GPU-seconds, queue wait, run time and estimated cost per user, workspace, queue, run, GPU "
                    "vendor or GPU model, from the event history (runs submitted in --since), priced by compute "
                    "profiles' gpu_hour_price.")
@click.option("--by", type=click.Choice(["user", "workspace", "queue", "run", "vendor", "model"]), default="user",
              show_default=True, help="What to total by.")
@click.option("--since", "since_text", default=None, help="Only runs submitted in the last 30m, 12h, 7d, ….")
@output_option
@run_async
async def usage(by: str, since_text: str | None, output: str) -> None:
    from taugrid.bus import kv
    from taugrid.config.platform import load_platform
    from taugrid.core.usage import Seen, fold, roll_up, seen_of
    from taugrid.health.wire import NodeState

    since = _since(since_text)
    async with connected() as client:
        got = await client.platform_get()
        platform = load_platform(got[0]) if got else None
        prices = {p.name: p.gpu_hour_price for p in platform.compute_profiles} if platform else {}
        models = {p.name: p.gpu_model for p in platform.compute_profiles if p.gpu_model} if platform else {}
        node_models: dict[str, str] = {}
        if by == "model":  # what the agents read, then what the pool declares (a declared node's name wins)
            node_models = {s.node: s.gpu_model for s in await kv.values(client.bus, "node_state", NodeState,
                                                                       prefix="node.") if s.gpu_model}
            if platform:
                node_models |= {n.name: n.gpu_model for n in platform.local.nodes if n.gpu_model}
        seen: list[Seen] = []
        readable = await client.readable_workspaces()
        workspaces: list[str | None] = list(readable) if readable else [None]  # None: every workspace
        for workspace in workspaces:
            async for batch in client.event_batches(since=since, workspace=workspace):
                for ev in batch:
                    if (seen_ev := seen_of(ev)) is not None:
                        seen.append(seen_ev)
    # A run counts from its submission: drop runs whose submission lies before --since.
    submitted = {s.run_id for s in seen if s.type == "submit.requested"}
    rows = roll_up(fold([s for s in seen if s.run_id in submitted], prices=prices, now=time.time(), models=models,
                        node_models=node_models), by)
    if output == "json":
        emit_json(rows)
        return
    if not rows:
        click.echo("no runs" + (f" submitted in the last {since_text}" if since_text else ""))
        return
    click.echo(table([[str(r[by]), str(r["runs"]), f"{float(r['gpu_seconds']) / 3600:.2f}",
                       f"{float(r['queued_s']):.0f}s", f"{float(r['running_s']):.0f}s", f"{float(r['cost']):.2f}"]
                      for r in rows], [by, "runs", "gpu-hours", "queued", "running", "est. cost"]))
