"""The ``Backend`` port (``taugrid.backend``) for Kubernetes: BackendApply/BackendDelete → KubeBackend.

Idempotent like ``KubeBackend``: the same request applies the same named objects; deleting a gone object
succeeds. ``exclude_nodes`` is not enforced here: the renderer puts node anti-affinity into the manifests.
"""

from __future__ import annotations

from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import api_client_for
from taugrid.settings import current
from taugrid.settings.model import KubeSettings


class KubernetesBackend:
    def __init__(self, kube: KubeBackend, cluster: str = "default") -> None:
        self.kube, self.name = kube, cluster

    async def apply(self, req: BackendApply) -> None:
        await self.kube.apply(req.manifests)

    async def delete(self, req: BackendDelete) -> None:
        await self.kube.delete(req.kind, req.namespace, req.name, grace_s=req.grace_s)

    async def close(self) -> None:
        await self.kube.close()


async def kube_backend_from_env(cluster: str | None = None, kube: KubeSettings | None = None) -> KubernetesBackend:
    """The client from ``kube`` (``TAU_KUBE_HOST`` / ``TAU_KUBECONFIG`` (or ``KUBECONFIG``) + ``TAU_KUBE_CONTEXT`` /
    in-cluster), named ``cluster`` (``TAU_CLUSTER``, else ``default``); each defaults to this process's settings."""
    name = cluster if cluster is not None else current().process.cluster or "default"
    return KubernetesBackend(KubeBackend(await api_client_for(kube)), name)
