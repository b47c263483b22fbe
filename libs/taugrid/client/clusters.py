"""What `tau clusters` shows: each cluster the platform names, the health of its link to the control plane, the
reports its link has not yet delivered (lag), and the runs it holds now (usage).

Health comes from the hub's stream of the cluster's reports (``bus.sites.link``): ``ok`` when the hub heard from
the site's stream within ``SILENT_AFTER_S``, ``silent`` after that, ``never reached`` when it has not since the
hub started, ``no link`` when the hub has no stream for it (the site was never provisioned). The lease is the
site's in the hub's ``site_leases`` (``gen N`` while held, ``lost (gen N)`` once the hub declared the cluster lost
and requeued its runs, until the site fences and rejoins; ``-`` before its first renewal). Usage counts the runs
whose record says they went there (``dispatch.chosen``) and that are admitted or running, of the records the
caller passes (``Client.list``: a person's own workspaces, as ``tau nodes`` counts them).
"""

from __future__ import annotations

import msgspec

from taugrid.bus.connection import Bus
from taugrid.bus.sites import Link, SiteLease, leases, link
from taugrid.config.platform import Platform
from taugrid.core.states import RunRecord

SILENT_AFTER_S = 30.0
_HOLDING = frozenset({"admitted", "running"})


class ClusterRow(msgspec.Struct, frozen=True):
    name: str
    backend: str
    preference: int
    cluster_queues: list[str] | None  # None: every ClusterQueue
    health: str
    lag: int | None  # reports the hub has not pulled yet; None without a link
    silent_s: float | None
    runs: int  # runs admitted or running there now
    lease: str = "-"


def health(found: Link | None) -> str:
    if found is None:
        return "no link"
    if found.silent_s is None:
        return "never reached"
    if found.silent_s > SILENT_AFTER_S:
        return f"silent {found.silent_s:.0f}s"
    return "ok"


def lease_view(lease: SiteLease | None) -> str:
    if lease is None:
        return "-"
    return f"lost (gen {lease.generation})" if lease.lost else f"gen {lease.generation}"


async def cluster_rows(bus: Bus, platform: Platform, records: list[RunRecord]) -> list[ClusterRow]:
    holding: dict[str, int] = {}
    for record in records:
        if record.cluster and record.state in _HOLDING:
            holding[record.cluster] = holding.get(record.cluster, 0) + 1
    rows = []
    held = {name: lease for name, (lease, _) in (await leases(bus)).items()} if platform.clusters else {}
    for c in platform.clusters:
        found = await link(bus, c.name)
        rows.append(ClusterRow(name=c.name, backend=c.backend, preference=c.preference,
                               cluster_queues=c.cluster_queues, health=health(found),
                               lag=found.lag if found else None, silent_s=found.silent_s if found else None,
                               runs=holding.get(c.name, 0), lease=lease_view(held.get(c.name))))
    return rows
