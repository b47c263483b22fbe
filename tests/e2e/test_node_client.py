"""A client written in another language submits and follows a run from the published contract alone:
tests/contract/node/submit.mjs (Node.js, only the `nats` npm package) uploads examples/quickstart, signs
``submit.requested`` with the local user's nkey and follows ``run.<ws>.<run>.>`` to ``evidence.sealed``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from taugrid.stack.localuser import login_name
from tests.e2e.conftest import Stack

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "tests" / "contract" / "node"
LIFECYCLE = ["submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.admitted",
             "exec.running", "exec.succeeded", "evidence.sealed"]
# Events a successful run may or may not show, depending on timing (queueing, environment preparation, pod
# progress reports); everything else must be exactly LIFECYCLE.
OPTIONAL = {"admission.queued", "exec.preparing", "exec.progress"}


def test_node_client_submits_a_signed_run_and_follows_it_to_success(stack: Stack) -> None:
    node = shutil.which("node")
    assert node, "node (v20+) is needed: install Node.js (CI's image has it)"
    assert (CLIENT / "node_modules" / "nats").is_dir(), \
        "run `npm ci` in tests/contract/node (`make test` does)"
    env = {**stack.env, "NATS_URL": stack.state()["nats_url"], "TAU_FOLLOW_TIMEOUT_S": "240"}
    proc = subprocess.run([node, str(CLIENT / "submit.mjs"), str(REPO / "examples" / "quickstart")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=CLIENT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert [t for t in types if t not in OPTIONAL] == LIFECYCLE, types
    run_id = events[0]["run"]
    assert all(e["run"] == run_id for e in events)
    assert events[0]["ce_type"] == "io.taugrid.run.submit.requested.v1"
    # the submitter verified the Node-made signature: the local user, by name, on every service event
    accepted = events[types.index("submit.accepted")]["data"]
    assert accepted["user"] == login_name() and accepted["signer"].startswith("U")
    assert {e["user"] for e in events[1:]} == {login_name()}
    # a body leaves out the fields at the defaults the published schema names (issue 27: a first attempt's success
    # seals as digest, head and length alone); a client of the contract reads them from it
    sealed = json.loads((REPO / "docs" / "events.schema.json").read_text())["$defs"]["EvidenceSealed"]["properties"]
    defaults = {name: field["default"] for name, field in sealed.items() if "default" in field}
    assert "terminal_state" not in events[-1]["data"]
    assert {**defaults, **events[-1]["data"]}["terminal_state"] == "succeeded"
    # the Python side sees the same run: succeeded, its source being the snapshot the Node client uploaded
    status = stack.json("status", run_id)
    assert status["state"] == "succeeded"
    logs = stack.tau("logs", run_id, check=True).stdout
    assert f"run {run_id} attempt 1" in logs and "done: final test accuracy" in logs  # train.py from the tar
