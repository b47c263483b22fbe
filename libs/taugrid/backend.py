"""The backend port: where rendered objects go. Local (the embedded cluster over the bus) or Kubernetes.

Both adapters expose the same verbs, so the renderer never knows which one it talks to. The adapters live with
their backends: ``taugrid.local.backend.LocalBackend`` and ``taugrid.kube.backend.KubernetesBackend``. What other
stages need of a backend goes through here too (``release_sealed``), so no service but a backend's own imports it.
"""

from __future__ import annotations

from typing import Any, Protocol

from taugrid import settings
from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.local.backend import LocalBackend
from taugrid.local.cleanup import remove_finished_pods
from taugrid.settings.model import Settings


class Backend(Protocol):
    name: str

    async def apply(self, req: BackendApply) -> None: ...

    async def delete(self, req: BackendDelete) -> None: ...


async def make(bus: Bus, given: Settings) -> Any:
    """The backend ``TAU_BACKEND`` names: ``local`` (default) or ``kubernetes`` (kubeconfig or in-cluster
    credentials, ``given.kube``). ``TAU_CLUSTER`` names it in subjects: unset, ``local`` or ``default``."""
    if given.process.backend == "kubernetes":
        from taugrid.kube.backend import kube_backend_from_env

        return await kube_backend_from_env(given.process.cluster or "default", given.kube)
    return LocalBackend(bus, given.process.cluster or "local")


def release_sealed(run_id: str) -> list[str]:
    """Once a run's evidence is sealed, what its backend left on this machine goes: on the embedded stack
    (``TAU_DATA_DIR`` set) the run's finished pod directories (``local.cleanup``; outputs stay); elsewhere nothing
    (a Kubernetes Job's pods are the cluster's). Returns the names removed."""
    data_dir = settings.stack_data_dir()
    return [] if data_dir is None else remove_finished_pods(data_dir / "pods", run_id)
