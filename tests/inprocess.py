"""Set-up shared by the tests that run the real services in-process: a private bootstrapped nats-server (durables
are per server, so such tests cannot share the session's), one connection per service under its own name (the
consumers check ce-source against it), and the one-node local cluster they run pods on."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from taugrid import runrecord
from taugrid.bus import Bus, connect, identity, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.client import Client
from taugrid.local.controller import LocalCluster
from taugrid.service import Service
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
    """A service's own connection, resolving signers as `taugrid.service.run` does."""
    bus = await connect(url, name=name)
    bus.user_lookup = runrecord.VerifiedUsers(bus)
    return bus


async def one_node_cluster(bus: Bus, data_dir: Path) -> LocalCluster:
    """The embedded cluster as the tests size it: one node, 4 CPUs, 8 GiB, no GPUs; its state loaded."""
    cluster = LocalCluster(bus, data_dir=data_dir, node="node-1", capacity={"cpu": 4.0, "memory": float(8 << 30)},
                           gpu_count=0)
    await cluster.load()
    return cluster


class PipelineLoops:
    """Handlers of the real services as ``ConsumerLoop`` tasks on their real durables, each service on its own
    connection under its own name, plus any background tasks; ``close`` stops and disconnects them all."""

    def __init__(self, url: str, *, fetch_timeout: float) -> None:
        self.url, self.fetch_timeout = url, fetch_timeout
        self.svc: dict[str, Bus] = {}
        self.loops: list[ConsumerLoop] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.stopping = asyncio.Event()

    async def connect(self, *names: str) -> None:
        for name in names:
            self.svc[name] = await service_bus(self.url, name)

    def consume(self, stream: str, durable: str, handler: Any, service: str,
                tails: dict[str, asyncio.Future[None]] | None = None, *, batch: int = 32,
                ordered: bool = True) -> ConsumerLoop:
        """``tails``: another loop's, for a stage's priority lane (as ``Service.consume`` binds it); ``batch`` and
        ``ordered`` as the service binds them (``Service.consume``)."""
        loop = ConsumerLoop(self.svc[service], stream=stream, durable=durable, handler=handler,
                            fetch_timeout=self.fetch_timeout, tails=tails, batch=batch, ordered=ordered)
        self.loops.append(loop)
        self.tasks.append(asyncio.create_task(loop.run(), name=durable))
        return loop

    def record(self, durable: str = "runstate", tails: dict[str, asyncio.Future[None]] | None = None,
               recorder: Any = None) -> ConsumerLoop:
        """The run-record stage on ``durable``, bound as its service binds it (``Recorder.BATCH``, unordered)."""
        from taugrid_services.run_record.handlers import Recorder

        recorder = recorder or Recorder(self.svc["run-record"])
        return self.consume("RUNS", durable, recorder.on_event, "run-record", tails, batch=Recorder.BATCH,
                            ordered=Recorder.ORDERED)

    def every(self, seconds: float, tick: Any) -> None:
        """Call ``tick()`` every ``seconds`` until closed (the local cluster's housekeeping)."""

        async def ticks() -> None:
            while not self.stopping.is_set():
                await tick()
                await asyncio.sleep(seconds)

        self.tasks.append(asyncio.create_task(ticks()))

    async def stop(self) -> None:
        self.stopping.set()
        for loop in self.loops:
            loop.stopping.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def close(self) -> None:
        for b in self.svc.values():
            await b.close()


async def sign_as_local_user(bus: Bus, user: str = "tester") -> None:
    """Make ``bus`` submit as the stack's local user (the platform lists no users: the local key is accepted)."""
    bus.seed = identity.new_user_seed()
    await platformstore.put_local_user(bus, platformstore.LocalUser(user, identity.public_key(bus.seed)))


class RunningServices:
    """Services run as tasks of the test's event loop, each on its own connection, and stopped the way
    `taugrid.service.main` stops them on SIGTERM: loops told to stop, given 10 s to drain, then cancelled."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.services: list[Service] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.buses: list[Bus] = []

    async def service(self, name: str) -> Service:
        """A service connected under `name` (the consumers check ce-source against it), not yet started."""
        bus = await service_bus(self.url, name)
        self.buses.append(bus)
        svc = Service(bus)
        self.services.append(svc)
        return svc

    async def client(self, seed: bytes | None) -> Client:
        """A person's client signing with `seed` (None: signs nothing), closed with the services."""
        bus = await connect(self.url, name="client")
        bus.seed = seed
        self.buses.append(bus)
        return Client(bus)

    def start(self, svc: Service, *, fetch_timeout: float = 0.5) -> None:
        """Run the service's consumer loops and timers; a short fetch timeout makes stopping quick."""
        for loop in svc.loops:
            loop.fetch_timeout = fetch_timeout
        self.tasks += [asyncio.create_task(lp.run()) for lp in svc.loops]
        self.tasks += [asyncio.create_task(t) for t in svc.tasks]

    async def stop(self) -> None:
        for svc in self.services:
            svc.stop()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=10)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for b in self.buses:
            await b.close()


async def wait_for_events(client: Client, run_id: str, kinds: set[str], timeout: float = 60.0) -> list[Event]:
    """The run's history once it holds one of `kinds`; fails naming what it holds after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        evs = [e async for e in client.events(run_id=run_id)]
        if kinds & {e.type for e in evs}:
            return evs
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_id}: none of {kinds} in {[e.type for e in evs]}")
        await asyncio.sleep(0.1)
