"""``python -m taugrid_services.kube_bridge``: one per cluster is active (lease), others stand by.

Environment: ``TAU_CLUSTER`` (name in subjects, default ``default``), ``TAU_KUBECONFIG``/``KUBECONFIG`` and
``TAU_KUBE_CONTEXT`` (else the in-cluster service account), ``TAU_KUBE_HOST`` (explicit API URL, tests),
``TAU_BRIDGE_LEASE_TTL`` (seconds, default 15), ``TAU_WATCH_NAMESPACES`` (comma list of namespaces to watch
namespaced kinds in; empty = all namespaces — the Helm chart sets it when RBAC is namespaced), ``TAU_SITE``
(the cluster is a site of a hub: the bridge renews the site's lease there and carries out the requests in the
site's ``SITE_IN``, ``site.py``).
"""

from __future__ import annotations

import logging

from taugrid.bus import sites
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import SITE_LOCAL_DURABLE
from taugrid.core.errors import TemporaryError
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import KubeApi, api_client_for
from taugrid.service import Service, main
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.kube_bridge.site import KubeSite, lease_period

log = logging.getLogger("taugrid.kube_bridge")


async def start(svc: Service) -> None:
    kube = svc.settings.kube
    api_client = await api_client_for(kube)
    cluster = svc.settings.process.cluster or "default"
    site: KubeSite | None = None
    if svc.settings.process.site:
        site = KubeSite(svc.bus, KubeBackend(api_client), cluster, namespaces=kube.watch_namespaces)
        try:  # a returning site deletes its orphans (runs requeued elsewhere while it was away) first
            await site.lease_pass()
        except TemporaryError as exc:  # the hub out of reach: running work goes on; the next pass tries again
            log.warning("no lease renewal at start: %s", exc)
        # a quarter of the platform's worker_lost_timeout, at most 5 s (read at start: a change needs a restart)
        svc.every(await lease_period(svc.bus), site.lease_pass)
        # the dispatcher's requests, sourced from the hub into the site's SITE_IN (the durable a site's
        # local cluster would read: one backend per site)
        svc.loops.append(ConsumerLoop(svc.bus, stream=sites.SITE_IN, durable=SITE_LOCAL_DURABLE,
                                      handler=site.on_request, gate=site.lease.held))
    bridge = Bridge(
        svc.bus,
        KubeApi(api_client),
        cluster=cluster,
        lease_ttl_s=kube.bridge_lease_ttl_s,
        namespaces=sorted(kube.watch_namespaces),
        observers=[site.on_change] if site is not None else [],  # a preempted chosen run held back
    )

    async def run() -> None:
        try:
            await bridge.run(svc.stopping)
        finally:
            await api_client.close()

    svc.background(run())


if __name__ == "__main__":
    main("kube-bridge", start)
