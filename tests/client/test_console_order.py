"""``Client.console``: a pod's last log lines come before the event that says it ended, though RUNS and LOGS are
read by two consumers (a real nats-server; the events are published as the services publish them)."""

from __future__ import annotations

import time
import uuid

from taugrid.bus import Bus
from taugrid.client import Client
from taugrid.core.contracts import EvidenceSealed, ExecFinished, LogChunk
from taugrid.core.events import log_subject, run_subject
from taugrid.core.ids import new_run_id

LINES = 300


async def publish_run(bus: Bus, run_id: str, *, lines: int) -> None:
    """A failed attempt as the local cluster reports it: its output stored first, then its end, then the seal."""
    for i in range(lines):
        chunk = LogChunk(run_id=run_id, attempt=1, pod=f"{run_id}-a1-0", seq=i, lines=[f"line {i}"])
        await bus.publish(log_subject("ws", run_id, 1), chunk, event_type="chunk", ce_subject=run_id,
                          msg_id=f"{run_id}.log.{i}", workspace="ws", family="log")
    failed = ExecFinished(exit_code=1, reason="Error", message="ValueError: boom")
    await bus.publish(run_subject("ws", run_id, "exec.failed"), failed, event_type="exec.failed", ce_subject=run_id,
                      msg_id=f"{run_id}.failed", workspace="ws")
    sealed = EvidenceSealed(attempt=1, terminal_state="failed", bundle="b", digest="d", ledger_head="h", entries=2)
    await bus.publish(run_subject("ws", run_id, "evidence.sealed"), sealed, event_type="evidence.sealed",
                      ce_subject=run_id, msg_id=f"{run_id}.sealed", workspace="ws")


async def console_of(bus: Bus, run_id: str) -> list[str]:
    client = Client(bus)
    client._workspaces[run_id] = "ws"  # the run's record is not needed to read its subjects
    return [item.lines[0] if isinstance(item, LogChunk) else item.type
            async for item in client.console(run_id, linger=0.3)]


async def test_the_last_lines_come_before_the_failure_that_ends_the_pod(bus: Bus) -> None:
    run_id = new_run_id("order", uuid.uuid4().hex)
    await publish_run(bus, run_id, lines=LINES)
    seen = await console_of(bus, run_id)
    assert seen == [*(f"line {i}" for i in range(LINES)), "exec.failed", "evidence.sealed"]


async def test_a_run_without_output_is_not_held(bus: Bus) -> None:
    run_id = new_run_id("quiet", uuid.uuid4().hex)
    await publish_run(bus, run_id, lines=0)
    started = time.monotonic()
    assert await console_of(bus, run_id) == ["exec.failed", "evidence.sealed"]
    assert time.monotonic() - started < 3.0  # nothing to wait for: well under the 5 s hold limit
