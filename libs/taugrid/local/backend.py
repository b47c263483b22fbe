"""The local adapter of the ``Backend`` port (``taugrid.backend``): rendered objects go to the local cluster's
controller through the BACKEND stream, which is durable, so requests survive the controller's restarts."""

from __future__ import annotations

from taugrid.bus import identity
from taugrid.bus.connection import Bus
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.core.events import HIGH_LANE, backend_subject


class LocalBackend:
    """Hands objects to the local cluster through the BACKEND stream (durable: survives its restarts)."""

    def __init__(self, bus: Bus, cluster: str = "local") -> None:
        self.bus, self.name = bus, cluster

    async def apply(self, req: BackendApply) -> None:
        subject = backend_subject(self.name, "apply")
        await self.bus.publish(
            f"{subject}.{HIGH_LANE}" if req.lane == HIGH_LANE else subject, req, event_type="apply",
            ce_subject=req.run_id,
            msg_id=f"{req.run_id}.{req.attempt}.apply", workspace=req.workspace, attempt=req.attempt,
            family="backend", user=run_user(req.run_id),
        )

    async def delete(self, req: BackendDelete) -> None:
        await self.bus.publish(
            backend_subject(self.name, "delete"), req, event_type="delete", ce_subject=req.run_id,
            msg_id=f"{req.run_id}.{req.attempt}.delete", workspace=req.workspace, attempt=req.attempt,
            family="backend", user=run_user(req.run_id),
        )


def run_user(run_id: str) -> str:
    """The verified submitter of ``run_id`` when the event being handled (the renderer's run event) names it, so
    the request, and every watch event the local cluster then publishes for the run, carries it on (the admission
    watcher emits with it instead of looking it up); "" otherwise."""
    handling = identity.run_user.get()
    return handling[1] if handling is not None and handling[0] == run_id else ""
