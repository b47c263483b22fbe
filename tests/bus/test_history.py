"""HISTORY keeps every run event under one subject a run (issue 27), against a real nats-server.

- A run's events, of five tokens and laned (six), sit under ``h.<ws>.<run>``, the kinds AUDIT keeps under
  ``a.<ws>.<run>`` only, and ``history.run_events`` reads them back from both in RUNS' order, each at its RUNS
  sequence, with its RUNS subject and type; RUNS, an interest stream, holds them until the stages' durables and the
  feeds acked them, then nothing.
- Every kind of run event, in each lane it travels, is copied by exactly one feed (RUNS stores nothing no durable's
  filter matches), and every run subject a service or a person may publish is one of them.
- A bus an earlier release made (RUNS with limits retention, AUDIT one plain source per kept kind): the bootstrap
  copies RUNS' events into HISTORY and reports what it may not change; ``--update`` switches RUNS to interest and
  AUDIT to its feeds, which copy what AUDIT did not hold, once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from nats.js.api import RetentionPolicy, StreamConfig, StreamSource

from taugrid.bus import Bus, auditread, history
from taugrid.bus.bootstrap import audit_drift, audit_notes, bootstrap
from taugrid.bus.topology import AUDIT_FILTERS, AUDIT_KEPT_EVENTS, CONSUMERS, FEEDS, HISTORY_KINDS
from taugrid.core.events import HIGH_LANE, LANED_EVENTS, RUN_EVENTS
from taugrid.core.publishing import PERSON_REQUESTS, SERVICE_PUBLISH, subject_matches
from tests.feeds import AUDIT_FEEDS, HISTORY_FEEDS, fed_by

DAY = 86400.0
# a high-lane run's events as its stages publish them: the first three laned (a sixth token)
RUN = ["submit.requested.high", "submit.accepted.high", "policy.approved.high", "render.applied", "admission.queued",
       "admission.admitted", "exec.preparing", "exec.running", "exec.succeeded", "evidence.sealed"]
OTHER = ["submit.requested", "submit.accepted", "policy.rejected"]  # another run's, interleaved


async def publish(bus: Bus, ws: str, run: str, kind: str) -> int:
    return int((await bus.js.publish(f"run.{ws}.{run}.{kind}", b"{}")).seq)


async def interleaved(bus: Bus, ws: str, run: str, other: str) -> tuple[list[int], list[int]]:
    """``RUN`` of ``run`` and ``OTHER`` of ``other``, published in turn: their RUNS sequences."""
    mine, theirs = [], []
    for i, kind in enumerate(RUN):
        mine.append(await publish(bus, ws, run, kind))
        if i < len(OTHER):
            theirs.append(await publish(bus, ws, other, OTHER[i]))
    return mine, theirs


def read(events: list) -> list[tuple[int, str, str, str, str]]:  # type: ignore[type-arg]
    return [(ev.seq, ev.type, ev.nats_subject, ev.workspace, ev.subject) for ev in events]


def expected(ws: str, run: str, kinds: list[str], seqs: list[int]) -> list[tuple[int, str, str, str, str]]:
    return [(seq, kind.removesuffix(".high"), f"run.{ws}.{run}.{kind}", ws, run)
            for kind, seq in zip(kinds, seqs, strict=True)]


async def held(bus: Bus, stream: str) -> dict[str, int]:
    """The subjects ``stream`` holds, with how many messages each."""
    return dict((await bus.js.stream_info(stream, subjects_filter=">")).state.subjects or {})


async def messages(bus: Bus, stream: str) -> int:
    return int((await bus.js.stream_info(stream)).state.messages)


async def ack_every_stage(bus: Bus) -> int:
    """Read and ack everything the stages' durables on RUNS have pending, as the stages do; how many."""
    acked = 0
    for spec in CONSUMERS.values():
        if spec.stream != "RUNS":
            continue
        psub = await bus.js.pull_subscribe_bind(spec.durable, stream="RUNS")
        try:
            while pending := (await psub.consumer_info()).num_pending:
                for msg in await psub.fetch(pending, timeout=5):
                    await msg.ack_sync()
                    acked += 1
        finally:
            await psub.unsubscribe()
    return acked


async def test_history_holds_every_event_of_a_run_in_runs_order_and_runs_nothing_once_acked(
        private_bus: Bus) -> None:
    bus = private_bus
    assert await bootstrap(bus, replicas=1) == []
    assert await fed_by(bus, "HISTORY") == HISTORY_FEEDS
    info = (await bus.js.stream_info("HISTORY")).config
    assert (info.subjects, info.retention, info.deny_delete, info.deny_purge, info.allow_direct) == (
        None, RetentionPolicy.LIMITS, True, True, True)
    ws, run, other = "hist", f"r-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    mine, theirs = await interleaved(bus, ws, run, other)

    events = await history.run_events(bus, ws, run, through=mine[-1])
    # in RUNS' order at RUNS' sequences, though the laned three came through the other feed
    assert read(events) == expected(ws, run, RUN, mine)
    assert read(await history.run_events(bus, ws, other, through=theirs[-1])) == expected(ws, other, OTHER, theirs)
    # HISTORY holds what AUDIT does not: not the request, the end or the seal (AUDIT's copies are the run's)
    assert await held(bus, "HISTORY") == {f"h.{ws}.{run}": len(RUN) - 3, f"h.{ws}.{other}": 1}
    # AUDIT keeps the kinds it keeps of the same run, under its own one subject a run (its feeds, too, may copy
    # at their own pace: the laned request's may come up later on a fresh bus)
    for _ in range(200):
        if await held(bus, "AUDIT") == {f"a.{ws}.{run}": 3, f"a.{ws}.{other}": 2}:
            break
        await asyncio.sleep(0.02)
    audited = await auditread.run_events(bus, f"run.{ws}.{run}.>")
    assert [(ev.seq, ev.type) for ev in audited] == [
        (mine[0], "submit.requested"), (mine[-2], "exec.succeeded"), (mine[-1], "evidence.sealed")]
    # each read at the time AUDIT stored it, as the direct gets read it: these carry no ce-time, so the store's is
    # their time (a replay of AUDIT once read them with none: a run sealed while AUDIT's feed lagged, so that
    # ``history.run_events`` fell back to it, had its end stored in its bundle without a time)
    direct = {ev.seq: ev for ev in await history.run_events(bus, ws, run, through=mine[-1])}
    assert [ev.time for ev in audited] == [direct[ev.seq].time for ev in audited]
    assert all(abs(ev.stored - direct[ev.seq].stored) < 2e-6 for ev in audited)  # a delivery's is to the microsecond
    assert all(ev.stored > 0 for ev in audited) and audited[1].time.endswith("Z")  # a request's is its own

    # RUNS holds every event until the stages' durables have acked it (the feeds acked theirs already)
    assert await messages(bus, "RUNS") == len(RUN) + len(OTHER)
    assert await ack_every_stage(bus) > 0
    for _ in range(100):  # the feeds' flow-control acks reach RUNS within their heartbeat (1 s)
        if not await messages(bus, "RUNS"):
            break
        await asyncio.sleep(0.05)
    assert await messages(bus, "RUNS") == 0
    assert read(await history.run_events(bus, ws, run)) == expected(ws, run, RUN, mine)  # HISTORY keeps them


async def test_an_earlier_release_s_bus_is_copied_into_history_and_switched_by_update(
        private_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    bus = private_bus
    # what an earlier release made: RUNS with limits retention, AUDIT one plain source of RUNS per kept kind
    await bus.js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], max_age=30 * DAY, allow_direct=True))
    await bus.js.add_stream(StreamConfig(
        name="AUDIT", sources=[StreamSource(name="RUNS", filter_subject=f) for f in AUDIT_FILTERS],
        max_age=365 * DAY, deny_delete=True, deny_purge=True, duplicate_window=1.0))
    ws, old, other = "mig", f"old-{uuid.uuid4().hex[:8]}", f"oth-{uuid.uuid4().hex[:8]}"
    olds, others = await interleaved(bus, ws, old, other)
    kept_old = {f"run.{ws}.{old}.{k}": 1 for k in ("submit.requested.high", "exec.succeeded", "evidence.sealed")}
    kept_other = {f"run.{ws}.{other}.{k}": 1 for k in ("submit.requested", "policy.rejected")}
    for _ in range(100):
        if await messages(bus, "AUDIT") == 5:
            break
        await asyncio.sleep(0.02)
    assert await held(bus, "AUDIT") == {**kept_old, **kept_other}

    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(bus, replicas=1) == []  # AUDIT keeps what it must: no alarm
    # RUNS and AUDIT stay as they were (only the break-glass identity changes a stream), and it says so
    assert "stream RUNS: retention is 'limits', declared 'interest'; not changed" in caplog.text
    assert (await bus.js.stream_info("RUNS")).config.retention == RetentionPolicy.LIMITS
    audit = (await bus.js.stream_info("AUDIT")).config
    [note] = audit_notes(audit)
    assert note.startswith("AUDIT sources RUNS without its feeds (an earlier release made it)") and note in caplog.text
    # HISTORY copied RUNS' events, every run's
    assert read(await history.run_events(bus, ws, old, through=olds[-1])) == expected(ws, old, RUN, olds)
    assert read(await history.run_events(bus, ws, other, through=others[-1])) == expected(ws, other, OTHER, others)

    # a run between this bootstrap and the update: AUDIT's plain sources copy its kept kinds
    mid = f"mid-{uuid.uuid4().hex[:8]}"
    mids = [await publish(bus, ws, mid, kind) for kind in ("submit.requested", "exec.cancelled")]
    for _ in range(100):
        if await messages(bus, "AUDIT") == 7:
            break
        await asyncio.sleep(0.02)
    kept_mid = {f"run.{ws}.{mid}.submit.requested": 1, f"run.{ws}.{mid}.exec.cancelled": 1}
    assert await held(bus, "AUDIT") == {**kept_old, **kept_other, **kept_mid}

    assert await bootstrap(bus, replicas=1, update=True) == []
    assert (await bus.js.stream_info("RUNS")).config.retention == RetentionPolicy.INTEREST
    assert await fed_by(bus, "AUDIT") == AUDIT_FEEDS
    assert audit_notes((await bus.js.stream_info("AUDIT")).config) == []
    assert await audit_drift(bus) == []

    # a run after the update: its feeds copy it under one subject a run; what AUDIT held is not copied again
    new = f"new-{uuid.uuid4().hex[:8]}"
    news = [await publish(bus, ws, new, kind) for kind in ("submit.requested", "cancel.requested", "exec.cancelled")]
    for _ in range(200):
        if await messages(bus, "AUDIT") >= 10:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # anything copied twice would have come by now
    assert await held(bus, "AUDIT") == {**kept_old, **kept_other, **kept_mid, f"a.{ws}.{new}": 3}
    assert [(ev.seq, ev.type) for ev in await auditread.run_events(bus, f"run.{ws}.{old}.>")] == [
        (olds[0], "submit.requested"), (olds[-2], "exec.succeeded"), (olds[-1], "evidence.sealed")]
    assert [(ev.seq, ev.type) for ev in await auditread.run_events(bus, f"run.{ws}.{new}.>")] == [
        (news[0], "submit.requested"), (news[1], "cancel.requested"), (news[2], "exec.cancelled")]
    assert [(ev.seq, ev.type) for ev in await auditread.run_events(bus, f"run.{ws}.{mid}.>")] == [
        (mids[0], "submit.requested"), (mids[1], "exec.cancelled")]
    assert read(await history.run_events(bus, ws, new, through=news[-1])) == expected(
        ws, new, ["submit.requested", "cancel.requested", "exec.cancelled"], news)


def test_every_kind_of_run_event_is_kept_by_exactly_one_feed_and_nothing_publishable_is_kept_by_none() -> None:
    kinds = [f"run.ws.r.{t}" for t in RUN_EVENTS] + [f"run.ws.r.{t}.{HIGH_LANE}" for t in sorted(LANED_EVENTS)]
    for subject in kinds:
        keepers = [feed.durable for feed in FEEDS if any(subject_matches(f, subject) for f in feed.filters)]
        kind = subject.removeprefix("run.ws.r.").removesuffix(f".{HIGH_LANE}")
        want = ("audit" if kind in AUDIT_KEPT_EVENTS else "history") + ("-high" if subject.endswith(HIGH_LANE) else "")
        assert keepers == [want], (subject, keepers)
    assert set(HISTORY_KINDS) == set(RUN_EVENTS) - set(AUDIT_KEPT_EVENTS)
    # what may be published under run.> (the services' table and people's requests) is only these kinds
    patterns = [p for pats in SERVICE_PUBLISH.values() for p in pats if p.startswith("run.")] + list(PERSON_REQUESTS)
    for pattern in patterns:
        parts = pattern.split(".")
        assert parts[:3] == ["run", "*", "*"], pattern
        if parts[-1] == ">":  # a stage's whole family (run.*.*.admission.>): its kinds are the catalogue's
            stage = parts[3]
            assert [t for t in RUN_EVENTS if t.startswith(f"{stage}.")], pattern
        else:
            assert any(subject_matches(pattern, s) for s in kinds), pattern
