"""`tau up` returns once every service replica has said it is consuming, so a first submission does not sit on
the bus while services are still importing; `tau status --stack` shows the stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from taugrid.cli.stack import _starting

TAU = [sys.executable, "-m", "taugrid.cli.main"]


def test_a_replica_is_starting_until_its_log_says_it_started_with_its_own_pid(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    state = {"services": [{"service": "submitter", "replica": 0, "pid": 41},
                          {"service": "renderer", "replica": 1, "pid": 42},
                          {"service": "policy", "replica": 0, "pid": 43}]}
    (tmp_path / "logs" / "submitter-0.log").write_text(
        "2026-11-30 14:50:51,293 submitter[41] INFO taugrid.service: submitter started (pid 41) with 2 consumer(s)\n")
    # an earlier process of the same replica said so, not this one
    (tmp_path / "logs" / "renderer-1.log").write_text("renderer started (pid 7) with 1 consumer(s)\n")
    assert _starting(tmp_path, state) == ["renderer-1", "policy-0"]


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
