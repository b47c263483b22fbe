"""Set-up shared by the tests that run the real services in-process: a private bootstrapped nats-server (durables
are per server, so such tests cannot share the session's), one connection per service under its own name (the
consumers check ce-source against it), and the one-node local cluster they run pods on."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

from taugrid.bus import Bus, connect, runstate
from taugrid.bus.bootstrap import bootstrap
from taugrid.local.controller import LocalCluster
from taugrid.stack import natsserver


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.asynccontextmanager
async def private_server(root: Path, *, name: str = "bootstrap") -> AsyncIterator[tuple[str, Bus]]:
    """A bootstrapped nats-server of the test's own and a connection to it, both gone on exit."""
    proc, port = natsserver.start(root / "nats", log_file=root / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    try:
        bus = await connect(url, name=name)
        try:
            await bootstrap(bus)
            yield url, bus
        finally:
            await bus.close()
    finally:
        stop_server(proc)


async def service_bus(url: str, name: str) -> Bus:
    """A service's own connection, resolving signers as `taugrid.bus.service.run` does."""
    bus = await connect(url, name=name)
    bus.user_lookup = runstate.VerifiedUsers(bus)
    return bus


async def one_node_cluster(bus: Bus, data_dir: Path) -> LocalCluster:
    """The embedded cluster as the tests size it: one node, 4 CPUs, 8 GiB, no GPUs; its state loaded."""
    cluster = LocalCluster(bus, data_dir=data_dir, node="node-1", capacity={"cpu": 4.0, "memory": float(8 << 30)},
                           gpu_count=0)
    await cluster.load()
    return cluster
