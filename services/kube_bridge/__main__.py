"""``python -m taugrid_services.kube_bridge``: one per cluster is active (lease), others stand by.

Environment: ``TAU_CLUSTER`` (name in subjects, default ``default``), ``TAU_KUBECONFIG``/``KUBECONFIG`` and
``TAU_KUBE_CONTEXT`` (else the in-cluster service account), ``TAU_KUBE_HOST`` (explicit API URL, tests),
``TAU_BRIDGE_LEASE_TTL`` (seconds, default 15), ``TAU_WATCH_NAMESPACES`` (comma list of namespaces to watch
namespaced kinds in; empty = all namespaces — the Helm chart sets it when RBAC is namespaced).
"""

from __future__ import annotations

import os

from taugrid.kube.client import KubeApi, make_api_client
from taugrid.service import Service, main
from taugrid_services.kube_bridge.bridge import Bridge


def watch_namespaces(value: str) -> list[str]:
    """``"a, b,,a"`` → ``["a", "b"]``; empty → [] (every namespace)."""
    return sorted({n.strip() for n in value.split(",") if n.strip()})


async def start(svc: Service) -> None:
    api_client = await make_api_client(
        kubeconfig=os.environ.get("TAU_KUBECONFIG") or os.environ.get("KUBECONFIG") or None,
        context=os.environ.get("TAU_KUBE_CONTEXT") or None,
        host=os.environ.get("TAU_KUBE_HOST") or None,
    )
    bridge = Bridge(
        svc.bus,
        KubeApi(api_client),
        cluster=os.environ.get("TAU_CLUSTER", "default"),
        lease_ttl_s=float(os.environ.get("TAU_BRIDGE_LEASE_TTL", "15")),
        namespaces=watch_namespaces(os.environ.get("TAU_WATCH_NAMESPACES", "")),
    )

    async def run() -> None:
        try:
            await bridge.run(svc.stopping)
        finally:
            await api_client.close()

    svc.background(run())


if __name__ == "__main__":
    main("kube-bridge", start)
