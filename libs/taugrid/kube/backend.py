"""The ``Backend`` port (``taugrid.backend``) for Kubernetes: BackendApply/BackendDelete → KubeBackend.

Idempotent like ``KubeBackend``: the same request applies the same named objects; deleting a gone object
succeeds. ``exclude_nodes`` is not enforced here: the renderer puts node anti-affinity into the manifests.
"""

from __future__ import annotations

import os

from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import api_client_for


class KubernetesBackend:
    def __init__(self, kube: KubeBackend, cluster: str = "default") -> None:
        self.kube, self.name = kube, cluster

    async def apply(self, req: BackendApply) -> None:
        await self.kube.apply(req.manifests)

    async def delete(self, req: BackendDelete) -> None:
        await self.kube.delete(req.kind, req.namespace, req.name, grace_s=req.grace_s)

    async def close(self) -> None:
        await self.kube.close()


async def kube_backend_from_env() -> KubernetesBackend:
    """From ``TAU_KUBE_HOST`` / ``TAU_KUBECONFIG`` (or ``KUBECONFIG``) + ``TAU_KUBE_CONTEXT`` / in-cluster."""
    return KubernetesBackend(KubeBackend(await api_client_for()), os.environ.get("TAU_CLUSTER", "default"))
