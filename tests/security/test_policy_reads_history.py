"""The policy's refusal reads the request the submitter answered back among the run's events
(``services/policy/keylines``, issue 27: RUNS lets the request go once its readers acked it), where AUDIT keeps it
and HISTORY does not, with the policy's own credentials, as a deployment with authentication gives them: a refusal
that cannot read it would be retried rather than answered."""

from __future__ import annotations

import uuid

from taugrid.bus import identity, kv, streams
from taugrid.bus.envelope import Event
from taugrid.config import accepted
from taugrid.config.taujob import load_tau_config_shared
from taugrid.core.contracts import SubmitAccepted, SubmitRequested
from taugrid_services.policy import keylines
from tests.secure_nats import SecureNats

TEXT = "name: lines\nentrypoint: t.py\npolicy:\n  profile: no-such\n"


async def test_the_policy_reads_the_answered_request_back_from_history(secure_nats: SecureNats) -> None:
    run = f"lines-{uuid.uuid4().hex[:12]}"
    alice = await secure_nats.connect("alice")
    submitter = await secure_nats.connect("submitter")
    policy = await secure_nats.connect("policy")
    try:
        alice.seed = identity.new_user_seed()  # signed, as the client signs a request
        seq = await alice.emit(workspace="vision", run_id=run, attempt=1, event_type="submit.requested",
                               payload=SubmitRequested(submission_id="s1", config_text=TEXT, workspace="vision"))
        await kv.create(submitter, "submissions", f"id.{run}", f"vision:{seq}".encode())  # the submitter's claim
        parsed = accepted.record(load_tau_config_shared(TEXT, path="tau.yaml"))
        acc = SubmitAccepted(submission_id="s1", config=parsed.config, config_hash=parsed.config_hash,
                             config_path="tau.yaml")
        answered = Event(id=f"{run}.1.submit.accepted", type="submit.accepted", source="submitter", subject=run,
                         time="", data=b"", workspace="vision")
        lines = await keylines.of_request(policy, answered, acc)
        assert lines == parsed.lines and dict(lines)[("policy", "profile")] == 4
        # read from AUDIT's copy: HISTORY holds none of the run
        assert await streams.history(policy, "HISTORY", f"h.vision.{run}") == []
        assert [ev.seq for ev in await streams.history(policy, "AUDIT", f"a.vision.{run}")] == [seq]
    finally:
        for bus in (alice, submitter, policy):
            await bus.close()
