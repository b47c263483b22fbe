"""Kueue ClusterQueue/LocalQueue status (and pending-workloads visibility answers) → the ``tau queue`` snapshot.

Pure: no I/O, no clock (``now`` is passed in). kube-bridge writes the result into the ``local_cluster`` KV
bucket under ``queues``, exactly where and in the shape the local cluster writes its own snapshot, so
``tau queue`` reads one place on both backends and never needs Kubernetes credentials:

    {"time", "node", "backend", "cluster", "visibility",
     "queues": [{"cluster_queue", "cohort", "nominal", "used", "borrowed", "lent", "admitted",
                 "pending": [{"run_id", "workload", "position", "local_queue", "priority"}],
                 "pending_count", "reserving", "reserved", "active", "message"}],
     "local_queues": [{"namespace", "name", "cluster_queue", "pending", "reserving", "admitted", "used"}]}

Units as the local cluster's: cpu in cores, memory (and every ``*memory*``/``*storage*`` resource) in bytes,
other resources in their counts. ``nominal`` sums a resource's nominal quota over the queue's flavors;
``used``/``borrowed`` come from ``status.flavorsUsage`` (admitted workloads), ``reserved`` from
``status.flavorsReservation``; ``lent`` is what cohort peers borrow out of this queue's unused nominal quota
(Kueue does not report it; the same arithmetic as the local admitter's snapshot). ``pending`` lists runs only
where the visibility API answered (``visibility`` says whether it did); ``pending_count`` is Kueue's count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIX = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]{0,2})$")
_OUR_OBJECT_NAME = re.compile(r"-a\d+$")  # render.object_name: <run>-a<attempt>


def quantity(value: object) -> float:
    """A Kubernetes quantity (``"500m"``, ``"16Gi"``, ``4``, ``"1e3"``) as a number; 0 for nonsense."""
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        return 0.0
    try:
        return float(Decimal(match.group(1)) * _SUFFIX[match.group(2)])
    except InvalidOperation:
        return 0.0


def run_of(pending: Mapping[str, Any]) -> str:
    """The run a pending workload belongs to: its owning Job/RayJob is named ``<run>-a<attempt>``."""
    meta = pending.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") in ("Job", "RayJob") and _OUR_OBJECT_NAME.search(str(ref.get("name", ""))):
            return _OUR_OBJECT_NAME.sub("", str(ref["name"]))
    labels = meta.get("labels") or {}
    return str(labels.get("taugrid.io/run-id", ""))


def _sum(flavors: Iterable[Mapping[str, Any]], field: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for flavor in flavors:
        for res in flavor.get("resources") or []:
            name = str(res.get("name", ""))
            out[name] = out.get(name, 0.0) + quantity(res.get(field, 0))
    return out


def nominal(cq: Mapping[str, Any]) -> dict[str, float]:
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    return _sum((f for g in groups for f in g.get("flavors") or []), "nominalQuota")


def cohort(cq: Mapping[str, Any]) -> str:
    spec = cq.get("spec") or {}
    return str(spec.get("cohortName") or spec.get("cohort") or "")  # v1beta2 renamed cohort → cohortName


def pending_entries(summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A visibility ``PendingWorkloadsSummary`` → the snapshot's pending runs, in ClusterQueue order."""
    items = sorted((summary or {}).get("items") or [], key=lambda i: i.get("positionInClusterQueue", 0))
    return [{"run_id": run_of(item), "workload": str((item.get("metadata") or {}).get("name", "")),
             "position": int(item.get("positionInClusterQueue", i)),
             "local_queue": str(item.get("localQueueName", "")), "priority": item.get("priority")}
            for i, item in enumerate(items)]


def snapshot(cluster_queues: Iterable[Mapping[str, Any]], local_queues: Iterable[Mapping[str, Any]], *,
             pending: Mapping[str, Mapping[str, Any]] | None, cluster: str, now: float) -> dict[str, Any]:
    """The ``tau queue`` snapshot. ``pending``: ClusterQueue name → its visibility answer, or None when the
    visibility API is not served (or not allowed)."""
    cqs = sorted(cluster_queues, key=lambda q: str((q.get("metadata") or {}).get("name", "")))
    queues = []
    for cq in cqs:
        name = str((cq.get("metadata") or {}).get("name", ""))
        status = cq.get("status") or {}
        usage = status.get("flavorsUsage") or []
        active: dict[str, Any] = next(
            (cd for cd in status.get("conditions") or [] if cd.get("type") == "Active"), {})
        queues.append({
            "cluster_queue": name, "cohort": cohort(cq), "nominal": nominal(cq),
            "used": {r: v for r, v in _sum(usage, "total").items() if v},
            "borrowed": {r: v for r, v in _sum(usage, "borrowed").items() if v},
            "reserved": {r: v for r, v in _sum(status.get("flavorsReservation") or [], "total").items() if v},
            "admitted": int(status.get("admittedWorkloads") or 0),
            "reserving": int(status.get("reservingWorkloads") or 0),
            "pending": pending_entries(pending.get(name)) if pending is not None else [],
            "pending_count": int(status.get("pendingWorkloads") or 0),
            "active": active.get("status", "True") == "True",
            "message": "" if active.get("status", "True") == "True" else str(active.get("message", "")),
        })
    for q in queues:
        peers = [o for o in queues if o is not q and q["cohort"] and o["cohort"] == q["cohort"]]
        q["lent"] = {r: lent for r, v in q["nominal"].items()
                     if (lent := min(max(0.0, v - q["used"].get(r, 0.0)),
                                     sum(o["borrowed"].get(r, 0.0) for o in peers)))}
    lqs = [{"namespace": str((lq.get("metadata") or {}).get("namespace", "")),
            "name": str((lq.get("metadata") or {}).get("name", "")),
            "cluster_queue": str((lq.get("spec") or {}).get("clusterQueue", "")),
            "pending": int((lq.get("status") or {}).get("pendingWorkloads") or 0),
            "reserving": int((lq.get("status") or {}).get("reservingWorkloads") or 0),
            "admitted": int((lq.get("status") or {}).get("admittedWorkloads") or 0),
            "used": {r: v for r, v in _sum((lq.get("status") or {}).get("flavorsUsage") or [], "total").items()
                     if v}}
           for lq in sorted(local_queues, key=lambda q: ((q.get("metadata") or {}).get("namespace", ""),
                                                         (q.get("metadata") or {}).get("name", "")))]
    return {"time": now, "node": cluster, "backend": "kubernetes", "cluster": cluster,
            "visibility": pending is not None, "queues": queues, "local_queues": lqs}
