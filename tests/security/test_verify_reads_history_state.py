"""`tau verify` dates a run's start against HISTORY's oldest message (``evidence/verify._holds_whole_run``: whether
HISTORY, which leaves a run's request to AUDIT, can have let any of the run go): a person reads HISTORY's stream
state with their own credentials, as a deployment with authentication gives them, and gets its first sequence and
when it stored that message, not a refusal."""

from __future__ import annotations

import asyncio
import time
import uuid

from taugrid.config import accepted
from taugrid.config.taujob import load_tau_config_shared
from taugrid.core.contracts import SubmitAccepted
from taugrid.evidence import verify
from tests.secure_nats import SecureNats

TEXT = "name: dated\nentrypoint: t.py\n"


async def test_a_person_reads_when_history_stored_its_oldest_message(secure_nats: SecureNats) -> None:
    run = f"dated-{uuid.uuid4().hex[:12]}"
    submitter, alice = await secure_nats.connect("submitter"), await secure_nats.connect("alice")
    try:
        parsed = accepted.record(load_tau_config_shared(TEXT, path="tau.yaml"))
        await submitter.emit(workspace="vision", run_id=run, attempt=1, event_type="submit.accepted",
                             payload=SubmitAccepted(submission_id="s1", config=parsed.config,
                                                    config_hash=parsed.config_hash, config_path="tau.yaml"))
        for _ in range(100):  # HISTORY's feed copies it about a millisecond after RUNS stored it
            first_seq, first_stored = await alice.guarded(verify._history_front(alice))
            if first_seq:
                break
            await asyncio.sleep(0.02)
        assert first_seq >= 1 and 0 < first_stored <= time.time() + 5
    finally:
        await submitter.close()
        await alice.close()
