"""From outside, on a `tau up` stack: a workspace secret reaches only its run's processes (no file under the data
dir but the secrets file itself, no other process environment), and `tau verify --anchor` checks a real run against
the signed anchors the stack writes outside the bus, and fails once its ledger is rewritten."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import msgspec

from taugrid.bus import connect, kv
from taugrid.evidence import ledger as lg
from taugrid.evidence import store
from tests.e2e.conftest import Stack, write_project

SCRIPT = """import hashlib, os, pathlib, time
out = pathlib.Path(os.environ["TAU_OUTPUT_DIR"])
out.mkdir(parents=True, exist_ok=True)
print("token", os.environ["HF_TOKEN"])
print("sha", hashlib.sha256(os.environ["HF_TOKEN"].encode()).hexdigest())
(out / "pid").write_text(str(os.getpid()))
deadline = time.time() + 30  # running until the test has looked at every process, however slow the machine
while not (out / "release").exists() and time.time() < deadline:
    time.sleep(0.1)
"""


def holders(value: bytes) -> set[int]:
    """Pids whose environment holds ``value`` (those of this OS user: the others are unreadable)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if value in (proc / "environ").read_bytes():
                    found.add(int(proc.name))
            except OSError:
                continue
    return found


def test_a_secret_reaches_only_its_run_and_never_disk_or_other_processes(stack: Stack, tmp_path: Path) -> None:
    value = f"hf_{uuid.uuid4().hex}"
    secrets = stack.data_dir / "secrets" / "default.yaml"
    secrets.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"hf-credentials:\n  token: {value}\n")
    config = write_project(tmp_path, "secretive", SCRIPT, "name: secretive\nentrypoint: main.py\n"
                           "runtime:\n  env_secret: {HF_TOKEN: 'hf-credentials:token'}\n")
    run_id = stack.tau("run", str(config), check=True).stdout.splitlines()[0].strip()
    record = stack.wait_state(run_id, {"running", "succeeded", "failed"}, timeout=120)
    assert record["state"] == "running", record
    pid_file = stack.data_dir / "outputs" / "default" / run_id / "pid"
    deadline = time.time() + 30
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert pid_file.exists()
    assert holders(value.encode()) == {int(pid_file.read_text())}
    (pid_file.parent / "release").touch()  # looked: the run may end
    stack.wait_sealed(run_id, timeout=120)
    logs = stack.tau("logs", run_id, check=True).stdout.splitlines()
    assert "token [REDACTED]" in logs
    assert f"sha {hashlib.sha256(value.encode()).hexdigest()}" in logs
    leaked = [str(p) for p in stack.data_dir.rglob("*")
              if p.is_file() and p != secrets and value.encode() in p.read_bytes()]
    assert leaked == []
    assert not list((stack.data_dir / "pods").glob(f"{run_id}-*"))  # removed once sealed


def test_tau_verify_anchor_passes_and_fails_after_a_rewrite(stack: Stack, tmp_path: Path) -> None:
    config = write_project(tmp_path, "anchored", "print('anchored')\n", "name: anchored\nentrypoint: main.py\n")
    run_id = stack.tau("run", str(config), check=True).stdout.splitlines()[0].strip()
    stack.wait_sealed(run_id, timeout=120)
    anchors = stack.data_dir / "anchors" / "ledger.jsonl"
    deadline = time.time() + 30
    while time.time() < deadline:  # the stack anchors every 3 s here (TAU_ANCHOR_INTERVAL_S)
        lines = [json.loads(line) for line in anchors.read_text().splitlines()] if anchors.exists() else []
        if any(f"default/{run_id}" in d["runs"] and d["runs"][f"default/{run_id}"]["digest"] for d in lines):
            break
        time.sleep(0.5)
    assert oct(anchors.stat().st_mode & 0o777) == "0o600"
    ok = stack.tau("verify", run_id, "--anchor", str(anchors), "--output", "json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["ok"] is True

    # rewrite the run's ledger into another consistent chain (what a ledger writer could do) and verify again
    asyncio.run(rewrite_ledger(stack, run_id))
    bad = stack.tau("verify", run_id, "--anchor", str(anchors), "--output", "json")
    assert bad.returncode == 1
    problems = json.loads(bad.stdout)["problems"]
    # the first anchor that covered the sealed run contradicts the rewritten ledger (later anchors, taken after the
    # rewrite, record the new head: every anchor is checked)
    [from_anchor] = [p for p in problems if ", the anchor of " in p]
    assert from_anchor.startswith("ledger entry ") and from_anchor.endswith("(history was rewritten)")


async def rewrite_ledger(stack: Stack, run_id: str) -> None:
    url = json.loads((stack.data_dir / "stack.json").read_text())["nats_url"]
    bus = await connect(url, name="attacker", creds=stack.data_dir / "creds" / "bootstrap.nk")
    try:
        sealed = await store.find(bus, run_id)
        assert sealed is not None and sealed.in_bundle  # the KV keeps the seal alone (issue 27)
        ledger = await store.with_entries(bus, sealed)  # the entries, from the bundle the seal names
        forged = lg.Ledger(run_id=ledger.run_id, workspace=ledger.workspace)
        for e in ledger.entries:
            forged = lg.append(forged, _Forged(e))
        forged = msgspec.structs.replace(forged, seal=ledger.seal)
        assert lg.verify(forged) == [] and forged.head != ledger.head
        await kv.put(bus, "ledger", f"run.{ledger.workspace}.{run_id}", lg.encode(forged))
    finally:
        await bus.close()


class _Forged:
    """An event of the run as the attacker would have it: the same attributes, another payload."""

    def __init__(self, entry: lg.Entry) -> None:
        self.id, self.type, self.source, self.subject = entry.event_id, entry.type, entry.source, ""
        self.time, self.data, self.attempt = entry.time, b'{"forged":true}', entry.attempt
        self.traceparent, self.seq = entry.traceparent, entry.seq
