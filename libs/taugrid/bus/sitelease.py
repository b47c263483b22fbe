"""A site's hold on its lease in the hub's ``site_leases`` (issue 28 item 4), whatever runs its work: the local
cluster's pool and a Kubernetes site's kube-bridge keep it the same way (docs §13d).

Each pass renews the lease across the link (``sites.renew``). When the hub declared the cluster lost while it was
away (its runs requeued elsewhere), the site first stops every workload whose run attempt the hub no longer has
chosen here (``core.siteleases.orphans``), then rejoins under the hub's generation. ``held`` is cleared from the
moment a renewal fails or says fence until a later pass has fenced and renewed: meanwhile the site admits nothing
and its ``SITE_IN`` consumer fetches nothing (its ``gate``), so a returning site handles no request and starts
nothing before its orphans are stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from taugrid.bus import sites
from taugrid.bus.connection import Bus
from taugrid.core.siteleases import orphans

log = logging.getLogger("taugrid.sitelease")

# The site's workloads that run or hold quota for a dispatched run attempt: workload → ``sites.dispatch_key``.
Attempts = Callable[[], Awaitable[Mapping[str, str]]]
Stop = Callable[[str, str], Awaitable[None]]  # (workload, reason): stop it and everything it started


class SiteLeaseKeeper:
    def __init__(self, bus: Bus, cluster: str, *, hub_domain: str = sites.HUB_DOMAIN) -> None:
        self.bus, self.cluster, self.hub_domain = bus, cluster, hub_domain
        self.generation = 1  # the generation this site holds its lease under
        self.held = asyncio.Event()
        self.held.set()

    async def renew(self, attempts: Attempts, stop: Stop) -> bool:
        """One pass. True when the lease is held again after it was not (the caller wakes its admission).
        Raises what the link raises (``TemporaryError``), with ``held`` cleared."""
        try:
            got = await sites.renew(self.bus, self.cluster, self.generation, hub_domain=self.hub_domain)
        except Exception:
            self.held.clear()  # the hub out of reach: it may declare this cluster lost meanwhile
            raise
        if got.fence:
            self.held.clear()  # until every orphan is stopped (a failure below keeps it cleared)
            held = await attempts()
            chosen = await sites.chosen_at_hub(self.bus, set(held.values()), hub_domain=self.hub_domain)
            for name in orphans(held, chosen, self.cluster):
                log.warning("cluster %s was declared lost: stopping %s, requeued elsewhere", self.cluster, name)
                await stop(name, f"{self.cluster} was declared lost")
            await sites.rejoin(self.bus, self.cluster, got.generation, hub_domain=self.hub_domain)
        self.generation = got.generation
        if self.held.is_set():
            return False
        log.info("cluster %s holds its lease (generation %d): taking requests again", self.cluster, got.generation)
        self.held.set()
        return True
