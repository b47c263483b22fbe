"""A Kubernetes site's report of itself for the control plane (``core/sitecapacity.SiteCapacity``), from the
kube-bridge's queue snapshot (``kube/queues.snapshot``, the one ``tau queue`` reads at the site): each
ClusterQueue's nominal quota, use, borrowing and lending, admitted and pending counts, and its first waiting runs
(where Kueue's visibility API answers).

Use counts Kueue's quota *reservations* (``flavorsReservation``, admitted workloads included), as the local site
counts its held reservations: a MultiKueue-style reservation (``kube/sitework.py``) holds quota before it is
chosen. The pool figures (nodes, GPUs, CPUs, flavors) are not reported yet (docs §16): they stay empty.

Pure, and nothing time-dependent goes in, so an unchanged site's two reports are equal and it writes only on
change (``KubeSite.report_capacity``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taugrid.core.sitecapacity import FIRST_PENDING, QueueShare, SiteCapacity


def site_capacity(snapshot: Mapping[str, Any]) -> SiteCapacity:
    queues = []
    for q in snapshot.get("queues") or []:
        waiting = [str(p["run_id"]) for p in q.get("pending") or [] if p.get("run_id")]
        queues.append(QueueShare(
            cluster_queue=str(q["cluster_queue"]), cohort=str(q.get("cohort") or ""),
            nominal=_amounts(q.get("nominal") or {}), used=_amounts(q.get("reserved") or q.get("used") or {}),
            borrowed=_amounts(q.get("borrowed") or {}), lent=_amounts(q.get("lent") or {}),
            admitted=max(int(q.get("admitted") or 0), int(q.get("reserving") or 0)),
            pending=int(q.get("pending_count") or 0), first_pending=waiting[:FIRST_PENDING]))
    return SiteCapacity(queues=queues)


def _amounts(values: Mapping[str, float]) -> dict[str, float]:
    # zeros say nothing and would make an idle report differ from one that never used the resource
    return {r: float(v) for r, v in sorted(values.items()) if v}
