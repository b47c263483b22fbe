"""``tau nodes``: each node the health monitor knows, its GPUs, health verdict and failing conditions, whether it
is cordoned and why, its repair steps (the one asked, how many, the last outcome), and the runs on it (of the
workspaces you may read; a run is on every node one of its pods runs on). It reads two KV buckets, the health
monitor's ``node_state`` and ``run_state``, the same on both backends, and, for a local pool, each node's
topology domain from the platform's ``local.nodes`` labels (``pool_domains``; Kubernetes nodes' labels are not
on the bus, so their domain is left empty)."""

from __future__ import annotations

import time
from typing import Any

import click

from taugrid.cli.common import connected, emit_json, output_option, run_async
from taugrid.cli.views import table


def pool_domains(platform_text: str) -> dict[str, dict[str, str]]:
    """Per declared local node, its value at each level of the platform's topologies above the hostname, highest
    first (the node's name is its hostname domain); {} when the platform declares none or does not load."""
    from taugrid.config.platform import load_platform
    from taugrid.config.platformtopology import HOSTNAME_LABEL, node_labels
    from taugrid.core.errors import TauError

    try:
        platform = load_platform(platform_text)
    except (TauError, ValueError):
        return {}
    levels = list(dict.fromkeys(k for t in platform.topologies for k in t.levels if k != HOSTNAME_LABEL))
    return {n.name: {k: labels[k] for k in levels if k in labels}
            for n in platform.local.nodes for labels in (node_labels(n),)} if levels else {}


def node_rows(states: list[Any], records: list[Any], now: float,
              domains: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """One plain dict per node (what ``--output json`` prints), sorted by name; runs not yet finished only.
    ``domains``: each node's topology domain (``pool_domains``), label → value."""
    live = ("admitted", "running", "queued")
    domains = domains or {}
    out = []
    for st in sorted(states, key=lambda s: s.node):
        failing = {key: f"{c.reason or c.type}{': ' + c.message if c.message else ''}"
                   for key, c in sorted(st.conditions.items()) if c.status == "True"}
        runs = sorted(r.run_id for r in records if r.state in live and on_node(r, st.node))
        out.append({"node": st.node, "verdict": st.verdict, "gpus": st.expected_gpus, "gpu_source": st.gpu_source,
                    "cordoned": st.cordoned, "cordon_reason": st.cordon_reason,
                    "cordoned_for_s": round(now - st.cordon_time, 1) if st.cordoned and st.cordon_time else None,
                    "drained": st.drained, "conditions": failing, "last_validation": st.last_validation,
                    "repair": {"wanted": st.repair_wanted, "steps": st.repairs, "last": st.last_repair},
                    "last_sample_age_s": round(now - st.last_sample, 1) if st.last_sample else None, "runs": runs,
                    "domain": domains.get(st.node, {})})
    return out


def on_node(record: Any, node: str) -> bool:
    """The run has a pod there (a multi-node run is on each of its pods' nodes), or reported the node itself."""
    return record.node == node or any(p.node == node for p in record.pods)


@click.command(help="Show nodes: GPUs, health verdict, failing conditions, cordon and its reason, and the runs on "
                    "each (from the health monitor's node_state, the same on both backends).")
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
    click.echo(table([[r["node"], str(r["gpus"]), r["verdict"],
                       ("cordoned: " + (r["cordon_reason"] or "?")) if r["cordoned"] else "schedulable",
                       *(["/".join(r["domain"].values()) or "-"] if domains else []),
                       str(len(r["runs"])), "; ".join(f"{k} {v}" for k, v in r["conditions"].items()) or "-"]
                      for r in rows], ["node", "gpus", "health", "scheduling", *(["domain"] if domains else []),
                                       "runs", "failing conditions"]))
    for r in rows:
        if r["runs"]:
            click.echo(f"  {r['node']}: {', '.join(r['runs'])}")
        repair = r["repair"]
        if repair["wanted"] or repair["last"]:
            doing = f"{repair['wanted']} asked; " if repair["wanted"] else ""
            click.echo(f"  {r['node']} repair: {doing}{repair['steps']} step(s); last: {repair['last'] or '-'}")
