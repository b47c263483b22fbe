"""AUDIT keeps what verification needs of RUNS (issue 27), against a real nats-server: exactly the people's
requests, a run's end and its seal, read back at their RUNS sequences (AUDIT keeps them under one subject a run,
``a.<ws>.<run>``, through its two feeds); RUNS' direct gets still answered by RUNS; the bootstrap's drift check
alarms on a kept kind dropped, never on the filter, and reports an earlier release's mirror of all of RUNS without
an alarm."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from nats.js.api import StreamConfig, StreamSource

from taugrid.bus import Bus, auditread, streams
from taugrid.bus.bootstrap import _covers, audit_drift, bootstrap
from taugrid.bus.topology import AUDIT_FILTERS, AUDIT_KEPT_EVENTS
from taugrid.core.events import TERMINAL_EVENTS
from taugrid.core.publishing import PERSON_REQUESTS
from tests.feeds import AUDIT_FEEDS, fed_by

# a run's subjects as its stages publish them, a high-lane run's laned ones with their sixth token
RUN = ["submit.requested.high", "submit.accepted.high", "policy.approved.high", "render.applied",
       "admission.queued", "admission.admitted", "exec.preparing", "exec.running", "cancel.requested",
       "cancel.accepted", "exec.cancelled", "evidence.sealed"]


async def publish(bus: Bus, ws: str, run: str, kinds: list[str]) -> list[int]:
    return [(await bus.js.publish(f"run.{ws}.{run}.{kind}", b"{}")).seq for kind in kinds]


async def audit_of(bus: Bus, subject: str, count: int) -> list[tuple[str, int]]:
    for _ in range(100):
        got = await auditread.run_events(bus, subject)
        if len(got) >= count:
            return [(ev.type, ev.seq) for ev in got]
        await asyncio.sleep(0.02)
    raise AssertionError(f"AUDIT holds {len(got)} events on {subject}, not {count}")


def test_audit_keeps_the_people_s_requests_every_terminal_event_and_the_seal() -> None:
    assert set(PERSON_REQUESTS) <= set(AUDIT_FILTERS)
    assert {f"run.*.*.{t}" for t in TERMINAL_EVENTS | {"evidence.sealed"}} <= set(AUDIT_FILTERS)
    assert len(AUDIT_FILTERS) == len(AUDIT_KEPT_EVENTS) + 1 == 9  # submit.requested in both lanes


async def test_a_run_s_audit_holds_exactly_its_request_cancellation_end_and_seal_at_runs_sequences(bus: Bus) -> None:
    ws, run = f"au{uuid.uuid4().hex[:6]}", f"r-{uuid.uuid4().hex[:6]}"
    seqs = dict(zip(RUN, await publish(bus, ws, run, RUN), strict=True))
    held = await audit_of(bus, f"run.{ws}.{run}.>", 4)
    assert held == [("submit.requested", seqs["submit.requested.high"]), ("cancel.requested", seqs["cancel.requested"]),
                    ("exec.cancelled", seqs["exec.cancelled"]), ("evidence.sealed", seqs["evidence.sealed"])]
    # RUNS' direct gets are RUNS' own: a mirror would have answered some of them for RUNS ("not found" for every
    # event it did not keep). RUNS still holds them: no stage reads its durables on this bus
    for _ in range(10):
        got = await streams.at_many(bus, "RUNS", list(seqs.values()))
        assert [ev.type if ev else None for ev in got] == [k.removesuffix(".high") for k in RUN]


async def test_the_bootstrap_makes_a_filtered_audit_and_finds_no_drift_in_it(private_bus: Bus) -> None:
    assert await bootstrap(private_bus, replicas=1) == []
    config = (await private_bus.js.stream_info("AUDIT")).config
    assert config.mirror is None and not config.subjects
    # every kept kind, through the two feeds (issue 27: not one plain source per kind any more)
    assert await fed_by(private_bus, "AUDIT") == AUDIT_FEEDS
    assert sorted(f for *_, filters in AUDIT_FEEDS for f in filters) == sorted(AUDIT_FILTERS)
    assert await audit_drift(private_bus) == []
    assert await bootstrap(private_bus, replicas=1) == []


async def test_an_earlier_release_s_mirror_of_all_runs_is_reported_and_no_alarm(
    private_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    await private_bus.js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], max_age=30 * 86400.0))
    await private_bus.js.add_stream(StreamConfig(name="AUDIT", mirror=StreamSource(name="RUNS"),
                                                 max_age=365 * 86400.0, deny_delete=True, deny_purge=True))
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert await audit_drift(private_bus) == []
    assert ("AUDIT mirrors all of RUNS (an earlier release made it): every run event is stored twice (~10 KB a run) "
            "where verification needs only 9 kinds (topology.AUDIT_KEPT_EVENTS). A mirror's settings never change. "
            "To store less: once its events older than RUNS keeps are no longer needed, delete AUDIT with the "
            "break-glass identity and run python -m taugrid.bus.bootstrap, which makes the filtered one (then start "
            "a new anchor file: the old anchors record the old AUDIT's sequences)") in caplog.text
    # its settings stay as they were: a mirror is never re-declared
    assert (await private_bus.js.stream_info("AUDIT")).config.mirror is not None


async def test_an_audit_that_drops_a_kept_kind_is_an_alarm(private_bus: Bus) -> None:
    await private_bus.js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], max_age=30 * 86400.0))
    kept = [f for f in AUDIT_FILTERS if f not in ("run.*.*.evidence.sealed", "run.*.*.cancel.requested")]
    await private_bus.js.add_stream(StreamConfig(
        name="AUDIT", sources=[StreamSource(name="RUNS", filter_subject=f) for f in kept],
        max_age=365 * 86400.0, deny_delete=True, deny_purge=True))
    assert await bootstrap(private_bus, replicas=1) == [
        f"ALARM: AUDIT does not keep run.*.*.cancel.requested, run.*.*.evidence.sealed (it copies {kept} of "
        "RUNS), which `tau verify` checks runs against"]


async def test_a_mirror_filtered_to_part_of_runs_is_an_alarm_for_what_it_drops(private_bus: Bus) -> None:
    await private_bus.js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], max_age=30 * 86400.0))
    await private_bus.js.add_stream(StreamConfig(
        name="AUDIT", mirror=StreamSource(name="RUNS", filter_subject="run.*.*.submit.>"),
        max_age=365 * 86400.0, deny_delete=True, deny_purge=True))
    dropped = [f for f in AUDIT_FILTERS if ".submit." not in f]
    assert await audit_drift(private_bus) == [
        f"does not keep {', '.join(dropped)} (it copies ['run.*.*.submit.>'] of RUNS), which `tau verify` checks "
        "runs against"]


@pytest.mark.parametrize(("wide", "narrow", "covered"), [
    (">", "run.*.*.exec.succeeded", True),
    ("run.>", "run.*.*.submit.requested.high", True),
    ("run.*.*.submit.>", "run.*.*.submit.requested", True),
    ("run.*.*.submit.>", "run.*.*.exec.succeeded", False),
    ("run.*.*.submit.requested", "run.*.*.submit.requested.high", False),
    ("run.ws.*.exec.succeeded", "run.*.*.exec.succeeded", False),  # one workspace is not every run
    ("run.*.*.*.*", "run.*.*.exec.succeeded", True),
    ("run.*.*.exec.succeeded", "run.*.*.exec.succeeded", True),
])
def test_a_filter_covers_a_kept_kind_only_when_it_matches_all_of_its_subjects(
        wide: str, narrow: str, covered: bool) -> None:
    assert _covers(wide, narrow) is covered
