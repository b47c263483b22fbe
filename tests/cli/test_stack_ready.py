"""`tau up` returns once every service replica has said it is consuming, so a first submission does not sit on
the bus while services are still importing; `tau status --stack` shows the stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taugrid import settings
from taugrid.cli.stack import _starting
from taugrid.service import READY_FILE_ENV, say_ready
from taugrid.stack.scaling import ready_file

TAU = [sys.executable, "-m", "taugrid.cli.main"]


def test_a_replica_is_starting_until_its_ready_file_holds_its_own_pid(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"services": [{"service": "submitter", "replica": 0, "pid": os.getpid()},
                          {"service": "renderer", "replica": 1, "pid": 42},
                          {"service": "policy", "replica": 0, "pid": 43}]}
    # what a service writes once it consumes (taugrid.service.say_ready), at any log level
    monkeypatch.setenv(READY_FILE_ENV, str(ready_file(tmp_path, "submitter", 0)))
    say_ready(settings.current().process.ready_file)
    # an earlier process of the same replica said so, not this one
    ready_file(tmp_path, "renderer", 1).write_text("7")
    assert _starting(tmp_path, state) == ["renderer-1", "policy-0"]
    assert sorted(p.name for p in (tmp_path / "ready").iterdir()) == ["renderer-1", "submitter-0"]  # no temp left


def test_tau_up_at_log_level_warning_returns_once_the_services_consume(tmp_path: Path) -> None:
    """The services log nothing at WARNING when all is well: `tau up` waited its whole 60 s timeout for a log line,
    then warned that every service was still starting."""
    env = {**os.environ, "TAU_DATA_DIR": str(tmp_path), "TAU_LOG_LEVEL": "WARNING"}
    env.pop("TAU_NATS_URL", None)
    try:
        up = subprocess.run([*TAU, "up", "--timeout", "50"], capture_output=True, text=True, env=env, timeout=120)
        assert up.returncode == 0, up.stderr
        assert "still starting" not in up.stderr
        state = json.loads((tmp_path / "stack.json").read_text())
        assert all(ready_file(tmp_path, s["service"], s["replica"]).read_text() == str(s["pid"])
                   for s in state["services"])
    finally:
        subprocess.run([*TAU, "down"], capture_output=True, text=True, env=env, timeout=120)


def test_status_stack_shows_the_stack_and_status_alone_asks_for_a_run(tmp_path: Path) -> None:
    env = {**os.environ, "TAU_DATA_DIR": str(tmp_path), "TAU_NATS_URL": "nats://127.0.0.1:1"}
    down = subprocess.run([*TAU, "status", "--stack"], capture_output=True, text=True, env=env, timeout=60)
    assert (down.returncode, down.stderr) == (
        4, f"error: the stack is not running (data dir {tmp_path}): start it with `tau up`\n")
    bare = subprocess.run([*TAU, "status"], capture_output=True, text=True, env=env, timeout=60)
    assert (bare.returncode, bare.stderr) == (
        2, "error: tau status needs a RUN_ID (see `tau list`), or --stack for the stack's services\n")


def test_ha_on_a_single_server_data_dir_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "nats" / "js").mkdir(parents=True)  # what `tau up` without --ha leaves
    env = {**os.environ, "TAU_DATA_DIR": str(tmp_path)}
    env.pop("TAU_NATS_URL", None)
    proc = subprocess.run([*TAU, "up", "--ha"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {tmp_path} holds a single-server bus (made by `tau up` without --ha); its runs "
                           "would not be in a new cluster's stores: use another data dir for --ha "
                           "(TAU_DATA_DIR=… tau up --ha)\n")
    assert not (tmp_path / "stack.json").exists() and not (tmp_path / "nats" / "n0").exists()
