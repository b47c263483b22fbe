"""AUDIT's and HISTORY's origin header, attacked as a researcher would: the RUNS sequence `tau verify` and the
evidence take from a kept event's ``Nats-Stream-Source`` header (``bus/auditread.py``, ``bus/history.py``) is the
server's word, never a publisher's.

nats-server writes that header when AUDIT or HISTORY sources an event from RUNS, and refuses a publish that carries
one (``message stream source header is not allowed``). Both keep a run's events under one subject a run, so a
reader takes the event's own subject from the header too (``envelope.from_message``): its workspace, run and type
rest on the same refusal.
"""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest
from nats.js.errors import BadRequestError

from taugrid.bus import Bus, auditread, history
from taugrid.bus.envelope import headers_for
from taugrid.bus.replay import replay
from taugrid.core.contracts import SubmitRequested
from tests.secure_nats import SecureNats


async def test_a_researcher_cannot_write_the_origin_audit_readers_take_from_the_source_header(
        secure_nats: SecureNats) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    subject = f"run.vision.{run}.submit.requested"  # alice may publish it: a request in her workspace
    body = msgspec.json.encode(SubmitRequested(submission_id="s", config_text="name: x\n", workspace="vision"))
    headers = headers_for(event_id=f"{run}.1.submit.requested", event_type="submit.requested", source="/client",
                          subject=run, workspace="vision", attempt=1, traceparent="")
    alice: Bus = await secure_nats.connect("alice")
    boot: Bus = await secure_nats.connect("bootstrap")
    try:
        forged = {**headers,
                  "Nats-Stream-Source": f"RUNS 1 run.*.*.submit.requested > run.vision.{run}.exec.succeeded x"}
        with pytest.raises(BadRequestError) as refused:
            await alice.js.publish(subject, body, headers=forged)
        assert (refused.value.err_code, refused.value.description) == (
            10227, "message stream source header is not allowed")

        ack = await alice.js.publish(subject, body, headers=headers)
        # AUDIT sources it from RUNS asynchronously, through its feed, under one subject a run; HISTORY does not
        # copy a kind AUDIT keeps (AUDIT's copy is the run's history for it)
        keyed = f"a.vision.{run}"
        for _ in range(100):
            kept = await replay(boot, stream="AUDIT", subject=keyed)
            if kept:
                break
            await asyncio.sleep(0.02)
        assert [m.subject for m in kept] == [keyed]
        origin = (kept[0].headers or {})["Nats-Stream-Source"].split(" ")
        assert (origin[0].partition(":")[0], origin[1], origin[-2]) == ("RUNS", str(ack.seq), subject)
        assert await replay(boot, stream="HISTORY", subject=f"h.vision.{run}") == []
        assert [(ev.seq, ev.type) for ev in await auditread.run_events(boot, f"run.vision.{run}.>")] == [
            (ack.seq, "submit.requested")]
        assert [(ev.seq, ev.type, ev.nats_subject) for ev in await history.run_events(boot, "vision", run)] == [
            (ack.seq, "submit.requested", subject)]
    finally:
        await alice.close()
        await boot.close()
