"""A private nats-server with the submitter and policy in-process: enough to see what happens to a submission
before anything runs (limits, paths, a bad platform)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taugrid.bus import Bus, identity, platformstore
from taugrid.bus.envelope import Event
from taugrid.client import Client
from tests.inprocess import RunningServices, private_server, wait_for_events
from tests.platforms import lab_platform, workspace
from tests.stages import start_stages

PLATFORM = lab_platform(workspaces=[
    workspace("team-a", output_root="OUTPUTS"),
    workspace("slow", output_root="OUTPUTS", submissions_per_minute=60),
])


@dataclass
class Stack:
    url: str
    tmp: Path
    admin: Bus
    client: Client
    platform_text: str

    async def events(self, run_id: str) -> list[Event]:
        return [e async for e in self.client.events(run_id=run_id)]

    async def wait_for(self, run_id: str, kinds: set[str], timeout: float = 60.0) -> list[Event]:
        return await wait_for_events(self.client, run_id, kinds, timeout)


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("hardening")
    async with private_server(tmp) as (url, admin):
        seed = identity.new_user_seed()
        text = PLATFORM.replace("OUTPUTS", str(tmp / "outputs"))
        await platformstore.put_text(admin, text)
        await platformstore.put_local_user(admin, platformstore.LocalUser("owner", identity.public_key(seed)))
        running = RunningServices(url)
        try:
            await start_stages(running, "submitter", "run-record", "policy")
            yield Stack(url, tmp, admin, await running.client(seed), text)
        finally:
            await running.stop()
