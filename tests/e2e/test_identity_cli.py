"""Identity through the CLI on the embedded stack: `tau up` made the local user's key, the CLI signs with it,
every event of a run names that user, and a cancel signed by another key is refused with exit 5."""

from __future__ import annotations

import subprocess
from pathlib import Path

from taugrid.bus import identity
from taugrid.stack import localuser

from tests.e2e.conftest import TAU, Stack, write_project


def local_user(stack: Stack) -> tuple[str, str]:
    creds = stack.data_dir / "creds" / "user.nk"
    seed = identity.seed_in(creds.read_bytes())
    assert seed is not None
    return localuser.login_name(), identity.public_key(seed)


def test_every_event_of_a_run_names_the_local_user(stack: Stack, tmp_path: Path) -> None:
    name, key = local_user(stack)
    cfg = write_project(tmp_path, "who", "print('hi')\n", "name: who\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    events = stack.wait_sealed(run_id, timeout=240)
    assert events[0]["short_type"] == "submit.requested" and events[0]["signer"] == key
    assert [(e["short_type"], e["user"]) for e in events[1:]] == [(e["short_type"], name) for e in events[1:]]
    assert stack.json("status", run_id)["user"] == name
    verify = stack.json("verify", run_id)
    assert (verify["ok"], verify["user"], verify["signer"]) == (True, name, key)


def test_a_cancel_signed_by_another_key_is_refused_with_exit_5(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "keep", "import time\ntime.sleep(120)\n",
                        "name: keep\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    stack.wait_state(run_id, {"running"}, timeout=120)
    stranger = identity.new_user_seed()
    proc = subprocess.run([*TAU, "cancel", run_id], env={**stack.env, "TAU_NKEY_SEED": stranger.decode()},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"error: cancel refused: cancel.requested refused: unknown signer {identity.public_key(stranger)}: the "
        "platform lists no users, so only the local user that `tau up` created is accepted")
    assert stack.json("status", run_id)["state"] == "running"
    accepted = stack.json("cancel", run_id)
    assert accepted == {"run_id": run_id, "cancel": "accepted", "by": local_user(stack)[0]}
    assert stack.wait_state(run_id, {"cancelled"}, timeout=60)["state"] == "cancelled"
