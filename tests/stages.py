"""The pipeline's stages started in-process the way their services start them (``services/<stage>/__main__.start``),
each on a connection of its own (``inprocess.RunningServices``): the set-up the identity, hardening and source
suites share. The renderer runs on the local backend, and the local cluster on one node, as ``tau up`` runs them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from taugrid.local.backend import LocalBackend
from taugrid.local.controller import LocalCluster
from taugrid.service import Service
from taugrid_services.admission_watcher.__main__ import start as admission_watcher
from taugrid_services.evidence.__main__ import start as evidence
from taugrid_services.policy.__main__ import start as policy
from taugrid_services.recovery.__main__ import start as recovery
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.run_record.__main__ import start as run_record
from taugrid_services.submitter.__main__ import start as submitter
from tests.inprocess import RunningServices, one_node_cluster


async def _renderer(svc: Service) -> None:
    svc.consume("renderer", Renderer(svc.bus, LocalBackend(svc.bus)).on_event)


STARTS: dict[str, Callable[[Service], Awaitable[None]]] = {
    "submitter": submitter, "run-record": run_record, "policy": policy, "admission-watcher": admission_watcher,
    "recovery": recovery, "evidence": evidence, "renderer": _renderer,
}
THROUGH_RENDERER = ("submitter", "run-record", "policy", "admission-watcher", "recovery", "renderer")


async def start_stages(running: RunningServices, *names: str) -> None:
    """Start each named stage (``STARTS``), in the order given, as a service of ``running``."""
    for name in names:
        svc = await running.service(name)
        await STARTS[name](svc)
        running.start(svc)


async def start_local_cluster(running: RunningServices, data_dir: Path) -> LocalCluster:
    """The one-node local cluster as the ``local-cluster`` service runs it: applies from the bus, a tick every
    0.1 s."""
    svc = await running.service("local-cluster")
    cluster = await one_node_cluster(svc.bus, data_dir)
    svc.consume("local-cluster", cluster.on_backend)
    svc.every(0.1, cluster.tick)
    running.start(svc)
    return cluster
