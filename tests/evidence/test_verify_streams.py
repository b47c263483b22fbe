"""`tau verify` with AUDIT keeping only what verification needs (issue 27), against real nats-servers: an
intermediate ledger entry is checked against HISTORY (RUNS' events of every kind AUDIT does not keep, one subject a
run) while HISTORY holds the run and against the sealed bundle's events always; the people's requests, the run's end
and its seal against AUDIT, which alone keeps them. A forged intermediate entry fails, saying why, both while HISTORY
holds the run and after HISTORY let it go; one placed before the first event HISTORY holds of the run fails there
while nothing of the run can have left HISTORY."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.js.api import StreamConfig, StreamSource

from taugrid.bus import Bus, auditread, connect
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import Event, run_traceparent
from taugrid.core import contracts as c
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.evidence import store, verify
from taugrid.evidence.bundle import bundle_name
from taugrid.evidence.verify import verify_run
from taugrid_services.evidence.handlers import Evidence
from tests.evidence.test_evidence_service import _events, fed, publish_run
from tests.owners import emit_as_owner

WS, RUN = "vs", "train-vs1"


@pytest.fixture
async def stack(fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> AsyncIterator[tuple[Bus, Bus]]:
    """A private bootstrapped server (this test ages its HISTORY out): a test connection and the evidence
    service's."""
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
    await fed(bus)  # and HISTORY, evidence.sealed among what it holds
    led = await store.read_ledger(bus, WS, RUN)  # its entries from the sealed bundle, checked against the seal
    assert led is not None and led.seal is not None
    return led


async def history_lets_go(bus: Bus) -> None:
    """HISTORY lets every run go, as its max age does after 30 days (purges are denied it): a max age of 1 s,
    waited out, then its own again."""
    config = (await bus.js.stream_info("HISTORY")).config
    await bus.js.update_stream(dataclasses.replace(config, max_age=1.0))
    for _ in range(100):
        if (await bus.js.stream_info("HISTORY")).state.messages == 0:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("HISTORY kept its messages past a max age of 1 s")
    await bus.js.update_stream(config)


def forged(ledger: lg.Ledger, index: int) -> lg.Ledger:
    """``ledger`` with entry ``index``'s payload hash replaced and the chain recomputed from there: a consistent
    chain, as someone able to write the ledger would leave it (stored whole, the form an earlier release kept)."""
    entries, prev = [], lg.GENESIS
    for e in ledger.entries:
        draft = msgspec.structs.replace(e, prev=prev, hash="",
                                        payload_sha256="f" * 64 if e.index == index else e.payload_sha256)
        entries.append(msgspec.structs.replace(draft, hash=lg.entry_hash(draft)))
        prev = entries[-1].hash
    return msgspec.structs.replace(ledger, entries=tuple(entries))


def rewritten_bundle_problems(name: str, *, head: str, sealed_head: str, digest: str,
                              sealed_digest: str) -> list[str]:
    """What ``tau verify`` reports of a bundle rewritten to chain to ``head`` while the seal still pins the original."""
    return [
        f"the sealed bundle's ledger ends at {head[:12]}…, the seal on the bus records the head "
        f"{sealed_head[:12]}… (one of them was rewritten)",
        f"bundle {name} hashes to {digest[:12]}…, sealed as {sealed_digest[:12]}… (the bundle was modified)",
        f"bundle ledger ends at {head[:12]}…, evidence.sealed announced {sealed_head[:12]}…",
    ]


def rewritten_seal_problems(name: str, *, head: str, sealed_head: str, digest: str, sealed_digest: str) -> list[str]:
    """... and with the seal on the bus rewritten to match it: AUDIT's evidence.sealed still names the originals."""
    return [
        f"evidence.sealed announced {sealed_digest[:12]}…, the ledger records {digest[:12]}…",
        f"bundle {name} hashes to {digest[:12]}…, sealed as {sealed_digest[:12]}… (the bundle was modified)",
        f"bundle ledger ends at {head[:12]}…, evidence.sealed announced {sealed_head[:12]}…",
    ]


async def test_a_forged_intermediate_entry_fails_against_history_while_it_holds_the_run_and_the_bundle_after(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    report = await verify_run(bus, RUN)
    # HISTORY: the run's events but its request, its end and its seal, which AUDIT keeps (and HISTORY not again)
    assert (report.problems, report.entries, report.runs_events, report.audit_events) == ([], 6, 4, 3)

    # render.applied (entry 3) is no kind AUDIT keeps: HISTORY, while it holds the run, and the bundle catch it
    bad = forged(led, 3)
    assert lg.verify(bad) == [] and bad.entries[3].type == "render.applied"
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type render.applied/render.applied, payload {'f' * 12}…/{led.entries[3].payload_sha256[:12]}…"
    report = await verify_run(bus, RUN, audit_wait_s=0)
    assert report.problems == [
        f"ledger entry 3 ({RUN}.1.render.applied) differs from HISTORY: {was}",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]

    # HISTORY lets the run go (its max age): AUDIT and the bundle still verify the honest ledger
    await store.update(bus, WS, RUN, lambda _: lg.seal_only(led))
    await history_lets_go(bus)
    report = await verify_run(bus, RUN)
    assert (report.problems, report.runs_events, report.audit_events) == ([], 0, 3)
    # and the forged one still fails, now on the bundle alone
    await store.update(bus, WS, RUN, lambda _: bad)
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]


async def test_a_forged_kept_entry_fails_against_audit_after_history_let_the_run_go(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    await history_lets_go(bus)
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
    assert (report.problems, report.runs_events, report.audit_events) == ([], 4, 7)
    await history_lets_go(bus)
    bad = forged(led, 3)
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type render.applied/render.applied, payload {'f' * 12}…/{led.entries[3].payload_sha256[:12]}…"
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"ledger entry 3 ({RUN}.1.render.applied) differs from AUDIT: {was}",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 3 ({RUN}.1.render.applied) differs from the sealed bundle's event: {was}",
    ]


async def test_the_seal_on_the_bus_pins_the_entries_its_bundle_holds(stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    """The KV keeps the seal alone (issue 27); the entries are the bundle's. Whoever rewrites one of them without
    the other, or both together, fails: the bundle against the seal's digest and head, the seal against AUDIT's
    evidence.sealed, which pins the same digest, head and length."""
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    kept, _ = await store.load(bus, WS, RUN)
    assert kept == lg.seal_only(led) and kept is not None and kept.entries == () and kept.seal is not None
    await history_lets_go(bus)  # the bundle alone vouches for the intermediate events now
    seal, sealed_digest, name = kept.seal, kept.seal.digest, bundle_name(RUN)
    assert led.seal is not None
    led_seal = led.seal

    # the seal's head rewritten alone: the bundle's chain no longer ends at it
    await store.update(bus, WS, RUN, lambda cur: msgspec.structs.replace(
        cur, seal=msgspec.structs.replace(seal, head="e" * 64)))
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"the sealed bundle's ledger ends at {led.head[:12]}…, the seal on the bus records the head "
        f"{'e' * 12}… (one of them was rewritten)"]
    with pytest.raises(store.BundleModified, match="holds another ledger than the sealed one"):
        await store.read_ledger(bus, WS, RUN)

    # its length rewritten alone: the bundle's chain is shorter, and evidence.sealed announced 6
    await store.update(bus, WS, RUN, lambda cur: msgspec.structs.replace(
        cur, seal=msgspec.structs.replace(seal, index=6)))
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        "the sealed bundle's ledger has 6 entries, the seal on the bus records 7",
        "evidence.sealed announced 6 ledger entries, the seal records 7"]
    # the seal pointed at a copy of its bundle under another name: the same bytes, but not what was announced
    other = f"runs/{RUN}-copy/bundle.json"
    stored = await store.read_object(bus, name)
    assert stored is not None
    await store.put_object(bus, other, stored, workspace=WS)
    await store.update(bus, WS, RUN, lambda cur: msgspec.structs.replace(
        cur, seal=msgspec.structs.replace(seal, bundle=other)))
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"evidence.sealed announced the bundle {name}, the seal names {other}"]
    await store.update(bus, WS, RUN, lambda _: kept)
    print("PROBLEMS", (await verify_run(bus, RUN, audit_wait_s=0)).problems)

    # the bundle's ledger rewritten alone (entry 3, render.applied, with a consistent chain and its event record
    # to match): it no longer hashes to the sealed digest, nor ends at the sealed head
    bad = forged(led, 3)
    got = await store.read_bundle(bus, RUN)
    assert got is not None
    _, doc = got
    records = [{**r, "payload_sha256": "f" * 64} if r["id"] == bad.entries[3].event_id else r
               for r in doc["events"]]
    rewritten = lg.canonical({**doc, "events": records, "ledger": {
        "head": bad.head, "entries": [msgspec.to_builtins(e) for e in bad.entries]}})
    digest = lg.sha256(rewritten)
    await store.put_object(bus, name, rewritten, workspace=WS)
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == rewritten_bundle_problems(
        name, head=bad.head, sealed_head=led.head, digest=digest, sealed_digest=sealed_digest)

    # and with the seal rewritten to match it (someone holding the evidence service's credentials, after the
    # fact): AUDIT's evidence.sealed still names the sealed digest and head
    await store.update(bus, WS, RUN, lambda _: lg.seal_only(msgspec.structs.replace(
        bad, seal=msgspec.structs.replace(led_seal, digest=digest))))
    assert await store.read_ledger(bus, WS, RUN) is not None  # consistent on the bus: the KV and the bundle agree
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == rewritten_seal_problems(
        name, head=bad.head, sealed_head=led.head, digest=digest, sealed_digest=sealed_digest)


async def test_a_bundle_keeps_its_chain_as_its_events_and_a_rewritten_event_misses_the_sealed_head(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    """Issue 27: the bundle keeps its events and says its ledger is them (no entries, no head of its own), the
    entries and the head recomputed from them by every reader. An event record rewritten chains to another head
    than the seal's and AUDIT's evidence.sealed; with the seal rewritten to match too, AUDIT still names the sealed
    digest and head."""
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    got = await store.read_bundle(bus, RUN)
    assert got is not None
    _, doc = got
    # counted from the run's derived traceparent, which every event of it carries: no record writes one
    assert doc["ledger"] == {"entries": "run-events"} and all("traceparent" not in r for r in doc["events"])
    assert store.bundle_entries(doc) == list(led.entries) and len(led.entries) == 6
    kept, _ = await store.load(bus, WS, RUN)
    assert kept is not None and kept.seal is not None
    await history_lets_go(bus)  # the bundle alone vouches for the intermediate events now
    name, sealed_digest = bundle_name(RUN), kept.seal.digest

    records = [{**r, "payload_sha256": "f" * 64} if r["type"] == "render.applied" else r for r in doc["events"]]
    head = b.chain_of(records, trace=run_traceparent(RUN))[-1].hash
    rewritten = lg.canonical({**doc, "events": records})
    digest = lg.sha256(rewritten)
    await store.put_object(bus, name, rewritten, workspace=WS)
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == rewritten_bundle_problems(
        name, head=head, sealed_head=led.head, digest=digest, sealed_digest=sealed_digest)
    with pytest.raises(store.BundleModified, match="hashes to"):
        await store.read_ledger(bus, WS, RUN)

    await store.update(bus, WS, RUN, lambda cur: msgspec.structs.replace(
        cur, seal=msgspec.structs.replace(kept.seal, digest=digest, head=head)))
    assert await store.read_ledger(bus, WS, RUN) is not None  # consistent on the bus: the KV and the bundle agree
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == rewritten_seal_problems(
        name, head=head, sealed_head=led.head, digest=digest, sealed_digest=sealed_digest)


async def test_a_bundle_listing_its_entries_as_earlier_releases_wrote_them_still_verifies(
        stack: tuple[Bus, Bus], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bus, evidence = stack
    monkeypatch.setattr(b, "ledger_section", lambda head, entries, records, **_: {
        "head": head, "entries": [msgspec.to_builtins(e) for e in entries]})
    led = await sealed_run(bus, evidence, tmp_path)
    got = await store.read_bundle(bus, RUN)
    assert got is not None and got[1]["ledger"]["entries"] == [msgspec.to_builtins(e) for e in led.entries]
    report = await verify_run(bus, RUN)
    assert (report.problems, report.entries, report.ledger_head) == ([], 6, led.head)


def with_extra(ledger: lg.Ledger, after: int, *, event_id: str, event_type: str) -> lg.Ledger:
    """``ledger`` with an entry someone made up inserted after entry ``after``, at that entry's RUNS sequence (an
    event claimed to precede the next one), the chain and the seal recomputed: a consistent ledger, stored whole."""
    seal = ledger.seal
    assert seal is not None
    made = msgspec.structs.replace(ledger.entries[after], event_id=event_id, type=event_type,
                                   payload_sha256="f" * 64)
    entries, prev = [], lg.GENESIS
    for i, e in enumerate([*ledger.entries[: after + 1], made, *ledger.entries[after + 1:]]):
        draft = msgspec.structs.replace(e, index=i, prev=prev, hash="")
        entries.append(msgspec.structs.replace(draft, hash=lg.entry_hash(draft)))
        prev = entries[-1].hash
    return msgspec.structs.replace(ledger, entries=tuple(entries),
                                   seal=msgspec.structs.replace(seal, index=seal.index + 1))


async def test_an_entry_made_up_before_the_first_event_history_holds_fails_there_while_none_of_the_run_left_it(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    """HISTORY holds none of the run's request (AUDIT keeps it): an intermediate entry claimed between the request
    and the first event HISTORY holds is required there all the same, HISTORY having let nothing go."""
    bus, evidence = stack
    led = await sealed_run(bus, evidence, tmp_path)
    assert led.entries[0].type == "submit.requested"
    made_up = f"{RUN}.1.render.applied.x"
    bad = with_extra(led, 0, event_id=made_up, event_type="render.applied")
    assert lg.verify(bad) == []
    await store.update(bus, WS, RUN, lambda _: bad)
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        f"ledger entry 1 (render.applied, {made_up}) is not in HISTORY",
        "evidence.sealed announced 6 ledger entries, the seal records 7",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 1 (render.applied, {made_up}) is not among the sealed bundle's events",
    ]


async def test_a_history_that_let_go_what_came_before_the_run_vouches_from_the_first_event_it_holds(
        stack: tuple[Bus, Bus], tmp_path: Path) -> None:
    """HISTORY let an earlier run go and its oldest message is now this run's: nothing dates the run's start before
    it, so the run's entries are required there from the first event it holds on (the ones before may have aged
    out); an entry made up before that one fails on the bundle and AUDIT's seal alone."""
    bus, evidence = stack
    await publish_run(bus, WS, "train-vs0", tmp_path / "earlier", log_lines=["epoch 0"])
    await fed(bus)
    await history_lets_go(bus)
    led = await sealed_run(bus, evidence, tmp_path)
    report = await verify_run(bus, RUN)
    assert (report.problems, report.runs_events, report.audit_events) == ([], 4, 3)
    made_up = f"{RUN}.1.render.applied.x"
    await store.update(bus, WS, RUN, lambda _: with_extra(led, 0, event_id=made_up, event_type="render.applied"))
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems == [
        "evidence.sealed announced 6 ledger entries, the seal records 7",
        "bundle ledger is not a prefix of the run's ledger (one of them was rewritten)",
        f"ledger entry 1 (render.applied, {made_up}) is not among the sealed bundle's events",
    ]
    # from the first event HISTORY holds on, an entry is required there as ever
    bad = forged(led, 3)
    await store.update(bus, WS, RUN, lambda _: bad)
    was = f"type render.applied/render.applied, payload {'f' * 12}…/{led.entries[3].payload_sha256[:12]}…"
    assert (await verify_run(bus, RUN, audit_wait_s=0)).problems[0] == \
        f"ledger entry 3 ({RUN}.1.render.applied) differs from HISTORY: {was}"


@pytest.mark.parametrize(("front", "whole"), [
    ((1, 1000.0 - verify.CATCH_UP_S), True),  # its oldest message came before the run's request
    ((7, 1000.0 - verify.CATCH_UP_S), True),  # ... though it let older ones go
    ((7, 1000.0 - verify.CATCH_UP_S + 1), False),  # it let go what came within seconds of the request
    ((1, 1000.0 + verify.CATCH_UP_S), True),  # it let nothing go and was there (its feed just slower)
    ((1, 1000.0 + verify.CATCH_UP_S + 1), False),  # made after the run began (an upgrade): it may lack its start
    ((0, 0.0), False),  # it holds nothing
])
async def test_whether_history_holds_the_whole_run_is_dated_by_audit_s_copy_of_the_request(
        monkeypatch: pytest.MonkeyPatch, front: tuple[int, float], whole: bool) -> None:
    async def history_front(_: object) -> tuple[int, float]:
        return front

    monkeypatch.setattr(verify, "_history_front", history_front)
    held = [Event(id="r.1.render.applied", type="render.applied", source="renderer", subject="r", time="",
                  data=b"", seq=9)]
    audit = verify._Stream(name="AUDIT", events={
        "r.1.submit.requested": verify._Seen("submit.requested", "", 3, stored=1000.0)})
    assert await verify._holds_whole_run(None, held, audit) is whole  # type: ignore[arg-type]
    assert await verify._holds_whole_run(None, held, verify._Stream(name="AUDIT", events={})) is False  # type: ignore[arg-type]
    request = msgspec.structs.replace(held[0], id="r.1.submit.requested", type="submit.requested", seq=3)
    assert await verify._holds_whole_run(None, [request, *held], audit) is True  # type: ignore[arg-type]
