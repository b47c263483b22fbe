"""The client sends a config that names only `policy.namespace` to that namespace's workspace, as policy resolves it
(the subject carries the workspace, so it must be chosen before any service answers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from taugrid.bus import platformstore
from taugrid.bus.envelope import Event
from taugrid.client import Client
from tests.inprocess import private_server

REPO = Path(__file__).resolve().parents[2]


async def test_a_config_naming_only_a_namespace_is_submitted_to_its_workspace(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "t.py").write_text("print('hi')\n")
    (project / "tau.yaml").write_text("name: t\nentrypoint: t.py\npolicy: {namespace: team-language}\n")
    async with private_server(tmp_path) as (_, bus):
        client = Client(bus)
        await platformstore.put_text(bus, (REPO / "deploy" / "platform.yaml").read_text())
        run_id = await client.submit(project / "tau.yaml")
        [event] = await stored(client, run_id)
        assert (event.type, event.workspace) == ("submit.requested", "language")
        (project / "tau.yaml").write_text("name: t\nentrypoint: t.py\n")  # no namespace: the default workspace
        other = await client.submit(project / "tau.yaml")
        [event] = await stored(client, other)
        assert event.workspace == "default"


async def stored(client: Client, run_id: str) -> list[Event]:
    """The run's events in any workspace, read back from HISTORY once its feed has copied the submission (a moment
    after RUNS stored it)."""
    for _ in range(200):
        events = [e async for e in client.replay(f"run.*.{run_id}.>")]
        if events:
            return events
        await asyncio.sleep(0.05)
    return []
