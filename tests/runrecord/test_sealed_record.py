"""A sealed run's record against a real nats-server (issue 27): one revision without its history and signer, which
the sealed bundle holds; what ``tau status`` and the portal show of it is what they showed before, but the signer;
late events after the seal (a redelivery, a cancel) neither resurrect nor change it; a record an earlier release
stored, history and all, still reads and folds."""

from __future__ import annotations

import json
import uuid

import msgspec

from taugrid import runrecord
from taugrid.bus import Bus, kv
from taugrid.cli.views import status_json
from taugrid.core import contracts as c
from taugrid.core import wirejson
from taugrid.core.states import RunRecord
from taugrid_services.portal.reads import run_detail
from tests.owners import emit_as_owner
from tests.runrecord.test_projection_order import lifecycle, stored_events

SEALED = c.EvidenceSealed(attempt=1, terminal_state="succeeded", bundle="b", digest="sha256:d", ledger_head="h",
                          entries=6)


async def sealed_run(bus: Bus) -> tuple[str, str, int]:
    """A sealed run's workspace, id and the RUNS sequence of its seal."""
    ws, run = f"rs{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"
    for kind, payload in [*lifecycle(bus, ws, run), ("exec.succeeded", c.ExecFinished(exit_code=0, node="box")),
                          ("evidence.sealed", SEALED)]:
        seal = await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type=kind, payload=payload)
    return ws, run, seal


async def stored_json(bus: Bus, ws: str, run: str) -> tuple[dict[str, object], int]:
    found = await kv.get(bus, runrecord.BUCKET, runrecord.key(ws, run))
    assert found is not None
    return json.loads(found.value), found.revision


async def test_a_sealed_record_keeps_no_history_and_shows_what_it_showed_before(bus: Bus) -> None:
    ws, run, seal = await sealed_run(bus)
    events = await stored_events(bus, ws, run, seal)
    assert [ev.type for ev in events][-2:] == ["exec.succeeded", "evidence.sealed"]
    projector = runrecord.Projector(bus)
    for ev in events[:-1]:
        assert await projector.project(ev)
    before, _ = await runrecord.get(bus, ws, run)
    assert before is not None and [h["seq"] for h in before.history] == [ev.seq for ev in events[:-1]]
    signer = events[1].payload(c.SubmitAccepted).signer
    assert events[1].type == "submit.accepted" and signer and before.signer == signer
    await projector.project(events[-1])
    stored, _ = await stored_json(bus, ws, run)
    assert (stored["state"], stored["evidence_digest"], stored["last_seq"]) == ("succeeded", "sha256:d",
                                                                                events[-1].seq)
    # nor the signer's key, which no reader takes from the record (the bundle's identity holds it)
    assert stored.get("history", []) == [] and "signer" not in stored
    after, _ = await runrecord.get(bus, ws, run)
    assert after is not None and after.signer == ""
    # the record an earlier release kept: this one with the history it dropped, the seal's entry last, and its signer
    earlier = msgspec.structs.replace(after, signer=signer, history=[*before.history, {
        "seq": events[-1].seq, "type": "evidence.sealed", "attempt": 1, "time": events[-1].time, "applied": False}])
    # `tau status --output json` never showed the history; the signer it showed is the bundle's now
    assert {**status_json(after), "signer": signer} == status_json(earlier)
    detail, old_detail = run_detail(after), run_detail(earlier)
    assert (detail.pop("history"), detail.pop("history_in"), detail.pop("signer")) == ([], "evidence", "")
    old_detail.pop("history"), old_detail.pop("history_in"), old_detail.pop("signer")
    assert detail == old_detail  # the portal shows the signer from the bundle (its evidence tab)


async def test_late_events_after_the_seal_neither_resurrect_nor_change_the_record(bus: Bus) -> None:
    ws, run, seal = await sealed_run(bus)
    projector = runrecord.Projector(bus)
    for ev in await stored_events(bus, ws, run, seal):
        await projector.project(ev)
    sealed, revision = await stored_json(bus, ws, run)
    # every event of the run redelivered, the seal among them, by a projector without the record cached
    redelivered = [await runrecord.Projector(bus).project(ev) for ev in await stored_events(bus, ws, run, seal)]
    assert redelivered == [False] * 7 and await stored_json(bus, ws, run) == (sealed, revision)
    # a cancel stored after the seal: folded (not applied to a succeeded run), no history kept, once
    cancelled = await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="cancel.requested",
                                    payload=c.CancelRequested())
    cancel = (await stored_events(bus, ws, run, cancelled))[-1]
    assert cancel.type == "cancel.requested" and not await projector.project(cancel)
    stored, after_cancel = await stored_json(bus, ws, run)
    assert (stored["state"], stored["last_seq"], stored.get("history", []), stored.get("cancel_requested", False),
            after_cancel) == ("succeeded", cancel.seq, [], False, revision + 1)
    assert not await runrecord.Projector(bus).project(cancel)  # its redelivery: nothing written
    assert (await stored_json(bus, ws, run))[1] == after_cancel


async def test_a_sealed_record_an_earlier_release_stored_with_its_history_still_reads_and_folds(bus: Bus) -> None:
    ws, run, seal = await sealed_run(bus)
    events = await stored_events(bus, ws, run, seal)
    old = RunRecord(run_id=run, workspace=ws, state="succeeded", user="ada", name="train",
                    evidence_digest="sha256:d", last_seq=events[-1].seq,
                    history=[{"seq": ev.seq, "type": ev.type, "attempt": 1, "time": ev.time, "applied": True}
                             for ev in events])
    await kv.save(bus, runrecord.BUCKET, runrecord.key(ws, run), wirejson.encode(old), revision=0)
    assert (await runrecord.get(bus, ws, run))[0] == old
    revision = (await stored_json(bus, ws, run))[1]
    assert not await runrecord.Projector(bus).project(events[3])  # a redelivery: nothing written
    assert (await stored_json(bus, ws, run))[1] == revision
    cancelled = await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="cancel.requested",
                                    payload=c.CancelRequested())
    cancel = (await stored_events(bus, ws, run, cancelled))[-1]
    assert not await runrecord.Projector(bus).project(cancel)
    record, _ = await runrecord.get(bus, ws, run)
    assert record is not None  # from its first write on, the sealed record keeps no history
    assert record == msgspec.structs.replace(old, last_seq=cancel.seq, history=[], updated=record.updated)


async def test_a_runs_end_redelivered_after_its_seal_rebuilds_the_record_ended_and_without_history(bus: Bus) -> None:
    """The seal folded before the run's end (``exec.succeeded``'s first projection failed): the record is sealed
    but still running, so the late end is not taken for a redelivery; the record is rebuilt from HISTORY."""
    ws, run, seal = await sealed_run(bus)
    events = await stored_events(bus, ws, run, seal)
    projector = runrecord.Projector(bus)
    for ev in [*events[:-2], events[-1]]:
        await projector.project(ev)
    early, _ = await runrecord.get(bus, ws, run)
    assert early is not None and (early.state, early.evidence_digest, early.history) == ("running", "sha256:d", [])
    assert await projector.project(events[-2])
    stored, _ = await stored_json(bus, ws, run)
    assert (stored["state"], stored["exit_code"], stored["evidence_digest"], stored["last_seq"],
            stored.get("history", [])) == ("succeeded", 0, "sha256:d", events[-1].seq, [])
