"""The backend port: where rendered objects go. Local (the embedded cluster over the bus) or Kubernetes.

Both adapters expose the same verbs, so the renderer never knows which one it talks to.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.core.events import backend_subject


class Backend(Protocol):
    name: str

    async def apply(self, req: BackendApply) -> None: ...

    async def delete(self, req: BackendDelete) -> None: ...


class LocalBackend:
    """Hands objects to the local cluster through the BACKEND stream (durable: survives its restarts)."""

    def __init__(self, bus: Bus, cluster: str = "local") -> None:
        self.bus, self.name = bus, cluster

    async def apply(self, req: BackendApply) -> None:
        await self.bus.publish(
            backend_subject(self.name, "apply"), req, event_type="apply", ce_subject=req.run_id,
            msg_id=f"{req.run_id}.{req.attempt}.apply", workspace=req.workspace, attempt=req.attempt,
            family="backend",
        )

    async def delete(self, req: BackendDelete) -> None:
        await self.bus.publish(
            backend_subject(self.name, "delete"), req, event_type="delete", ce_subject=req.run_id,
            msg_id=f"{req.run_id}.{req.attempt}.delete", workspace=req.workspace, attempt=req.attempt,
            family="backend",
        )


async def from_env(bus: Bus) -> Any:
    """``TAU_BACKEND=local`` (default) or ``kubernetes`` (kubeconfig or in-cluster credentials)."""
    kind = os.environ.get("TAU_BACKEND", "local")
    if kind == "kubernetes":
        from taugrid.kube.backend import kube_backend_from_env

        return await kube_backend_from_env()
    return LocalBackend(bus, os.environ.get("TAU_CLUSTER", "local"))
