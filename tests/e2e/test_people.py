"""People on the embedded stack: `tau admin user add` admits a colleague at once (the supervisor follows the
platform and reloads nats-server), `tau admin user remove` refuses them at once; nothing restarts."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from tests.e2e.conftest import TAU, Stack


def _as(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAU_")}
    return subprocess.run([*TAU, *args], env={**env, "TAU_DATA_DIR": str(data_dir)}, capture_output=True,
                          text=True, timeout=60)


def _until(check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.time() + timeout
    while True:
        result = check()
        if result or time.time() > deadline:
            return result
        time.sleep(0.3)


def test_a_colleague_is_admitted_and_revoked_without_restarts(stack: Stack, tmp_path: Path) -> None:
    pids = {s["service"]: s["pid"] for s in stack.state()["services"]}
    me = stack.json("whoami")
    assert me["role"] == "platform-admin" and me.get("local") is True
    added = stack.tau("admin", "user", "add", "gwen", "--workspace", "default", "--out", str(tmp_path / "gwen.nk"),
                      "--output", "json", check=True)
    assert json.loads(added.stdout)["workspaces"] == ["default"]
    home = tmp_path / "gwen-home"
    assert _as(home, "login", "--server", stack.state()["nats_url"], "--creds", str(tmp_path / "gwen.nk"),
               "--no-check").returncode == 0
    who = _until(lambda: (p := _as(home, "whoami", "--output", "json")).returncode == 0 and json.loads(p.stdout))
    assert who and (who["user"], who["role"], who["workspaces"]) == ("gwen", "researcher", ["default"])
    changed = tmp_path / "platform.yaml"  # a change to store (an apply that changes nothing writes nothing)
    changed.write_text((stack.data_dir / "platform.yaml").read_text() + "groups: [{name: gwens-own}]\n")
    assert _as(home, "platform", "apply", str(changed)).returncode == 5

    # gwen reads only her workspace's runs: the stack owner's run elsewhere is neither listed nor found
    project = tmp_path / "project"
    project.mkdir()
    (project / "tau.yaml").write_text("name: scoped\nentrypoint: echo scoped\ncompute: {gpus: 0}\n")
    ours = json.loads(stack.tau("run", str(project), "--workspace", "default", "--output", "json",
                                check=True).stdout)["run_id"]
    theirs = json.loads(stack.tau("run", str(project), "--workspace", "elsewhere", "--output", "json",
                                  check=True).stdout)["run_id"]
    assert _until(lambda: {ours, theirs} <= {r["run_id"] for r in stack.json("list", "--limit", "0")["runs"]})
    listed = json.loads(_as(home, "list", "--limit", "0", "--output", "json").stdout)["runs"]
    assert ours in {r["run_id"] for r in listed} and {r["workspace"] for r in listed} == {"default"}
    missing = _as(home, "status", theirs)
    assert missing.returncode == 3 and f"run {theirs} not found in your workspaces" in missing.stderr

    stack.tau("admin", "user", "remove", "gwen", check=True)
    refused = _until(lambda: (p := _as(home, "whoami")).returncode == 5 and p)
    assert refused and "authorization violation" in refused.stderr
    assert {s["service"]: s["pid"] for s in stack.state()["services"]} == pids  # no service restarted
