"""``tau top``: a live terminal view of queues, runs and nodes, redrawn as the bus reports changes.

It subscribes to three KV buckets (``bus/kv.watch``: current values, then every change as it is stored):
``run_state`` (the run records of the workspaces you may read), ``local_cluster``/``queues`` (the queue snapshot
``tau queue`` shows, on both backends; on a hub with clusters ``site_capacity``, each site's record, shown as each
cluster's share of each ClusterQueue: ``client.clusters.queue_snapshot``) and ``node_state`` (the health
monitor's verdicts). Nothing is polled:
a frame is drawn when something changed, at most ``FRAME_S`` apart. ``--once`` draws the first complete frame
and exits (``--output json`` for scripts, schema ``taugrid.io/top/v1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import click
import msgspec

from taugrid.bus.platformread import PlatformReader
from taugrid.bus.sitecapacity import provisioned
from taugrid.bus.topology import SITE_CAPACITY_BUCKET
from taugrid.cli.common import connected, emit_json, output_option, run_async
from taugrid.cli.views import table
from taugrid.client.clusters import queue_snapshot
from taugrid.client.summaries import gpu_kind
from taugrid.config.platform import Platform
from taugrid.core.devices import VENDORS
from taugrid.core.sitecapacity import SiteCapacity

VENDOR_RESOURCES = {v.resource: v.name for v in VENDORS.values()}  # nvidia.com/gpu → nvidia, in table order

SCHEMA = "taugrid.io/top/v1"
FRAME_S = 0.5  # the quickest redraw: a burst of changes makes one frame
TERMINAL = ("succeeded", "failed", "rejected", "cancelled")


@dataclass
class TopView:
    """What ``tau top`` shows, folded from KV changes (pure: no I/O)."""

    runs: dict[str, Any] = field(default_factory=dict)  # run_state key → RunRecord
    nodes: dict[str, Any] = field(default_factory=dict)  # node_state key → NodeState
    queues: dict[str, Any] | None = None  # the `tau queue` snapshot
    # on a hub with clusters (None elsewhere): the platform, and each site's last record by cluster
    platform: Platform | None = None
    sites: dict[str, SiteCapacity] = field(default_factory=dict)

    def apply(self, bucket: str, key: str, value: bytes | None) -> None:
        from taugrid.core.states import RunRecord
        from taugrid.health.wire import NodeState

        if bucket == "local_cluster":
            self.queues = msgspec.json.decode(value) if value else None
            return
        if bucket == SITE_CAPACITY_BUCKET and self.platform is not None:
            try:
                self.sites[key] = msgspec.json.decode(value or b"", type=SiteCapacity)
            except msgspec.DecodeError:
                self.sites.pop(key, None)  # deleted, or a record this version cannot read
            self.queues = queue_snapshot(self.platform, self.sites)
            return
        held, kind = (self.runs, RunRecord) if bucket == "run_state" else (self.nodes, NodeState)
        if value is None:
            held.pop(key, None)
            return
        try:
            held[key] = msgspec.json.decode(value, type=kind)
        except msgspec.ValidationError:
            held.pop(key, None)  # a record this version cannot read is left out, not fatal

    def snapshot(self, *, now: float, finished: int) -> dict[str, Any]:
        from taugrid.client.summaries import node_rows

        records = list(self.runs.values())
        live = sorted((r for r in records if r.state not in TERMINAL), key=lambda r: r.created)
        done = sorted((r for r in records if r.state in TERMINAL), key=lambda r: r.finished or r.updated,
                      reverse=True)[:finished]
        counts: dict[str, int] = {}
        for r in records:
            counts[r.state] = counts.get(r.state, 0) + 1
        queues = (self.queues or {}).get("queues", [])
        # a queued run's place in line is the queue snapshot's, as `tau queue` shows it: the record's is
        # refreshed only near the front of the line
        places = {p["run_id"]: p["position"] for q in queues for p in q["pending"] if p.get("run_id")}
        return {
            "schemaVersion": SCHEMA, "time": now, "counts": dict(sorted(counts.items())),
            "queues": [_queue_row(q) for q in queues],
            "runs": [_run_row(r, now, places) for r in live + done],
            "nodes": node_rows(list(self.nodes.values()), records, now),
        }


def _queue_row(q: dict[str, Any]) -> dict[str, Any]:
    return {"cluster_queue": q["cluster_queue"], "cohort": q.get("cohort") or "", "nominal": q["nominal"],
            "used": q["used"], "borrowed": q["borrowed"], "admitted": q["admitted"],
            "pending": q.get("pending_count", len(q["pending"])),
            "next": [p["run_id"] for p in q["pending"][:3]]}


def _run_row(r: Any, now: float, places: dict[str, int]) -> dict[str, Any]:
    end = r.finished if r.finished else now
    position = places.get(r.run_id, r.position) if r.state == "queued" else None
    return {"run_id": r.run_id, "state": r.state, "workspace": r.workspace, "user": r.user,
            "queue": r.cluster_queue or r.queue, "position": position, "node": r.node, "attempt": r.attempt,
            "age_s": round(now - r.created, 1) if r.created else None,
            "duration_s": round(end - r.created, 1) if r.created else None, "reason": r.reason}


def _gpus(used: dict[str, float], nominal: dict[str, float]) -> str:
    """A queue's GPUs used of its quota, per vendor where it has more than one vendor's (``3/8 amd, 8/16
    intel-gaudi``); one vendor's as plain ``3/8``."""
    held = [r for r in VENDOR_RESOURCES if r in nominal or r in used]
    if len(held) <= 1:
        r = held[0] if held else "nvidia.com/gpu"
        return f"{used.get(r, 0):g}/{nominal.get(r, 0):g}"
    return ", ".join(f"{used.get(r, 0):g}/{nominal.get(r, 0):g} {VENDOR_RESOURCES[r]}" for r in held)


def frame(snap: dict[str, Any]) -> str:
    """The human view of one snapshot: queues, runs (live first, then the latest finished), nodes."""
    stamp = time.strftime("%H:%M:%S", time.localtime(snap["time"]))
    counts = ", ".join(f"{n} {s}" for s, n in snap["counts"].items()) or "no runs"
    lines = [f"tau top  {stamp}  runs: {counts}", "", "QUEUES"]
    lines.append(table([[q["cluster_queue"], q["cohort"] or "-", _gpus(q["used"], q["nominal"]),
                         f"{q['used'].get('cpu', 0):g}/{q['nominal'].get('cpu', 0):g}", str(q["admitted"]),
                         str(q["pending"]), ", ".join(q["next"]) or "-"] for q in snap["queues"]],
                       ["clusterqueue", "cohort", "gpu used", "cpu used", "admitted", "pending", "next"])
                 if snap["queues"] else "  (no queue snapshot yet)")
    lines += ["", "RUNS"]
    lines.append(table([[r["run_id"], r["state"] + (f" #{r['position'] + 1}" if r["state"] == "queued" and
                                                      r["position"] is not None else ""),
                         r["workspace"], r["user"], r["queue"] or "-", r["node"] or "-",
                         f"{r['duration_s']:.0f}s" if r["duration_s"] is not None else "-", r["reason"][:40]]
                        for r in snap["runs"]],
                       ["run", "state", "workspace", "user", "queue", "node", "for", "reason"])
                 if snap["runs"] else "  (no runs)")
    lines += ["", "NODES"]
    lines.append(table([[n["node"], str(n["gpus"]), gpu_kind(n), n["verdict"],
                         ("cordoned: " + (n["cordon_reason"] or "?")) if n["cordoned"] else "schedulable",
                         str(len(n["runs"]))] for n in snap["nodes"]],
                       ["node", "gpus", "vendor/model", "health", "scheduling", "runs"])
                 if snap["nodes"] else "  (no node has reported yet)")
    return "\n".join(lines)


async def _feed(bus: Any, bucket: str, key_filter: str, out: asyncio.Queue[tuple[str, str, bytes | None] | None]
                ) -> None:
    from taugrid.bus import kv

    feed: AsyncIterator[tuple[str, bytes | None]] = kv.watch(bus, bucket, key_filter)
    async with contextlib.aclosing(feed):  # type: ignore[type-var]
        async for key, value in feed:
            await out.put(None if (key, value) == kv.CAUGHT_UP else (bucket, key, value))


@click.command(help="A live view of queues, runs and nodes that redraws as the bus reports changes (no polling). "
                    "--once prints one frame and exits; with --output json, for scripts.")
@click.option("--once", is_flag=True, help="Print the current view once and exit.")
@click.option("--finished", default=10, show_default=True, help="How many finished runs to show after the live ones.")
@output_option
@run_async
async def top(once: bool, finished: int, output: str) -> None:
    from taugrid.core.ids import token

    if output == "json" and not once:
        raise click.UsageError("--output json needs --once (a live view is for a terminal)")
    async with connected() as client:
        readable = await client.readable_workspaces()
        got = await PlatformReader(client.bus).get() if await provisioned(client.bus) else None
        hub = got[0] if got is not None and got[0].clusters else None  # the sites' records (read at start)
        watches = [(SITE_CAPACITY_BUCKET, ">") if hub else ("local_cluster", "queues"), ("node_state", "node.>")]
        watches += [("run_state", "run.>")] if readable is None else [("run_state", f"run.{token(ws)}.>")
                                                                      for ws in readable]
        changes: asyncio.Queue[tuple[str, str, bytes | None] | None] = asyncio.Queue()
        tasks = [asyncio.create_task(_feed(client.bus, bucket, flt, changes)) for bucket, flt in watches]
        try:
            await _show(TopView(platform=hub), changes, tasks, expected=len(watches), once=once, finished=finished,
                        output=output)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _show(view: TopView, changes: asyncio.Queue[tuple[str, str, bytes | None] | None],
                tasks: list[asyncio.Task[None]], *, expected: int, once: bool, finished: int, output: str) -> None:
    """Fold changes into ``view``; draw once every watch has caught up, then (live) whenever something changed."""
    caught_up, dirty, drawn = 0, True, 0.0
    tty = sys.stdout.isatty()
    while True:
        for task in tasks:  # a watch that failed (the bus went away) ends the view with its error
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        try:
            item = await asyncio.wait_for(changes.get(), timeout=FRAME_S)
        except TimeoutError:
            item = ("", "", None)  # a tick: a view changed during the last frame may be drawn now
        if item is None:
            caught_up += 1
        elif item[0]:
            view.apply(*item)
            dirty = True
        if caught_up < expected or not dirty or time.monotonic() - drawn < FRAME_S:
            continue
        snap = view.snapshot(now=time.time(), finished=finished)
        if once:
            emit_json(snap) if output == "json" else click.echo(frame(snap))
            return
        if tty:
            click.clear()
        click.echo(frame(snap) + ("" if tty else "\n"))
        dirty, drawn = False, time.monotonic()
