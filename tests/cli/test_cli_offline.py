"""CLI commands that need no running stack, and clean failures when the stack is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TAU = [sys.executable, "-m", "taugrid.cli.main"]


def tau(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", [[], ["run"], ["run", "submit"], ["run", "validate"], ["run", "schema"],
                                     ["status"], ["logs"], ["list"], ["cancel"], ["events"], ["queue"],
                                     ["evidence"], ["verify"], ["up"], ["down"], ["platform", "apply"],
                                     ["platform", "render"], ["platform", "show"]])
def test_every_command_has_help(command: list[str]) -> None:
    proc = tau(*command, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout


def test_validate_and_schema() -> None:
    ok = tau("run", "validate", "examples/quickstart/tau.yaml", "--output", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"valid": True, "name": "quickstart", "engine": "job"}
    schema = json.loads(tau("run", "schema").stdout)
    assert schema["additionalProperties"] is False and "resilience" in schema["properties"]


def test_invalid_config_exits_2_with_every_issue_as_json(tmp_path: Path) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text("name: x\nentrypoint: a.py\nresilience:\n  max_retrys: 2\n")
    proc = tau("run", "validate", str(bad), "--output", "json")
    assert proc.returncode == 2
    issue = json.loads(proc.stdout)["issues"][0]
    assert issue["field"] == "resilience.max_retrys" and issue["line"] == 4 and "max_retries" in issue["message"]


def test_platform_render_emits_valid_kueue_objects() -> None:
    proc = tau("platform", "render", "deploy/platform.yaml")
    assert proc.returncode == 0, proc.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout)]
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"} <= set(kinds)


def test_commands_fail_clearly_when_the_stack_is_down(tmp_path: Path) -> None:
    proc = tau("status", "nope", env={"TAU_NATS_URL": "nats://127.0.0.1:1", "TAU_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 4 and "tau up" in proc.stderr
