"""A Kubernetes cluster as a site (``TAU_SITE``, docs §13d): the kube-bridge holds the site's lease in the hub's
``site_leases`` across the leaf link, as the local cluster does for a local site (``bus/sitelease.py``).

Every pass renews it; when the hub declared this cluster lost while it was away, the bridge first deletes every
Job and RayJob of ours whose run attempt the hub no longer has chosen here (read from the cluster:
``kube/siteruns.py``), then rejoins under the hub's generation. ``held`` is the gate of anything that acts on
the site's ``SITE_IN``: cleared while the hub is out of reach or the site is fencing.

Every replica renews (a compare-and-set on the lease's revision: two replicas renewing under one generation both
land or retry; fencing's deletes are idempotent), so the lease says the site and its link are alive, not which
replica leads the watches.
"""

from __future__ import annotations

from collections.abc import Iterable

from taugrid.bus import sites
from taugrid.bus.connection import Bus
from taugrid.bus.sitelease import SiteLeaseKeeper
from taugrid.kube import siteruns
from taugrid.kube.apply import KubeBackend


class KubeSite:
    def __init__(self, bus: Bus, kube: KubeBackend, cluster: str, *, namespaces: Iterable[str] = (),
                 hub_domain: str = sites.HUB_DOMAIN, grace_s: int = 30) -> None:
        self.kube, self.cluster = kube, cluster
        self.namespaces = sorted(set(namespaces))
        self.grace_s = grace_s  # an orphan's pods' grace between SIGTERM and SIGKILL
        self.lease = SiteLeaseKeeper(bus, cluster, hub_domain=hub_domain)

    async def lease_pass(self) -> None:
        """Renew the site's lease, fencing first when the hub declared this cluster lost."""
        await self.lease.renew(self._attempts, self._stop)

    async def _attempts(self) -> dict[str, str]:
        return await siteruns.dispatched(self.kube, self.namespaces)

    async def _stop(self, key: str, reason: str) -> None:
        await siteruns.stop(self.kube, key, grace_s=self.grace_s)
