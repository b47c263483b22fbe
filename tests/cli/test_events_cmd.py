"""`tau events --output json` against a real nats-server: the stored history, byte for byte as nats-py's own
reading gives it (odd headers, a large message), written by a process that never loads the run-config or
platform models."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import Bus, history, kv, rawmsgs, replay
from taugrid.cli.views import event_json_lines
from taugrid.core.contracts import CancelRequested, ExecRunning
from taugrid.core.states import RunRecord

NOT_LOADED = ("pydantic", "taugrid.config.taujob", "taugrid.config.platform", "taugrid.runrecord")


async def test_tau_events_prints_what_nats_py_reads_and_loads_no_models(
        bus: Bus, bootstrapped: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    for i in range(30):
        last = await bus.emit(workspace=ws, run_id=f"{ws}-r{i}", attempt=1, event_type="exec.running",
                              payload=ExecRunning(node="n", pod=f"p{i}", environment={"python": "3.12"}))
    big = await bus.emit(workspace=ws, run_id=f"{ws}-big", attempt=1, event_type="cancel.requested",
                         payload=CancelRequested(reason="x" * 200_000))
    # HISTORY holds the last exec.running, hence every one before it (one feed copies RUNS' five-token events of
    # its kinds in order), and AUDIT the cancellation (which HISTORY does not copy: its feed goes at its own pace)
    await history.run_events(bus, ws, f"{ws}-r29", through=last)
    await history.run_events(bus, ws, f"{ws}-big", through=big)
    monkeypatch.setattr(rawmsgs, "_CHECKED", False)  # the reference: nats-py's Msg, as any subscriber reads
    expected = event_json_lines([ev async for ev in replay.follow(bus, "run.>")])
    monkeypatch.undo()
    env = {**os.environ, "TAU_NATS_URL": bootstrapped, "TAU_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-X", "importtime", "-m", "taugrid.cli.main", "events", "--output", "json"],
        capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == expected
    assert f'"workspace":"{ws}"'.encode() in done.stdout
    loaded = {line.rsplit(b"|", 1)[-1].strip().decode() for line in done.stderr.splitlines()}
    assert not loaded & set(NOT_LOADED)


async def test_tau_events_of_a_run_history_no_longer_holds_says_where_its_events_are(
        bus: Bus, bootstrapped: str, tmp_path: Path) -> None:
    ws, run = f"w{uuid.uuid4().hex[:6]}", f"old-{uuid.uuid4().hex[:6]}"
    record = RunRecord(run_id=run, workspace=ws, state="succeeded", created=1.0, updated=2.0, user="ann")
    await kv.put(bus, "run_state", f"run.{ws}.{run}", msgspec.json.encode(record))  # its events aged out of HISTORY
    env = {**os.environ, "TAU_NATS_URL": bootstrapped, "TAU_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "taugrid.cli.main", "events", "--run", run],
                                   capture_output=True, env=env, timeout=120)
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.decode().strip() == (
        f"run {run}: HISTORY no longer holds its events (they are kept for retention.runs.max_age). Its sealed "
        f"evidence holds every one of them: `tau evidence {run}`; AUDIT keeps its requests, its end and its seal "
        f"for longer: `tau verify {run}` checks them")
