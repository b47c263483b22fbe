"""Identity through the CLI on the embedded stack: `tau up` made the local user's key, the CLI signs with it,
every event of a run names that user, and a cancel signed by another key is refused with exit 5."""

from __future__ import annotations

import subprocess
from pathlib import Path

from taugrid.bus import identity
from taugrid.stack import localuser
from tests.e2e.conftest import TAU, TEST_PLATFORM, Stack, write_project


def local_user(stack: Stack) -> tuple[str, str]:
    creds = stack.data_dir / "creds" / "user.nk"
    seed = identity.seed_in(creds.read_bytes())
    assert seed is not None
    return localuser.login_name(), identity.public_key(seed)


def test_every_event_of_a_run_names_the_local_user(stack: Stack, tmp_path: Path) -> None:
    name, key = local_user(stack)
    cfg = write_project(tmp_path, "who", "print('hi')\n", "name: who\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    assert stack.wait_state(run_id, {"succeeded", "failed"}, timeout=240)["state"] == "succeeded"
    events = stack.wait_sealed(run_id, timeout=120)
    assert events[0]["short_type"] == "submit.requested" and events[0]["signer"] == key
    assert [(e["short_type"], e["user"]) for e in events[1:]] == [(e["short_type"], name) for e in events[1:]]
    assert stack.json("status", run_id)["user"] == name
    verify = stack.json("verify", run_id)
    assert (verify["ok"], verify["user"], verify["signer"]) == (True, name, key)


def test_a_cancel_by_another_workspace_member_is_refused_with_exit_5(stack: Stack, tmp_path: Path) -> None:
    name, key = local_user(stack)
    bob = identity.new_user_seed()
    bob_creds = tmp_path / "bob.nk"
    bob_creds.write_bytes(b"# bob\n" + bob + b"\n")
    bob_creds.chmod(0o600)
    base = TEST_PLATFORM.replace("{outputs}", str(stack.data_dir / "outputs"))
    people = base.replace("    output_root: ", "    members: [bob]\n    output_root: ") + (
        f"users:\n  - {{name: {name}, nkey: {key}, role: platform-admin}}\n"
        f"  - {{name: bob, nkey: {identity.public_key(bob)}}}\n")
    platform = tmp_path / "platform.yaml"
    platform.write_text(people)
    stack.tau("platform", "apply", str(platform), check=True)
    try:
        cfg = write_project(tmp_path, "keep", "import time\ntime.sleep(120)\n",
                            "name: keep\nentrypoint: main.py\ncompute: {gpus: 0}\n")
        run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
        stack.wait_state(run_id, {"running"}, timeout=120)
        proc = subprocess.run([*TAU, "cancel", run_id], env={**stack.env, "TAU_NATS_CREDS": str(bob_creds)},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 5, proc.stdout + proc.stderr
        assert proc.stderr.strip() == (
            f"error: cancel refused: 'bob' may not cancel run {run_id} of {name!r}: only its submitter, an admin "
            "of workspace 'default' or a platform admin may")
        assert stack.json("status", run_id)["state"] == "running"
        accepted = stack.json("cancel", run_id)
        assert accepted == {"run_id": run_id, "cancel": "accepted", "by": name}
        assert stack.wait_state(run_id, {"cancelled"}, timeout=60)["state"] == "cancelled"
    finally:
        restore = tmp_path / "restore.yaml"
        restore.write_text(base)
        stack.tau("platform", "apply", str(restore), "--prune", check=True)  # bob and the owner go again
