"""The evidence service against a real nats-server: ledger, seal exactly once, bundle contents, verify_run."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from taugrid.bus import Bus, auditread, connect, history, identity
from taugrid.bus import manifests as stored_manifests
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.topology import AUDIT_STREAM, CONSUMERS, FEEDS, HISTORY_STREAM, ConsumerSpec
from taugrid.core import contracts as c
from taugrid.core import wirejson
from taugrid.core.events import TERMINAL_EVENTS, log_subject
from taugrid.evidence import bases, packing, store
from taugrid.evidence import ledger as lg
from taugrid.evidence.bundle import INLINE_LOG_BYTES, bundle_name
from taugrid.evidence.verify import verify_run
from taugrid.render import canonical_json, manifest_digest
from taugrid_services.evidence.handlers import Evidence
from tests.owners import emit_as_owner

TAU_YAML = "name: train\nengine: job\nentrypoint: train.py\ncompute:\n  gpus: 1\n"


MANIFESTS = [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "RUN-a1", "namespace": "ns-WS"}}]


def manifests_of(ws: str, run: str) -> list[dict[str, object]]:
    """The manifests ``publish_run`` renders for ``run`` of workspace ``ws``."""
    return msgspec.json.decode(msgspec.json.encode(MANIFESTS).replace(b"RUN", run.encode()).replace(b"WS", ws.encode()))


async def publish_run(bus: Bus, ws: str, run: str, out: Path, *, log_lines: list[str], inline: bool = False) -> None:
    """A realistic run up to exec.running, with its logs on LOGS; the submission is signed, as the client does.
    Its manifests are stored by digest, as the renderer does (``bus/manifests.py``); ``inline``: carried on
    ``render.applied`` instead, as an earlier release did."""
    bus.seed = identity.new_user_seed()
    resolved = c.ResolvedRun(
        run_id=run,
        submission_id="sub-1",
        workspace=ws,
        namespace=f"ns-{ws}",
        name="train",
        entrypoint="train.py",
        image="python:3.12",
        output_dir=str(out / "output"),
        checkpoint_dir=str(out / "ckpt"),
        source_object=f"sources/{run}.tar",
        source_digest="sha256:abc",
        config_hash="cfg123",
        platform_revision=7,
    )
    manifests = manifests_of(ws, run)
    digest = manifest_digest(manifests)
    if not inline:
        assert await stored_manifests.put(bus, ws, run, canonical_json(manifests)) == digest
    steps: list[tuple[str, msgspec.Struct]] = [
        (
            "submit.requested",
            c.SubmitRequested(
                submission_id="sub-1",
                config_text=TAU_YAML,
                workspace=ws,
                source_object=f"sources/{run}.tar",
                source_digest="sha256:abc",
                user="ada",
            ),
        ),
        (
            "submit.accepted",
            c.SubmitAccepted(
                # as this release's submitter writes it: no config_hash (the policy's is the resolved run's)
                submission_id="sub-1", config={"name": "train"}, config_text=TAU_YAML,
                user="ada", signer=identity.public_key(bus.seed),
            ),
        ),
        ("policy.approved", c.PolicyApproved(run=resolved, platform_revision=7)),
        (
            "render.applied",
            c.RenderApplied(
                attempt=1,
                backend="local",
                kind="Job",
                object_name=f"{run}-a1",
                manifests=manifests if inline else [],
                digest=digest,
            ),
        ),
        ("exec.running", c.ExecRunning(node="box", pod=f"{run}-a1-0", pid=42)),
    ]
    for kind, payload in steps:
        await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type=kind, payload=payload)
    per_chunk = max(1, len(log_lines) // 2)
    for seq, start in enumerate(range(0, len(log_lines), per_chunk)):
        chunk = c.LogChunk(
            run_id=run, attempt=1, pod=f"{run}-a1-0", seq=seq, lines=log_lines[start : start + per_chunk]
        )
        await bus.publish(
            log_subject(ws, run, 1),
            chunk,
            event_type="log.chunk",
            ce_subject=run,
            msg_id=f"{run}.1.log.{seq}",
            workspace=ws,
            family="log",
        )


async def drain(bus: Bus, durable: str, ws: str, until, made: list[Evidence] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Run the evidence handler on its own durable (as the service would) until ``until()`` holds; the
    handler's instance is appended to ``made``."""
    # the service's filter (its terminal events), narrowed to this test's workspace
    filters = [f.replace("run.*.", f"run.{ws}.", 1) for f in CONSUMERS["evidence"].filters]
    await ensure_consumer(bus, ConsumerSpec(durable, "RUNS", filters, ack_wait=5))
    # Its own connection, closed without draining: ConsumerLoop leaves its pull subscription open and
    # draining that waits out the 5 s drain timeout.
    own = await connect(os.environ["TAU_NATS_URL"], name="evidence")
    evidence = Evidence(own)
    if made is not None:
        made.append(evidence)
    loop = ConsumerLoop(own, stream="RUNS", durable=durable, handler=evidence.on_event, fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    try:
        for _ in range(150):
            if await until():
                break
            await asyncio.sleep(0.05)
    finally:
        loop.stopping.set()
        await task
        await own.nc.close()


async def sealed_events(bus: Bus, ws: str, run: str) -> list[Event]:
    return [ev for ev in await _events(bus, ws, run) if ev.type == "evidence.sealed"]


def announced(ws: str, run: str, bus: Bus):  # type: ignore[no-untyped-def]
    async def check() -> bool:  # evidence.sealed is on the bus, the last step of a seal
        return bool(await sealed_events(bus, ws, run))

    return check


async def test_run_is_sealed_once_with_a_verifiable_bundle(bus: Bus, tmp_path: Path) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "metrics-000.jsonl").write_text('{"step":1,"loss":0.5}\n')
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step-1.pt").write_bytes(b"\0" * 1000)
    await publish_run(bus, ws, run, tmp_path, log_lines=["epoch 1", "loss 0.5", "done"])
    await emit_as_owner(
        bus,
        workspace=ws,
        run_id=run,
        attempt=1,
        event_type="exec.succeeded",
        payload=c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0),
    )

    made: list[Evidence] = []
    await drain(bus, f"evidence-{ws}", ws, announced(ws, run, bus), made)
    # Memory stays flat over a long run: the service keeps nothing per run.
    assert list(vars(made[0])) == ["bus"]

    sealed = await sealed_events(bus, ws, run)
    assert len(sealed) == 1
    payload = sealed[0].payload(c.EvidenceSealed)
    assert (payload.terminal_state, payload.attempt, payload.entries) == ("succeeded", 1, 6)
    # the usual bundle name is not stored (RUNS and AUDIT), and reads back as the run's; nor are the first attempt
    # and "succeeded", the defaults
    assert (payload.bundle, payload.bundle_of(run)) == ("", bundle_name(run))
    assert list(msgspec.json.decode(sealed[0].data)) == ["digest", "ledger_head", "entries"]

    report = await verify_run(bus, run)
    assert report.problems == [] and report.ok and report.digest == payload.digest
    # AUDIT holds what verification needs of the run's events (its request, its end, evidence.sealed), HISTORY the
    # rest, not those a second time
    assert (report.entries, report.runs_events, report.audit_events) == (6, 4, 3)
    audited = await auditread.run_events(bus, f"run.{ws}.{run}.>")
    assert [ev.type for ev in audited] == ["submit.requested", "exec.succeeded", "evidence.sealed"]
    runs_seq = {ev.id: ev.seq for ev in await _events(bus, ws, run)}
    assert [ev.seq for ev in audited] == [runs_seq[ev.id] for ev in audited]  # under their RUNS sequences

    data, doc = await store.read_bundle(bus, run)  # type: ignore[misc]
    assert lg.sha256(data) == payload.digest
    # stored compressed against the workspace's base (``bases.py``); the digest is the canonical JSON's
    stored = await store.read_object(bus, bundle_name(run))
    assert stored is not None and packing.base_of(stored).startswith(f"bases/{ws}/")
    assert await bases.unpack(bus, stored) == data and len(stored) < len(data) // 2
    assert doc["config"]["text"] == TAU_YAML and doc["config"]["path"] == "tau.yaml"
    assert doc["config"]["config_hash"] == "cfg123"  # the resolved run's, submit.accepted carrying none (issue 27)
    assert doc["resolved"]["output_dir"] == str(tmp_path / "output") and doc["platform"]["revision"] == 7
    assert doc["source"] == {"object": f"sources/{run}.tar", "digest": "sha256:abc"}
    [att] = doc["attempts"]
    # the manifests stored by digest, sealed in the bundle, the event's stored body without them (issue 27)
    assert (att["render"]["manifests"], att["render"]["digest"]) == (manifests_of(ws, run),
                                                                    manifest_digest(manifests_of(ws, run)))
    [applied] = [ev for ev in await _events(bus, ws, run) if ev.type == "render.applied"]
    assert b"manifests" not in applied.data and b'"digest":"sha256:' in applied.data
    # and purged from the manifests bucket once the ledger was written: the bundle alone keeps them
    key = stored_manifests.key(ws, run, manifest_digest(manifests_of(ws, run)))
    assert await stored_manifests.read(bus, ws, run, att["render"]["digest"]) == (
        f"manifests/{key} is not stored (purged at an earlier seal, or never written)")
    assert att["exit"]["event"] == "exec.succeeded" and att["exit"]["exit_code"] == 0
    assert att["logs"]["text"] == "epoch 1\nloss 0.5\ndone\n"
    assert doc["outputs"]["output_dir"]["metrics"][0]["text"] == '{"step":1,"loss":0.5}\n'
    assert doc["outputs"]["checkpoint_dir"]["files"] == [
        {"path": "step-1.pt", "size": 1000, "sha256": lg.sha256(b"\0" * 1000)}
    ]
    assert [e["type"] for e in doc["events"]][-1] == "exec.succeeded"
    # the bundle keeps its chain as its event records (issue 27), every reader recomputing the entries from them
    assert doc["ledger"] == {"entries": "run-events"} and len(doc["events"]) == 6
    chain = store.bundle_entries(doc)
    assert [e.event_id for e in chain] == [r["id"] for r in doc["events"]] and chain[-1].hash == payload.ledger_head

    # The KV keeps the seal alone (issue 27): the bundle's name and digest, the chain's head and length, the
    # terminal event's type and attempt, in ~110 bytes (the whole ledger took ~1.3 KB); the entries are the bundle's.
    led, _ = await store.load(bus, ws, run)
    assert led is not None and led.entries == () and (led.count, led.head) == (6, payload.ledger_head)
    assert led.seal == lg.Seal(event_id="", type="exec.succeeded", attempt=1, index=5, bundle=bundle_name(run),
                               digest=payload.digest, head=payload.ledger_head)
    assert len(lg.encode(led)) == 89 + len(run) + len(ws)
    # Read back from the bundle, checked against that seal: exactly the run's events up to its terminal event, in
    # stream order.
    full = await store.read_ledger(bus, ws, run)
    assert full is not None
    events = await _events(bus, ws, run)
    assert [e.event_id for e in full.entries] == [ev.id for ev in events[:6]]
    assert [e.seq for e in full.entries] == [ev.seq for ev in events[:6]]
    assert full.seal == msgspec.structs.replace(led.seal, event_id=events[5].id)
    assert lg.verify(full) == []

    # Deterministic: collecting again gives the same bytes (its manifests stored again, as a redelivered render
    # would: the service never collects a sealed run again); sealing again finds the same seal.
    await stored_manifests.put(bus, ws, run, canonical_json(manifests_of(ws, run)))
    again, _ = await store.collect(bus, full)
    assert again == data
    terminal = next(ev for ev in events if ev.type == "exec.succeeded")
    resealed = await store.seal(bus, terminal)
    assert (resealed.ledger, resealed.resumed, store.sealed_payload(resealed.ledger)) == (led, True, payload)

    # Redelivery of the terminal event and a late racing terminal event change nothing.
    await Evidence(bus).on_event(terminal)
    await emit_as_owner(
        bus,
        workspace=ws,
        run_id=run,
        attempt=1,
        event_type="recovery.gave_up",
        payload=c.RecoveryGaveUp(reason="late", classification="unknown", attempts=1),
    )
    late = next(ev for ev in await _events(bus, ws, run) if ev.type == "recovery.gave_up")
    await Evidence(bus).on_event(late)
    after, _ = await store.load(bus, ws, run)
    assert after == led
    assert len(await sealed_events(bus, ws, run)) == 1
    assert (await verify_run(bus, run)).ok

    # A bundle stored before bundles were compressed (its canonical JSON as it is) reads and verifies the same.
    await store.put_object(bus, bundle_name(run), data, workspace=ws)
    assert await store.read_bundle(bus, run) == (data, doc)
    report = await verify_run(bus, run)
    assert report.problems == [] and report.digest == payload.digest


def test_evidence_sealed_names_a_bundle_only_under_another_name_than_the_runs_usual_one() -> None:
    def sealed(bundle: str) -> c.EvidenceSealed:
        return store.sealed_payload(lg.Ledger(run_id="r1", workspace="w", seal=lg.Seal(
            event_id="", type="exec.succeeded", attempt=1, index=5, bundle=bundle, digest="d" * 64, head="h" * 64)))

    for usual in ("", "runs/r1/bundle.json"):
        assert sealed(usual) == c.EvidenceSealed(attempt=1, terminal_state="succeeded", digest="d" * 64,
                                                 ledger_head="h" * 64, entries=6)
        assert sealed(usual).bundle_of("r1") == "runs/r1/bundle.json"
    assert sealed("runs/r1-copy/bundle.json").bundle_of("r1") == "runs/r1-copy/bundle.json"
    # a later attempt's or another end's seal writes them out
    failed = store.sealed_payload(lg.Ledger(run_id="r1", workspace="w", seal=lg.Seal(
        event_id="", type="recovery.gave_up", attempt=3, index=9, digest="d" * 64, head="h" * 64)))
    stored = wirejson.encode(failed)
    assert msgspec.json.decode(stored) == {"attempt": 3, "terminal_state": "failed", "digest": "d" * 64,
                                           "ledger_head": "h" * 64, "entries": 10}
    assert msgspec.json.decode(stored, type=c.EvidenceSealed) == failed
    # an earlier release's announcement writes the usual name out: read as it is
    assert c.EvidenceSealed(attempt=1, terminal_state="succeeded", bundle="runs/r1/bundle.json", digest="d",
                            ledger_head="h", entries=6).bundle_of("r1") == "runs/r1/bundle.json"


async def fed(bus: Bus, stream: str = HISTORY_STREAM) -> None:
    """HISTORY and AUDIT source RUNS through their feeds (``topology.FEEDS``) asynchronously: wait until ``stream``'s
    have copied everything RUNS stored so far (nothing left to deliver, nothing delivered and not yet stored)."""
    for _ in range(250):
        infos = [await bus.js.consumer_info("RUNS", f.durable) for f in FEEDS if f.into == stream]
        if all(not i.num_pending and not i.num_ack_pending for i in infos):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{stream}'s feeds did not copy what RUNS stored in 5 s")


async def _events(bus: Bus, ws: str, run: str) -> list[Event]:
    """The run's events as HISTORY keeps them (RUNS lets an event go once its consumers acked it): in RUNS' order,
    each at its RUNS sequence."""
    await fed(bus)
    return await history.run_events(bus, ws, run)


async def test_racing_terminal_events_seal_once_and_tampering_is_reported(bus: Bus, tmp_path: Path) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"big-{uuid.uuid4().hex[:6]}"
    lines = [f"line {i:06d} " + "x" * 60 for i in range(INLINE_LOG_BYTES // 60)]
    await publish_run(bus, ws, run, tmp_path, log_lines=lines)
    await emit_as_owner(
        bus,
        workspace=ws,
        run_id=run,
        attempt=1,
        event_type="exec.cancelled",
        payload=c.ExecFinished(exit_code=143, reason="Cancelled"),
    )
    await emit_as_owner(
        bus,
        workspace=ws,
        run_id=run,
        attempt=1,
        event_type="recovery.gave_up",
        payload=c.RecoveryGaveUp(reason="x", classification="app", attempts=1),
    )

    await drain(bus, f"evidence-{ws}", ws, announced(ws, run, bus))

    [sealed] = [ev.payload(c.EvidenceSealed) for ev in await sealed_events(bus, ws, run)]
    assert sealed.terminal_state == "cancelled" and sealed.entries == 6
    _, doc = await store.read_bundle(bus, run)  # type: ignore[misc]
    logs = doc["attempts"][0]["logs"]
    assert "text" not in logs and logs["object"] == f"runs/{run}/attempt-1.log"
    assert logs["lines"] == len(lines) and not doc["outputs"]["output_dir"]["present"]
    assert (await verify_run(bus, run)).ok

    # A modified log object, then a modified bundle, then a rewritten ledger entry: each is reported.
    await store.put_object(bus, logs["object"], b"forged\n", workspace=ws)
    assert any("log object" in p and "modified" in p for p in (await verify_run(bus, run)).problems)
    forged = msgspec.json.encode({**doc, "config": {"text": "forged"}})
    await store.put_object(bus, bundle_name(run), forged, workspace=ws)
    report = await verify_run(bus, run)
    assert not report.ok and any("the bundle was modified" in p for p in report.problems)

    # the KV rewritten as a whole ledger (the form an earlier release stored), one entry changed
    entries = store.bundle_entries(doc)
    bad = msgspec.structs.replace(entries[1], payload_sha256="0" * 64)
    await store.update(bus, ws, run, lambda cur: msgspec.structs.replace(
        cur, entries=(entries[0], bad, *entries[2:]), seal=msgspec.structs.replace(
            cur.seal, event_id=entries[5].event_id, head="") if cur.seal is not None else None))
    problems = (await verify_run(bus, run, audit_wait_s=0)).problems
    assert any(p.startswith("entry 1") and "modified" in p for p in problems)
    # entry 1 is submit.accepted, which AUDIT no longer keeps: HISTORY, which still holds the run, and the sealed
    # bundle's events say it
    was = f"payload {'0' * 12}…/{entries[1].payload_sha256[:12]}…"
    assert f"ledger entry 1 ({run}.1.submit.accepted) differs from HISTORY: type submit.accepted/submit.accepted, " \
        f"{was}" in problems
    assert f"ledger entry 1 ({run}.1.submit.accepted) differs from the sealed bundle's event: type " \
        f"submit.accepted/submit.accepted, {was}" in problems


async def _finish(bus: Bus, ws: str, run: str, kind: str = "exec.succeeded") -> Event:
    payloads: dict[str, msgspec.Struct] = {
        "exec.succeeded": c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0),
        "exec.cancelled": c.ExecFinished(exit_code=143, reason="Cancelled"),
        "recovery.gave_up": c.RecoveryGaveUp(reason="x", classification="app", attempts=1),
    }
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type=kind, payload=payloads[kind])
    return next(ev for ev in reversed(await _events(bus, ws, run)) if ev.type == kind)


@pytest.fixture
async def evidence() -> AsyncIterator[Bus]:
    """A connection of the evidence service's (``evidence.sealed`` is its to publish: ``core/publishing.py``)."""
    own = await connect(os.environ["TAU_NATS_URL"], name="evidence")
    yield own
    await own.close()


async def audit_caught_up(bus: Bus) -> None:
    """AUDIT sources RUNS asynchronously: wait until it holds what RUNS stored so far of the kinds it keeps."""
    await fed(bus, AUDIT_STREAM)


def test_the_evidence_durable_receives_only_terminal_events() -> None:
    assert sorted(CONSUMERS["evidence"].filters) == sorted(f"run.*.*.{t}" for t in TERMINAL_EVENTS)


async def test_no_ledger_before_the_terminal_event_then_one_with_exactly_the_run_s_events(
    bus: Bus, evidence: Bus, tmp_path: Path
) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"one-{uuid.uuid4().hex[:6]}"
    await publish_run(bus, ws, run, tmp_path, log_lines=["hello"])
    service = Evidence(bus)
    for ev in await _events(bus, ws, run):  # what an upgraded durable may still deliver: ignored
        await service.on_event(ev)
    assert await store.load(bus, ws, run) == (None, 0)

    terminal = await _finish(bus, ws, run)
    sealed = await store.seal(evidence, terminal)  # the one write: the ledger, created sealed with the bundle's digest
    assert await store.announce(evidence, sealed) is True
    assert await store.announce(evidence, msgspec.structs.replace(sealed, resumed=True)) is False  # a redelivery
    events = [ev for ev in await _events(bus, ws, run) if ev.type != "evidence.sealed"]
    assert [e.event_id for e in (await store.with_entries(bus, sealed.ledger)).entries] == [ev.id for ev in events]
    assert ((await store.load(bus, ws, run))[0], sealed.resumed) == (sealed.ledger, False)
    assert sealed.ledger.seal is not None and sealed.ledger.seal.digest
    assert len(await sealed_events(bus, ws, run)) == 1
    await audit_caught_up(bus)
    assert (await verify_run(bus, run)).ok


async def test_a_seal_interrupted_at_any_step_completes_once_with_the_same_digest(
    bus: Bus, evidence: Bus, tmp_path: Path
) -> None:
    """The evidence process gone between the terminal event and the end of the seal: its redelivery seals once."""
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"crash-{uuid.uuid4().hex[:6]}"
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "model.bin").write_bytes(b"1" * 10)
    await publish_run(bus, ws, run, tmp_path, log_lines=["a", "b"])
    terminal = await _finish(bus, ws, run)

    # Gone after storing the bundle, before writing the ledger: the stored bundle is reused, never rebuilt
    # (an output written since would change a rebuilt one).
    first = await store.seal(evidence, terminal)
    assert first.ledger.seal is not None
    digest = first.ledger.seal.digest
    await store.kv.delete(bus, store.BUCKET, store.key(ws, run))
    (tmp_path / "output" / "late.txt").write_text("written after the seal\n")
    # Gone after writing the ledger, before announcing it: the redelivery announces once.
    again = await store.seal(evidence, terminal)
    assert again.ledger.seal is not None and again.ledger.seal.digest == digest
    assert await sealed_events(bus, ws, run) == []
    await Evidence(evidence).on_event(terminal)
    await Evidence(evidence).on_event(terminal)  # and a redelivery after a lost ack changes nothing
    [announcement] = [ev.payload(c.EvidenceSealed) for ev in await sealed_events(bus, ws, run)]
    led, _ = await store.load(bus, ws, run)
    assert led is not None and led.seal is not None
    assert (announcement.digest, led.seal.digest, led) == (digest, digest, first.ledger)
    await audit_caught_up(bus)
    report = await verify_run(bus, run)
    assert report.problems == [] and report.digest == digest

    # Redelivered after the stream's duplicate window: the announcement found in AUDIT is not published again.
    assert await store.announce(evidence, await store.seal(evidence, terminal)) is False


async def test_concurrent_racing_terminal_events_seal_once_by_the_first_in_the_stream(
    bus: Bus, tmp_path: Path
) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"race-{uuid.uuid4().hex[:6]}"
    await publish_run(bus, ws, run, tmp_path, log_lines=["x"])
    cancelled = await _finish(bus, ws, run, "exec.cancelled")
    gave_up = await _finish(bus, ws, run, "recovery.gave_up")
    # two replicas, the later event's handled first: each builds the run's ledger up to its first terminal event
    a, b = await connect(os.environ["TAU_NATS_URL"], name="evidence"), await connect(
        os.environ["TAU_NATS_URL"], name="evidence")
    try:
        await asyncio.gather(Evidence(a).on_event(gave_up), Evidence(b).on_event(cancelled),
                             Evidence(a).on_event(cancelled))
    finally:
        await a.close()
        await b.close()
    [announcement] = [ev.payload(c.EvidenceSealed) for ev in await sealed_events(bus, ws, run)]
    led = await store.read_ledger(bus, ws, run)
    assert led is not None and led.seal is not None
    assert (led.seal.event_id, led.seal.index, len(led.entries)) == (cancelled.id, 5, 6)
    assert (announcement.terminal_state, announcement.digest) == ("cancelled", led.seal.digest)
    await audit_caught_up(bus)
    assert (await verify_run(bus, run)).ok


async def test_a_ledger_written_per_event_before_the_upgrade_is_extended_and_sealed(
    bus: Bus, evidence: Bus, tmp_path: Path
) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"old-{uuid.uuid4().hex[:6]}"
    await publish_run(bus, ws, run, tmp_path, log_lines=["x"])
    early = (await _events(bus, ws, run))[:3]
    await store.update(bus, ws, run, lambda cur: lg.extend(cur, early))  # as the earlier version left it
    terminal = await _finish(bus, ws, run)
    await Evidence(evidence).on_event(terminal)
    led = await store.read_ledger(bus, ws, run)  # sealed: the KV keeps the seal alone, the entries are the bundle's
    events = await _events(bus, ws, run)
    assert led is not None and led.seal is not None and led.seal.digest
    assert [e.event_id for e in led.entries] == [ev.id for ev in events if ev.type != "evidence.sealed"]
    assert led.entries[:3] == lg.extend(lg.Ledger(run_id=run, workspace=ws), early).entries
    await audit_caught_up(bus)
    assert (await verify_run(bus, run)).ok


async def test_a_run_is_read_from_its_one_subject_in_history_projected_or_not(
    bus: Bus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seal reads a run's events from its one subject in HISTORY (``h.<ws>.<run>``: the server's per-subject
    index finds them) and AUDIT's (``a.<ws>.<run>``, the kinds it keeps), once each, whether or not its run_state
    record lists them all (a projection behind): both give the run's events, in RUNS' order at their RUNS
    sequences, through its terminal event; a run's later events are left out."""
    from taugrid import runrecord
    from taugrid.bus import streams

    read: list[tuple[str, str, int]] = []
    by_subject = streams.history

    async def walked(*args, **kwargs):  # type: ignore[no-untyped-def]
        read.append((args[1], args[2], kwargs.get("start", 1)))
        return await by_subject(*args, **kwargs)

    monkeypatch.setattr(streams, "history", walked)
    ws = f"ev{uuid.uuid4().hex[:6]}"
    projected, behind = f"proj-{uuid.uuid4().hex[:6]}", f"lag-{uuid.uuid4().hex[:6]}"
    for run in (projected, behind):
        await publish_run(bus, ws, run, tmp_path / run, log_lines=["hello"])
    terminal = await _finish(bus, ws, projected)
    for ev in await _events(bus, ws, projected):
        await runrecord.project(bus, ev)
    lagging = await _finish(bus, ws, behind)
    for ev in (await _events(bus, ws, behind))[:-2]:  # exec.running and the terminal event not projected yet
        await runrecord.project(bus, ev)
    await _finish(bus, ws, behind, "recovery.gave_up")  # after the terminal event: not the sealed run's

    for run, end in ((projected, terminal), (behind, lagging)):
        read.clear()
        got = await store.run_history(bus, end)
        # one read of each subject from the start (what RUNS still holds of the run may be read too: history.py)
        assert [r for r in read if r[0] in (HISTORY_STREAM, AUDIT_STREAM)] == [
            (HISTORY_STREAM, f"h.{ws}.{run}", 1), (AUDIT_STREAM, f"a.{ws}.{run}", 1)]
        events = await _events(bus, ws, run)
        assert [(ev.id, ev.seq) for ev in got] == [(ev.id, ev.seq) for ev in events if ev.seq <= end.seq]
        assert got[0].type == "submit.requested" and got[-1].id == end.id and got[-1].seq > got[0].seq


async def test_an_elastic_runs_resizes_are_sealed_with_their_attempt_in_order(bus: Bus, tmp_path: Path) -> None:
    ws, run = f"ev{uuid.uuid4().hex[:6]}", f"elastic-{uuid.uuid4().hex[:6]}"
    await publish_run(bus, ws, run, tmp_path, log_lines=["step 1"])
    for old, new, cause, by in ((3, 2, "ShrunkForPreemptor", "hi-1"), (2, 3, "Grown", "")):
        await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="exec.resized", dedup=cause,
                            payload=c.ExecResized(old_count=old, new_count=new, cause=cause, preemptor=by,
                                                  pod_set="main"))
    await _finish(bus, ws, run)
    await drain(bus, f"evidence-{ws}", ws, announced(ws, run, bus))
    _, doc = await store.read_bundle(bus, run)  # type: ignore[misc]
    [att] = doc["attempts"]
    assert [(r["old_count"], r["new_count"], r["cause"], r["preemptor"], r["pod_set"]) for r in att["resizes"]] == [
        (3, 2, "ShrunkForPreemptor", "hi-1", "main"), (2, 3, "Grown", "", "main")]
    assert att["resizes"][0]["seq"] < att["resizes"][1]["seq"] < att["exit"]["seq"]
    assert (await verify_run(bus, run)).ok
