"""``python -m taugrid_services.kube_bridge``: one per cluster is active (lease), others stand by.

Environment: ``TAU_CLUSTER`` (name in subjects, default ``default``), ``TAU_KUBECONFIG``/``KUBECONFIG`` and
``TAU_KUBE_CONTEXT`` (else the in-cluster service account), ``TAU_KUBE_HOST`` (explicit API URL, tests),
``TAU_BRIDGE_LEASE_TTL`` (seconds, default 15), ``TAU_WATCH_NAMESPACES`` (comma list of namespaces to watch
namespaced kinds in; empty = all namespaces — the Helm chart sets it when RBAC is namespaced).
"""

from __future__ import annotations

from taugrid.kube.client import KubeApi, api_client_for
from taugrid.service import Service, main
from taugrid_services.kube_bridge.bridge import Bridge


async def start(svc: Service) -> None:
    kube = svc.settings.kube
    api_client = await api_client_for(kube)
    bridge = Bridge(
        svc.bus,
        KubeApi(api_client),
        cluster=svc.settings.process.cluster or "default",
        lease_ttl_s=kube.bridge_lease_ttl_s,
        namespaces=sorted(kube.watch_namespaces),
    )

    async def run() -> None:
        try:
            await bridge.run(svc.stopping)
        finally:
            await api_client.close()

    svc.background(run())


if __name__ == "__main__":
    main("kube-bridge", start)
