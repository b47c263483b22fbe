"""``python -m taugrid_services.log_shipper``: follow the logs of every tau pod (Kubernetes backend only).

Environment: as kube-bridge — ``TAU_KUBECONFIG``/``KUBECONFIG`` and ``TAU_KUBE_CONTEXT`` (else the in-cluster
service account), ``TAU_KUBE_HOST`` (explicit API URL, tests), ``TAU_WATCH_NAMESPACES`` (comma list; empty =
every namespace). Run one replica: a second would follow the same streams (its writes lose the
compare-and-set and nothing is doubled, but the work is).
"""

from __future__ import annotations

from taugrid.kube.client import KubeApi, api_client_for
from taugrid.service import Service, main
from taugrid_services.log_shipper.shipper import LogShipper


async def start(svc: Service) -> None:
    kube = svc.settings.kube
    api_client = await api_client_for(kube)
    namespaces = sorted(kube.watch_namespaces)
    shipper = LogShipper(KubeApi(api_client), svc.bus, namespaces=namespaces)

    async def run() -> None:
        await shipper.start()
        try:
            await shipper.wait(svc.stopping)  # raises if a watch failed for good (RBAC): the pod restarts
        finally:
            await shipper.stop()
            await api_client.close()

    svc.background(run())


if __name__ == "__main__":
    main("log-shipper", start)
