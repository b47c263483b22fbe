"""A private nats-server with the submitter and policy in-process: enough to see what happens to a submission
before anything runs (limits, paths, a bad platform)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import Bus, connect, identity, platformstore, runstate
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import Event
from taugrid.bus.service import Service
from taugrid.client import Client
from taugrid.stack import natsserver
from taugrid_services.policy.__main__ import start as policy
from taugrid_services.submitter.__main__ import start as submitter

PLATFORM = """
resource_flavors: [{name: default}]
cluster_queues:
  - name: lab
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal_quota: "8"}
              - {name: memory, nominal_quota: 16Gi}
local_queues: [{name: default, namespace: default, cluster_queue: lab}]
priority_classes: [{name: normal, value: 100}]
compute_profiles: [{name: cpu-small, cpu: "100m", memory: 128Mi}]
workspaces:
  - {name: team-a, namespace: default, local_queue: default, default_priority: normal,
     default_profile: cpu-small, output_root: OUTPUTS}
  - {name: slow, namespace: default, local_queue: default, default_priority: normal,
     default_profile: cpu-small, output_root: OUTPUTS, submissions_per_minute: 3}
"""


@dataclass
class Stack:
    url: str
    tmp: Path
    admin: Bus
    client: Client
    platform_text: str
    buses: list[Bus] = field(default_factory=list)

    async def events(self, run_id: str) -> list[Event]:
        return [e async for e in self.client.events(run_id=run_id)]

    async def wait_for(self, run_id: str, kinds: set[str], timeout: float = 60.0) -> list[Event]:
        deadline = time.monotonic() + timeout
        while True:
            evs = await self.events(run_id)
            if kinds & {e.type for e in evs}:
                return evs
            if time.monotonic() > deadline:
                raise AssertionError(f"{run_id}: none of {kinds} in {[e.type for e in evs]}")
            await asyncio.sleep(0.1)


StartFn = Callable[[Service], Awaitable[None]]


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("hardening")
    proc, port = natsserver.start(tmp / "nats", log_file=tmp / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    admin = await connect(url, name="bootstrap")
    await bootstrap(admin)
    seed = identity.new_user_seed()
    text = PLATFORM.replace("OUTPUTS", str(tmp / "outputs"))
    await platformstore.put_text(admin, text)
    await platformstore.put_local_user(admin, platformstore.LocalUser("owner", identity.public_key(seed)))
    tasks: list[asyncio.Task[Any]] = []
    services: list[Service] = []
    buses: list[Bus] = []
    for name, start in (("submitter", submitter), ("policy", policy)):
        b = await connect(url, name=name)
        b.user_lookup = runstate.VerifiedUsers(b)
        buses.append(b)
        svc = Service(b)
        await start(svc)
        services.append(svc)
        for loop in svc.loops:
            loop.fetch_timeout = 0.5
        tasks += [asyncio.create_task(lp.run()) for lp in svc.loops]
    cb = await connect(url, name="client")
    cb.seed = seed
    buses.append(cb)
    st = Stack(url, tmp, admin, Client(cb), text, buses)
    try:
        yield st
    finally:
        for svc in services:
            svc.stop()
        await asyncio.wait(tasks, timeout=10)
        for t in tasks:
            t.cancel()
        for b in buses:
            await b.close()
        await admin.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
