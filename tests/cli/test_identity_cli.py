"""tau login / whoami / admin user add|remove|list against a real nats-server with authentication on."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from taugrid.config.platform import load_platform
from taugrid.stack import auth
from tests.secure_nats import SecureNats

TAU = [sys.executable, "-m", "taugrid.cli.main"]
PLATFORM = """
local_queues: [{name: q, namespace: ns, cluster_queue: cq}]
cluster_queues: [{name: cq}]
workspaces:
  - {name: vision, namespace: ns, local_queue: q}
  - {name: language, namespace: ns, local_queue: q}
"""


def tau(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("TAU_")}, **env})


def test_admin_issues_credentials_that_work_until_removed(secure_nats: SecureNats, tmp_path: Path) -> None:
    carol = {"TAU_NATS_URL": secure_nats.url, "TAU_NATS_CREDS": str(secure_nats.creds("carol")),
             "TAU_DATA_DIR": str(tmp_path / "carol")}
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    # --prune: exactly this platform, whoever an earlier test of the session left in the stored one
    assert tau("platform", "apply", "platform.yaml", "--prune", env=carol, cwd=tmp_path).returncode == 0

    added = tau("admin", "user", "add", "erin", "-w", "vision", "--output", "json", env=carol, cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    result = json.loads(added.stdout)
    creds_file = tmp_path / "erin.nk"
    assert result["creds"] == "erin.nk" and result["workspaces"] == ["vision"]
    assert stat.S_IMODE(creds_file.stat().st_mode) == 0o600
    assert tau("admin", "user", "add", "erin", env=carol, cwd=tmp_path).returncode == 2  # never two keys silently
    assert tau("admin", "user", "add", "finn", "-w", "nowhere", "--out", "f.nk", env=carol,
               cwd=tmp_path).returncode == 3
    listed = json.loads(tau("admin", "user", "list", "--output", "json", env=carol, cwd=tmp_path).stdout)
    assert [(u["user"], u["role"], u["workspaces"]) for u in listed] == [("erin", "researcher", ["vision"])]

    # What `tau up`'s supervisor does on the new revision: the server admits the platform's people.
    got = json.loads(tau("platform", "show", "--output", "json", env=carol, cwd=tmp_path).stdout)
    platform = load_platform(json.dumps(got["platform"]))
    people = auth.people(platform, local_admin=None)
    secure_nats.set_people([*secure_nats.people, *people])

    erin = {"TAU_DATA_DIR": str(tmp_path / "erin")}
    login = tau("login", "--server", secure_nats.url, "--creds", str(creds_file), "--output", "json", env=erin,
                cwd=tmp_path)
    assert login.returncode == 0, login.stderr
    assert json.loads(login.stdout)["public_key"] == result["public_key"]
    me = json.loads(tau("whoami", "--output", "json", env=erin, cwd=tmp_path).stdout)
    assert (me["user"], me["role"], me["workspaces"]) == ("erin", "researcher", ["vision"])
    # Submitting into a workspace she is not a member of is refused in one sentence, before any publish.
    project = tmp_path / "proj"
    project.mkdir()
    (project / "tau.yaml").write_text("name: t\nentrypoint: t.py\n")
    (project / "t.py").write_text("print('hi')\n")
    outsider = tau("run", str(project), "--workspace", "language", env=erin, cwd=tmp_path)
    assert outsider.returncode == 5, outsider.stderr
    assert outsider.stderr.splitlines() == [
        "error: erin is not a member of workspace language (theirs: vision): submit into one of them with "
        "--workspace NAME, or ask a platform admin to add them"]
    # A researcher may not administer users.
    denied = tau("admin", "user", "remove", "erin", env=erin, cwd=tmp_path)
    assert denied.returncode == 5 and "kv.platform" in denied.stderr

    removed = tau("admin", "user", "remove", "erin", "--output", "json", env=carol, cwd=tmp_path)
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] is True
    secure_nats.set_people([p for p in secure_nats.people if p.name != "erin"])
    refused = tau("whoami", env=erin, cwd=tmp_path)
    assert refused.returncode == 5 and "authorization violation" in refused.stderr
    assert tau("admin", "user", "remove", "erin", env=carol, cwd=tmp_path).returncode == 3


def test_login_refuses_a_file_without_a_seed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.nk"
    bad.write_text("not a seed\n")
    proc = tau("login", "--server", "nats://127.0.0.1:1", "--creds", str(bad), env={"TAU_DATA_DIR": str(tmp_path)},
               cwd=tmp_path)
    assert proc.returncode == 2 and "holds no NATS user seed" in proc.stderr


