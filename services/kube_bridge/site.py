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
the reservation's Workload, once Kueue admits it, is published into ``SITE_OUT`` by the leader's watch. Each
lease pass also writes the site's capacity record into the hub's ``site_capacity`` on change, from the leader's
queue snapshot (``kube/sitecapacity.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from taugrid.bus import kv, sitecapacity, sites
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.platformread import PlatformReader
from taugrid.bus.sitelease import SiteLeaseKeeper
from taugrid.core.contracts import BackendApply, BackendDelete, WatchEvent
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.sitecapacity import SiteCapacity
from taugrid.core.siteleases import WORKER_LOST_TIMEOUT_S, renew_period
from taugrid.kube import siteruns
from taugrid.kube.apply import KubeBackend
from taugrid.kube.sitecapacity import site_capacity
from taugrid.kube.sitework import SiteWork
from taugrid_services.kube_bridge.bridge import QUEUES_BUCKET, QUEUES_KEY

log = logging.getLogger("taugrid.kube_bridge")


async def lease_period(bus: Bus) -> float:
    """How often the site renews its lease: ``renew_period`` of the platform's ``dispatch.worker_lost_timeout`` as
    stored at the site (the hub's, copied there), read at start as the local cluster does; the default's while
    the site has no valid platform."""
    try:
        got = await PlatformReader(bus).get()
    except TemporaryError:  # no valid revision at all (PlatformReader logged why)
        got = None
    return renew_period(got[0].dispatch.worker_lost_timeout if got is not None else WORKER_LOST_TIMEOUT_S)


class KubeSite:
    def __init__(self, bus: Bus, kube: KubeBackend, cluster: str, *, namespaces: Iterable[str] = (),
                 hub_domain: str = sites.HUB_DOMAIN, grace_s: int = 30) -> None:
        self.kube, self.cluster = kube, cluster
        self.namespaces = sorted(set(namespaces))
        self.grace_s = grace_s  # an orphan's pods' grace between SIGTERM and SIGKILL
        self.bus, self.hub_domain = bus, hub_domain
        self.lease = SiteLeaseKeeper(bus, cluster, hub_domain=hub_domain)
        self._capacity_sent: SiteCapacity | None = None  # the last record the hub took (``report_capacity``)
        self.work = SiteWork(kube)

    async def lease_pass(self) -> None:
        """Renew the site's lease, fencing first when the hub declared this cluster lost; then the capacity
        record, when it changed."""
        await self.lease.renew(self._attempts, self._stop)
        try:
            await self.report_capacity()
        except TemporaryError as exc:  # the lease is renewed; the record goes at the next pass
            log.warning("capacity of %s not reported to the hub: %s", self.cluster, exc)

    async def report_capacity(self) -> None:
        """This cluster's capacity and usage into the hub's ``site_capacity`` (its own key), from the queue
        snapshot the leading bridge last wrote at the site (``kube/sitecapacity.py``), only when it changed
        since the last write the hub took: at most once a lease period, never per event."""
        found = await kv.get(self.bus, QUEUES_BUCKET, QUEUES_KEY)
        if found is None or not found.value:
            return  # no snapshot yet (no ClusterQueue seen): nothing to report
        record = site_capacity(msgspec.json.decode(found.value))
        if record == self._capacity_sent:
            return
        await sitecapacity.report(self.bus, self.cluster, record, hub_domain=self.hub_domain)
        self._capacity_sent = record

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

    async def on_change(self, ev: WatchEvent) -> None:
        """Each watch change the leading bridge published: a chosen run Kueue preempted here is held back
        (``SiteWork.hold_back``)."""
        if ev.type != "DELETED" and await self.work.hold_back(ev.object):
            meta = ev.object.get("metadata") or {}
            log.warning("%s/%s preempted at %s: its Job deleted, its Workload queued again as the reservation",
                        meta.get("namespace"), meta.get("name"), self.cluster)

    async def _attempts(self) -> dict[str, str]:
        return await siteruns.dispatched(self.kube, self.namespaces)

    async def _stop(self, key: str, reason: str) -> None:
        await siteruns.stop(self.kube, key, grace_s=self.grace_s)
