"""The backend port: where rendered objects go. Local (the embedded cluster over the bus) or Kubernetes.

Both adapters expose the same verbs, so the renderer never knows which one it talks to. The adapters live with
their backends: ``taugrid.local.backend.LocalBackend`` and ``taugrid.kube.backend.KubernetesBackend``.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.local.backend import LocalBackend


class Backend(Protocol):
    name: str

    async def apply(self, req: BackendApply) -> None: ...

    async def delete(self, req: BackendDelete) -> None: ...


async def from_env(bus: Bus) -> Any:
    """``TAU_BACKEND=local`` (default) or ``kubernetes`` (kubeconfig or in-cluster credentials)."""
    kind = os.environ.get("TAU_BACKEND", "local")
    if kind == "kubernetes":
        from taugrid.kube.backend import kube_backend_from_env

        return await kube_backend_from_env()
    return LocalBackend(bus, os.environ.get("TAU_CLUSTER", "local"))
