"""A site's report of itself for the control plane (``core/sitecapacity.SiteCapacity``): its pool's nodes, GPUs
and CPUs, by ResourceFlavor, and its ClusterQueues' quota and use, from the admitter's own queue snapshot (the
one ``tau queue`` reads at the site).

Pure: the caller passes the platform, the admitter's pool and snapshot, and how to name a workload's run.
Invariant: nothing time-dependent goes in, so two reports of an unchanged site are equal and the site writes
only when something changed (``LocalCluster.report_capacity``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from taugrid.config.platform import Platform
from taugrid.config.platformtopology import selects
from taugrid.core.sitecapacity import FIRST_PENDING, FlavorCapacity, QueueShare, SiteCapacity
from taugrid.local.admit import PoolNode


def _cpu(nodes: list[PoolNode]) -> float | None:
    return None if any(n.cpu is None for n in nodes) else sum(n.cpu or 0.0 for n in nodes)


def site_capacity(platform: Platform | None, pool: list[PoolNode], snapshot: list[dict[str, Any]],
                  run_of: Callable[[str], str | None]) -> SiteCapacity:
    """``snapshot`` is ``LocalAdmitter.snapshot`` (pending: workload names in admission order); ``run_of`` a
    workload's run id (None: no longer held, left out)."""
    gpus: dict[str, float] = {}
    for n in pool:
        if n.gpus:
            gpus[n.gpu_resource] = gpus.get(n.gpu_resource, 0.0) + n.gpus
    flavors = []
    for f in platform.resource_flavors if platform is not None else []:
        members = [n for n in pool if selects(f.node_labels, dict(n.labels))]
        flavors.append(FlavorCapacity(f.name, len(members), float(sum(n.gpus for n in members)), _cpu(members)))
    queues = []
    for q in snapshot:
        waiting = [run for run in (run_of(name) for name in cast(list[str], q["pending"])) if run is not None]
        queues.append(QueueShare(
            cluster_queue=str(q["cluster_queue"]), cohort=str(q["cohort"] or ""),
            nominal=_amounts(q["nominal"]), used=_amounts(q["used"]), borrowed=_amounts(q["borrowed"]),
            lent=_amounts(q["lent"]), admitted=int(q["admitted"]), pending=len(waiting),
            first_pending=waiting[:FIRST_PENDING]))
    return SiteCapacity(nodes=len(pool), gpus=gpus, cpu=_cpu(pool), memory=float(sum(n.memory for n in pool)),
                        flavors=flavors, queues=queues)


def _amounts(values: Mapping[str, float]) -> dict[str, float]:
    # zeros say nothing and would make an idle report differ from one that never used the resource
    return {r: float(v) for r, v in sorted(values.items()) if v}
