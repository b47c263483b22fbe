"""A Kubernetes cluster as a site (``TAU_SITE``, docs §13d): the kube-bridge holds the site's lease in the hub's
``site_leases`` across the leaf link, as the local cluster does for a local site (``bus/sitelease.py``), and
carries out the dispatcher's requests from the site's ``SITE_IN`` (``kube/sitework.py``: MultiKueue's way).

Every lease pass renews it; when the hub declared this cluster lost while it was away, the bridge first deletes
every Job, RayJob and reservation Workload of ours whose run attempt the hub no longer has chosen here (read from
the cluster: ``kube/siteruns.py``), then rejoins under the hub's generation. ``lease.held`` gates the ``SITE_IN``
consumer: it fetches nothing while the hub is out of reach or the site is fencing.

Every replica renews and consumes (the renewal is a compare-and-set on the lease's revision: two replicas under
one generation both land or retry; applies are server-side applies and deletes are idempotent), so the lease says
the site and its link are alive, not which replica leads the watches. The reports go out as the watch's changes:
the reservation's Workload, once Kueue admits it, is published into ``SITE_OUT`` by the leader's watch.
"""

from __future__ import annotations

from collections.abc import Iterable

from taugrid.bus import sites
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.sitelease import SiteLeaseKeeper
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.core.errors import PermanentError
from taugrid.kube import siteruns
from taugrid.kube.apply import KubeBackend
from taugrid.kube.sitework import SiteWork


class KubeSite:
    def __init__(self, bus: Bus, kube: KubeBackend, cluster: str, *, namespaces: Iterable[str] = (),
                 hub_domain: str = sites.HUB_DOMAIN, grace_s: int = 30) -> None:
        self.kube, self.cluster = kube, cluster
        self.namespaces = sorted(set(namespaces))
        self.grace_s = grace_s  # an orphan's pods' grace between SIGTERM and SIGKILL
        self.lease = SiteLeaseKeeper(bus, cluster, hub_domain=hub_domain)
        self.work = SiteWork(kube)

    async def lease_pass(self) -> None:
        """Renew the site's lease, fencing first when the hub declared this cluster lost."""
        await self.lease.renew(self._attempts, self._stop)

    async def on_request(self, ev: Event) -> None:
        """``backend.<cluster>.<reserve|apply|delete>[.high]`` from the site's ``SITE_IN``."""
        verb = ev.nats_subject.split(".")[2:3]
        if verb == ["reserve"]:
            await self.work.reserve(ev.payload(BackendApply))
        elif verb == ["apply"]:
            await self.work.apply(ev.payload(BackendApply))
        elif verb == ["delete"]:
            await self.work.delete(ev.payload(BackendDelete))
        else:
            raise PermanentError(f"{ev.nats_subject}: a site's requests are reserve, apply and delete")

    async def _attempts(self) -> dict[str, str]:
        return await siteruns.dispatched(self.kube, self.namespaces)

    async def _stop(self, key: str, reason: str) -> None:
        await siteruns.stop(self.kube, key, grace_s=self.grace_s)
