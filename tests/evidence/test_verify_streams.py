"""`tau verify` with AUDIT keeping only what verification needs (issue 27), against real nats-servers: an
intermediate ledger entry is checked against RUNS while RUNS holds the run and against the sealed bundle's events
always; the people's requests, the run's end and its seal against AUDIT. A forged intermediate entry fails, saying
why, both while RUNS holds the run and after RUNS let it go."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.js.api import StreamConfig, StreamSource

from taugrid.bus import Bus, auditread, connect
from taugrid.bus.bootstrap import bootstrap
from taugrid.core import contracts as c
from taugrid.evidence import ledger as lg
from taugrid.evidence import store
from taugrid.evidence.verify import verify_run
from taugrid_services.evidence.handlers import Evidence
from tests.evidence.test_evidence_service import _events, publish_run
from tests.owners import emit_as_owner

WS, RUN = "vs", "train-vs1"


@pytest.fixture
async def stack(fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> AsyncIterator[tuple[Bus, Bus]]:
    """A private bootstrapped server (this test purges its RUNS): a test connection and the evidence service's."""
    url = f"nats://127.0.0.1:{fresh_nats[1]}"
    boot = await connect(url, name="bootstrap")
    assert await bootstrap(boot, replicas=1) == []
    await boot.close()
    bus, evidence = await connect(url, name="test"), await connect(url, name="evidence")
    yield bus, evidence
    await bus.close()
    await evidence.close()


async def sealed_run(bus: Bus, evidence: Bus, out: Path, *, audited: int = 3) -> lg.Ledger:
    await publish_run(bus, WS, RUN, out, log_lines=["epoch 1"])
    await emit_as_owner(bus, workspace=WS, run_id=RUN, attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0))
    terminal = next(ev for ev in await _events(bus, WS, RUN) if ev.type == "exec.succeeded")
    await Evidence(evidence).on_event(terminal)
    for _ in range(100):  # AUDIT sources RUNS asynchronously
        if len(await auditread.run_events(bus, f"run.{WS}.{RUN}.>")) == audited:
            break
        await asyncio.sleep(0.02)
    led, _ = await store.load(bus, WS, RUN)
    assert led is not None and led.seal is not None
    return led


def forged(ledger: lg.Ledger, index: int) -> lg.Ledger:
    """``ledger`` with entry ``index``'s payload hash replaced and the chain recomputed from there: a consistent
    chain, as someone able to write the ledger would leave it."""
    entries, prev = [], lg.GENESIS
    for e in ledger.entries:
        draft = msgspec.structs.replace(e, prev=prev, hash="",
                                        payload_sha256="f" * 64 if e.index == index else e.payload_sha256)
        entries.append(msgspec.structs.replace(draft, hash=lg.entry_hash(draft)))
        prev = entries[-1].hash
    return msgspec.structs.replace(ledger, entries=tuple(entries))


async def test_a_forged_intermediate_entry_fails_against_runs_while_it_holds_the_run_and_the_bundle_after(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    report = await verify_run(bus, RUN)
    assert (report.problems, report.entries, report.runs_events, report.audit_events) == ([], 6, 7, 3)

    # render.applied (entry 3) is no kind AUDIT keeps: RUNS, while it holds the run, and the bundle catch it
    bad = forged(led, 3)
    assert lg.verify(bad) == [] and bad.entries[3].type == "render.applied"
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type render.applied/render.applied, payload {'f' * 12}…/{led.entries[3].payload_sha256[:12]}…"
    report = await verify_run(bus, RUN, audit_wait_s=0)
    assert report.problems == [
        f"ledger entry 3 ({RUN}.1.render.applied) differs from RUNS: {was}",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]

    # RUNS lets the run go (its max age; here a purge): AUDIT and the bundle still verify the honest ledger
    await store.update(bus, WS, RUN, lambda _: led)
    await bus.js.purge_stream("RUNS")
    report = await verify_run(bus, RUN)
    assert (report.problems, report.runs_events, report.audit_events) == ([], 0, 3)
    # and the forged one still fails, now on the bundle alone
    await store.update(bus, WS, RUN, lambda _: bad)
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]


async def test_a_forged_kept_entry_fails_against_audit_after_runs_let_the_run_go(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    await bus.js.purge_stream("RUNS")
    bad = forged(led, 5)  # exec.succeeded, the run's end: AUDIT keeps it
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type exec.succeeded/exec.succeeded, payload {'f' * 12}…/{led.entries[5].payload_sha256[:12]}…"
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"ledger entry 5 ({RUN}.1.exec.succeeded) differs from AUDIT: {was}",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 5 ({RUN}.1.exec.succeeded) differs from the sealed bundle's event: {was}",
    ]


async def test_with_an_earlier_release_s_mirror_every_entry_is_still_checked_against_audit(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    bus, evidence = stack
    # the AUDIT an earlier release made: a mirror of all of RUNS (a mirror's settings never change)
    await bus.js.delete_stream("AUDIT")
    await bus.js.add_stream(StreamConfig(name="AUDIT", mirror=StreamSource(name="RUNS"), max_age=365 * 86400.0,
                                         deny_delete=True, deny_purge=True))
    led = await sealed_run(bus, evidence, tmp_path, audited=7)
    report = await verify_run(bus, RUN)
    assert (report.problems, report.runs_events, report.audit_events) == ([], 7, 7)
    await bus.js.purge_stream("RUNS")
    bad = forged(led, 3)
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type render.applied/render.applied, payload {'f' * 12}…/{led.entries[3].payload_sha256[:12]}…"
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"ledger entry 3 ({RUN}.1.render.applied) differs from AUDIT: {was}",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]
