"""The backend port: where rendered objects go. Local (the embedded cluster over the bus) or Kubernetes.

Both adapters expose the same verbs, so the renderer never knows which one it talks to. The adapters live with
their backends: ``taugrid.local.backend.LocalBackend`` and ``taugrid.kube.backend.KubernetesBackend``.
"""

from __future__ import annotations

from typing import Any, Protocol

from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.local.backend import LocalBackend
from taugrid.settings.model import ProcessSettings


class Backend(Protocol):
    name: str

    async def apply(self, req: BackendApply) -> None: ...

    async def delete(self, req: BackendDelete) -> None: ...


async def make(bus: Bus, given: ProcessSettings) -> Any:
    """The backend ``TAU_BACKEND`` names: ``local`` (default) or ``kubernetes`` (kubeconfig or in-cluster
    credentials)."""
    if given.backend == "kubernetes":
        from taugrid.kube.backend import kube_backend_from_env

        return await kube_backend_from_env()
    return LocalBackend(bus, given.cluster or "local")
