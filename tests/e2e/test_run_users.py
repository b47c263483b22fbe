"""On a `tau up` stack started as root with a data dir other users may pass (as root's default, /var/lib/taugrid,
is), a researcher's run runs as its workspace's own OS user (issue 22 item 3): it cannot open the stack's keys
in creds/, any workspace's secrets in secrets/, nor the stack's processes' /proc/<pid>/environ, and its
interpreter is one that user may run: submitted without a pin, from a shell whose python3 that user may not run
(this machine's may be under root's home), the run says which it uses instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import TAU, Stack, write_project

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="runs as per-workspace OS users need root and useradd (CI runs as root)")

PROBE = """import os, sys
def attempt(label, path):
    try:
        open(path, "rb").read()
        print(label, "read")
    except OSError as exc:
        print(label, type(exc).__name__)
data, pids = sys.argv[1], sys.argv[2].split(",")
for name in sys.argv[3:]:
    attempt(name, os.path.join(data, name))
for pid in pids:
    attempt(f"environ {pid}", f"/proc/{pid}/environ")
print("uid", os.getuid(), "python", sys.executable)
"""


def test_a_run_opens_no_key_no_secret_and_no_stack_processs_environment(stack: Stack, tmp_path: Path) -> None:
    state = stack.state()
    assert state["run_as"]["mode"] == "workspace", state["run_as"]
    secrets = stack.data_dir / "secrets"
    fd = os.open(secrets / "other-team.yaml", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # another workspace's
    with os.fdopen(fd, "w") as out:
        out.write("db:\n  password: not-for-default\n")
    targets = [f"creds/{p.name}" for p in sorted((stack.data_dir / "creds").iterdir()) if p.is_file()]
    targets += [f"secrets/{p.name}" for p in sorted(secrets.iterdir())]
    assert "creds/bootstrap.nk" in targets and "creds/user.nk" in targets
    pids = [state["pid"], state["nats_pid"], *(s["pid"] for s in state["services"] if s["pid"])]
    args = [str(stack.data_dir), ",".join(map(str, pids)), *targets]
    cfg = write_project(tmp_path, "probe", PROBE, f"name: probe\nentrypoint: main.py\nargs: {args!r}\n"
                        "compute: {gpus: 0}\n")
    closed = tmp_path / "closed"  # pytest's folders are 0700: no workspace user may enter them
    (closed / "bin").mkdir(parents=True)
    (closed / "bin" / "python3").symlink_to(stack.env.get("TAU_PYTHON") or "/usr/bin/python3")
    unpinned = {k: v for k, v in stack.env.items() if k not in ("TAU_PYTHON", "VIRTUAL_ENV")}
    unpinned["PATH"] = f"{closed / 'bin'}:{unpinned.get('PATH', '')}"
    proc = subprocess.run([*TAU, "run", str(cfg.parent), "--follow"], env=unpinned, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    logs = stack.tau("logs", run_id, check=True).stdout.splitlines()
    refused = [f"{t} PermissionError" for t in targets] + [f"environ {p} PermissionError" for p in pids]
    assert [line for line in logs if line.startswith(("creds/", "secrets/", "environ "))] == refused
    user = next(line for line in logs if line.startswith("uid ")).split()
    assert int(user[1]) != 0 and os.access(user[3], os.X_OK)
    warning = stack.json("status", run_id)["environment"]["warning"]
    assert warning.startswith(f"the submitting interpreter {closed / 'bin' / 'python3'} cannot be run by "
                              "tau-ws-default (") and warning.endswith(f"may not enter it); the run uses {user[3]}")
