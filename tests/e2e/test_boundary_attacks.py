"""A researcher attacks a colleague's running run on the embedded stack with only her own credentials (issue 22):
stage events forged in the headers of subjects she may publish, an unsigned submission on the victim's run, a
stage subject she may not publish, the services' durable consumers, and the message ids of the victim's last
events taken first on a subject of her own. Each is refused, and the victim's run
ends exactly as it would have: one attempt, succeeded, no answer to any of her messages, sealed and verified as
its submitter's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from taugrid.bus import connect
from taugrid.bus.envelope import headers_for
from taugrid.core.contracts import ExecFinished, PolicyApproved, RecoveryRetrying, ResolvedRun, SubmitRequested
from taugrid.core.errors import PermissionDenied
from tests.e2e.conftest import Stack, write_project

VICTIM = """import os, time
while not os.path.exists({release!r}):  # running until the attacks are over
    time.sleep(0.1)
print("victim finished its own work")
"""


async def _attack(url: str, creds: Path, victim: str) -> None:
    eve = await connect(url, name="eve", creds=creds, max_reconnect_attempts=0)
    try:
        cancel = f"run.default.{victim}.cancel.requested"  # a subject she may publish
        pwned = ResolvedRun(run_id=victim, submission_id="s", workspace="default", namespace="default",
                            name=victim, command=["sh", "-c", "echo pwned"], priority_class="critical")
        for n, (kind, source, body) in enumerate([
            ("policy.approved", "/svc/policy", PolicyApproved(run=pwned)),
            ("exec.failed", "/svc/admission-watcher", ExecFinished(reason="OOMKilled", exit_code=137)),
        ]):
            await eve.guarded(eve.js.publish(cancel, msgspec.json.encode(body), headers=headers_for(
                event_id=f"eve-{n}", event_type=kind, source=source, subject=victim, workspace="default",
                attempt=1, traceparent="")))
        # an unsigned submission on the victim's run: rejecting it would write into the victim's run
        await eve.guarded(eve.js.publish(
            f"run.default.{victim}.submit.requested",
            msgspec.json.encode(SubmitRequested(submission_id="eve", config_text="name: x\n", workspace="default")),
            headers=headers_for(event_id="eve-submit", event_type="submit.requested", source="/client",
                                subject=victim, workspace="default", attempt=1, traceparent="")))
        # the ids the victim's end will carry, taken first on a subject of her own: the stream would drop the
        # genuine events as duplicates (the run stuck running, never sealed) but for the services' check
        for kind in ("exec.succeeded", "evidence.sealed"):
            await eve.guarded(eve.js.publish("run.default.eves-own.cancel.requested", b"{}",
                                             headers={"Nats-Msg-Id": f"{victim}.1.{kind}"}))
        with pytest.raises(PermissionDenied):  # only the recovery service publishes retries
            await eve.guarded(eve.js.publish(f"run.default.{victim}.recovery.retrying",
                                             msgspec.json.encode(RecoveryRetrying(
                attempt=2, reason="x", classification="x", delay_s=0, not_before=0))))
        with pytest.raises(PermissionDenied):  # the projection's durable: everyone's submissions
            await eve.guarded(eve.nc.request("$JS.API.CONSUMER.MSG.NEXT.RUNS.runstate",
                                             json.dumps({"batch": 1, "no_wait": True}).encode(), timeout=2))
        with pytest.raises(PermissionDenied):  # narrowing the evidence durable would leave runs unsealed
            await eve.guarded(eve.js.add_consumer("RUNS", config=ConsumerConfig(
                name="evidence", durable_name="evidence", ack_policy=AckPolicy.EXPLICIT,
                filter_subject="run.default.eve-only")))
    finally:
        await eve.close()


def test_a_researchers_forgeries_leave_a_colleagues_run_as_it_would_have_been(stack: Stack, tmp_path: Path,
                                                                              exchange: Path) -> None:
    creds = tmp_path / "eve.nk"
    stack.tau("admin", "user", "add", "eve", "--workspace", "default", "--out", str(creds), check=True)
    release = exchange / "attacks-over"
    project = write_project(tmp_path, "victim", VICTIM.format(release=str(release)),
                            "name: victim\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    victim = json.loads(stack.tau("run", str(project), "--output", "json", check=True).stdout)["run_id"]
    stack.wait_state(victim, {"running"})
    asyncio.run(_attack(stack.state()["nats_url"], creds, victim))
    release.touch()
    status = stack.wait_state(victim, {"succeeded", "failed", "cancelled", "rejected"})
    events = stack.wait_sealed(victim)
    assert (status["state"], status["attempt"], status["cancel_requested"]) == ("succeeded", 1, False)
    kinds = [e["short_type"] for e in events]
    assert not {"submit.rejected", "exec.failed", "recovery.retrying", "recovery.gave_up", "cancel.accepted",
                "cancel.refused", "exec.cancelled", "policy.rejected"} & set(kinds)
    assert kinds.count("policy.approved") == 1 and kinds.count("render.applied") == 1
    # what she published and the server stored: her unsigned request, read as what its subject says
    theirs = [e for e in events if e["id"].startswith("eve-")]
    assert [(e["short_type"], e["signer"]) for e in theirs] == [("submit.requested", "")]
    assert "victim finished its own work" in stack.tau("logs", victim, check=True).stdout
    verified = stack.tau("verify", victim)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    me = stack.json("whoami")["user"]
    assert stack.json("status", victim)["user"] == me
