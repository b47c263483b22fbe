"""What the portal shows, read from the bus and confined to one signed-in person (``client.access.Viewer``).

The portal's own bus identity may read every workspace, so every function here takes the viewer and filters on
the server side, with the rule ``tau list`` and the bus permissions use: a researcher sees the runs, logs,
evidence and usage of their workspaces only; other workspaces' runs waiting in a queue are counted, not named.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import msgspec

from taugrid import runrecord
from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.bus.replay import batches
from taugrid.client.access import Viewer
from taugrid.core import paging
from taugrid.core.errors import NotFound
from taugrid.core.ids import token
from taugrid.core.states import RunRecord

RUN_FILTERS = ("state", "workspace", "user", "q")  # the query parameters /api/runs honours, besides paging
PAGE_PARAMS = ("limit", "cursor")


def _workspaces(viewer: Viewer) -> list[str] | None:
    return None if viewer.workspaces is None else list(viewer.workspaces)


def run_summary(record: RunRecord) -> dict[str, Any]:
    """One row of the runs table."""
    return {"run_id": record.run_id, "name": record.name, "workspace": record.workspace, "user": record.user,
            "state": record.state, "attempt": record.attempt, "queue": record.cluster_queue or record.queue,
            "position": record.position, "node": record.node, "created": record.created,
            "updated": record.updated, "finished": record.finished, "reason": record.reason}


async def runs(bus: Bus, viewer: Viewer, query: dict[str, str]) -> dict[str, Any]:
    """A page of the viewer's runs, newest first, narrowed by the filters (exact state/workspace/user; ``q`` in
    the id): ``{"runs": [...], "next": <cursor of the next page, or null>, "limit": n}``. ``limit`` defaults to
    ``DEFAULT_LIMIT`` and may be at most ``MAX_LIMIT``; ``cursor`` is a previous page's ``next``."""
    unknown = sorted(set(query) - set(RUN_FILTERS) - set(PAGE_PARAMS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; filters are {', '.join(RUN_FILTERS)} and paging "
                         f"{', '.join(PAGE_PARAMS)}")
    limit = paging.parse_limit(query.get("limit") or paging.DEFAULT_LIMIT)
    cursor = query.get("cursor", "")
    if cursor:
        paging.decode_cursor(cursor)  # refuse a bad cursor before reading anything
    records = await runrecord.list_records(bus, workspaces=_workspaces(viewer))
    wanted = [r for r in records
              if not any(query.get(f) and getattr(r, f) != query[f] for f in ("state", "workspace", "user"))
              and not (query.get("q") and query["q"] not in r.run_id)]
    shown, nxt = paging.page(wanted, limit=limit, after=cursor)
    return {"runs": [run_summary(r) for r in shown], "next": nxt or None, "limit": limit}


async def run(bus: Bus, viewer: Viewer, run_id: str) -> RunRecord:
    """The run's record if the viewer may read it; ``NotFound`` otherwise (its existence is not disclosed)."""
    record = await runrecord.find(bus, run_id, workspaces=_workspaces(viewer))
    if record is None or not viewer.may_read(record.workspace):
        where = " in your workspaces" if viewer.workspaces is not None else ""
        raise NotFound(f"run {run_id} not found{where}")
    return record


def run_detail(record: RunRecord) -> dict[str, Any]:
    detail: dict[str, Any] = msgspec.to_builtins(record)
    detail.pop("resolved", None)  # the resolved spec is long; the evidence tab has it
    if record.evidence_digest:  # a sealed record keeps no history (issue 27): the bundle's events are the run's
        detail["history_in"] = "evidence"
    return detail


async def evidence(bus: Bus, record: RunRecord) -> dict[str, Any]:
    """The sealed bundle's summary and a fresh ``tau verify`` of it (``sealed: false`` before the seal)."""
    from taugrid.evidence.bundle import config_sha256
    from taugrid.evidence.store import BundleModified, read_bundle
    from taugrid.evidence.verify import as_dict, verify_run

    try:
        got = await read_bundle(bus, record.run_id, workspace=record.workspace)
    except BundleModified:  # an archived bundle that does not hash to its seal: nothing of it is shown,
        got = (b"", {})  # the verification below says why
    if got is None:
        return {"sealed": False}
    _, doc = got
    report = as_dict(await verify_run(bus, record.run_id, workspace=record.workspace))
    source = doc.get("source") or {}
    summary = {"terminal_state": (doc.get("terminal") or {}).get("state"), "config_sha256": config_sha256(doc),
               "source_digest": source.get("digest") if isinstance(source, dict) else None,
               "platform_revision": (doc.get("platform") or {}).get("revision"),
               "identity": {k: (doc.get("identity") or {}).get(k) for k in ("user", "signer")},
               "attempts": len(doc.get("attempts") or []), "events": len(doc.get("events") or []),
               "accounting": doc.get("accounting")}
    return {"sealed": True, "bundle": summary, "verify": report, "outputs": outputs(doc.get("outputs") or {})}


def outputs(section: dict[str, Any]) -> dict[str, Any]:
    """The sealed output and checkpoint directories and their files (as ``tau outputs`` lists them: the output
    directory without the checkpoints nested in it), each file's path, size and sha256."""
    out: dict[str, Any] = {}
    ckpt_path = str((section.get("checkpoint_dir") or {}).get("path") or "")
    for key in ("output_dir", "checkpoint_dir"):
        d = section.get(key) or {}
        path = str(d.get("path") or "")
        nested = ckpt_path[len(path):].strip("/") + "/" if key == "output_dir" and path and \
            ckpt_path.startswith(path + "/") else ""
        files = [{k: f.get(k) for k in ("path", "size", "sha256", "error") if f.get(k) is not None}
                 for f in d.get("files") or [] if not (nested and str(f.get("path", "")).startswith(nested))]
        out[key] = {"path": path, "present": bool(d.get("present")), "truncated": bool(d.get("truncated")),
                    "files": files}
    return out


async def queues(bus: Bus, viewer: Viewer) -> dict[str, Any]:
    """The ``tau queue`` snapshot (on a hub with clusters, each cluster's share of each ClusterQueue, as the sites
    report them: ``client.clusters.queue_snapshot``); a pending run of a workspace the viewer may not read keeps
    its position but not its name."""
    from taugrid.bus.platformread import PlatformReader
    from taugrid.bus.sitecapacity import provisioned
    from taugrid.client.clusters import queue_snapshot, quota_view

    # the platform is read (and checked) only on a hub: this page asks every 3 s
    got = await PlatformReader(bus).get() if await provisioned(bus) else None
    view = await quota_view(bus, got[0]) if got is not None else None
    snap: dict[str, Any]
    if got is not None and view is not None:
        snap = queue_snapshot(got[0], view[0])
    else:
        entry = await kv.get(bus, "local_cluster", "queues")
        if entry is None or not entry.value:
            return {"queues": [], "time": None}
        snap = msgspec.json.decode(entry.value)
    if viewer.workspaces is not None:
        mine = {r.run_id for r in await runrecord.list_records(bus, workspaces=_workspaces(viewer))}
        for q in snap.get("queues", []):
            for p in q.get("pending", []):
                if p.get("run_id") not in mine:
                    p["run_id"], p["workload"] = "", ""  # another workspace's run: counted, not named
    return snap


async def nodes(bus: Bus, viewer: Viewer) -> list[dict[str, Any]]:
    """``tau nodes``: each node's GPUs, verdict, failing conditions and cordon, with the viewer's runs on it."""
    from taugrid.bus import platformstore
    from taugrid.client.summaries import node_rows, pool_domains
    from taugrid.health.wire import NodeState

    states = await kv.values(bus, "node_state", NodeState, prefix="node.")
    records = await runrecord.list_records(bus, workspaces=_workspaces(viewer))
    platform = await platformstore.get_text(bus)
    rows = node_rows(states, records, time.time(), pool_domains(platform[0]) if platform else None)
    for row in rows:
        row["gpu_samples"] = await gpu_samples(bus, row["node"])
    return rows


async def gpu_samples(bus: Bus, node: str) -> list[dict[str, Any]]:
    """Per GPU of the node agent's newest sample (NODES), the figures the portal's GPU table shows, with the
    sample's time (``sampled_at``): a node's agent publishes a sample when what the health rules judge changed,
    else a heartbeat a minute (``health.change``), so utilisation and a temperature inside its band may be that old."""
    from taugrid.bus.streams import last
    from taugrid.core.contracts import NodeSample

    ev = await last(bus, "NODES", f"node.{token(node)}.sample")
    if ev is None:
        return []
    sample = ev.payload(NodeSample)
    return [{"index": g.index, "name": g.name, "temperature_c": g.temperature_c, "utilization_pct": g.utilization_pct,
             "memory_used_mb": g.memory_used_mb, "memory_total_mb": g.memory_total_mb,
             "ecc_uncorrected": g.ecc_volatile_uncorrected, "xid_events": g.xid_events, "sampled_at": sample.time}
            for g in sample.gpus]


async def usage(bus: Bus, viewer: Viewer, *, by: str, since: dt.datetime | None) -> list[dict[str, Any]]:
    """``tau usage --by BY --since …`` over the viewer's workspaces."""
    from taugrid.bus import platformstore
    from taugrid.config.platform import load_platform
    from taugrid.core.usage import Seen, fold, roll_up, seen_of

    got = await platformstore.get_text(bus)
    prices = {p.name: p.gpu_hour_price for p in load_platform(got[0]).compute_profiles} if got else {}
    seen: list[Seen] = []
    spaces: list[str | None] = list(viewer.workspaces) if viewer.workspaces is not None else [None]
    for ws in spaces:
        subject = f"run.{token(ws)}.>" if ws else "run.>"
        async for batch in batches(bus, subject, since=since):
            for ev in batch:
                if (seen_ev := seen_of(ev)) is not None:
                    seen.append(seen_ev)
    submitted = {s.run_id for s in seen if s.type == "submit.requested"}
    return roll_up(fold([s for s in seen if s.run_id in submitted], prices=prices, now=time.time()), by)
