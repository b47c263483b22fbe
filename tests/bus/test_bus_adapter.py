"""The bus adapter against a real nats-server: bootstrap, envelope, dedup, consumer verbs, DLQ, AUDIT."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import nats
import pytest
from nats.js.api import ConsumerConfig

from taugrid.bus import Bus, connect, streams
from taugrid.bus.bootstrap import bootstrap, ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event, dedup_key, from_message, store_time
from taugrid.bus.history import run_events
from taugrid.bus.replay import follow
from taugrid.bus.topology import ConsumerSpec
from taugrid.cli.views import event_json_lines
from taugrid.core import wirejson
from taugrid.core.contracts import BackendApply, CancelDecision, CancelRequested, PolicyApproved, ResolvedRun
from taugrid.core.errors import PermanentError, TemporaryError


async def test_bootstrap_is_idempotent_and_audit_denies_purge(bus: Bus) -> None:
    await bootstrap(bus)
    info = await bus.js.stream_info("AUDIT")
    assert info.config.deny_purge and info.config.deny_delete
    with pytest.raises(nats.js.errors.APIError):
        await bus.js.purge_stream("AUDIT")


async def test_emit_is_deduplicated_by_deterministic_id(bus: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:6]}"
    s1 = await bus.emit(workspace="ws", run_id=run, attempt=1, event_type="cancel.requested",
                        payload=CancelRequested(reason="x"))
    s2 = await bus.emit(workspace="ws", run_id=run, attempt=1, event_type="cancel.requested",
                        payload=CancelRequested(reason="x"))
    assert s1 == s2
    msg = await bus.js.get_msg("RUNS", seq=s1)
    assert msg.headers["ce-type"] == "io.taugrid.run.cancel.requested.v1"  # a person's request keeps every header
    assert msg.headers["ce-subject"] == run
    assert msg.headers["ce-id"] == f"{run}.1.cancel.requested"  # deduplicated by its short key (issue 27)
    assert msg.headers["Nats-Msg-Id"] == dedup_key(f"{run}.1.cancel.requested")
    assert msg.headers["ce-time"]  # signed, and checked for freshness
    # a service's event is stored compact (issue 27): its subject says the type, workspace and run, a short key
    # with its suffix the id, and the store its time
    s3 = await bus.emit(workspace="ws", run_id=run, attempt=1, event_type="cancel.accepted", dedup="a1",
                        payload=CancelDecision(request_id=f"{run}.1.cancel.requested", by="alice"))
    s4 = await bus.emit(workspace="ws", run_id=run, attempt=1, event_type="cancel.accepted", dedup="a1",
                        payload=CancelDecision(request_id=f"{run}.1.cancel.requested", by="alice"))
    assert s4 == s3
    msg = await bus.js.get_msg("RUNS", seq=s3)
    assert sorted(msg.headers) == ["Nats-Msg-Id", "ce-source"]
    assert msg.headers["Nats-Msg-Id"] == f"{dedup_key(f'{run}.1.cancel.accepted.a1')}:a1"
    ev = from_message(msg.subject, msg.headers, msg.data, stored=msg.time.timestamp())
    assert (ev.id, ev.ce_type, ev.subject, ev.workspace, ev.attempt, ev.source) == (
        f"{run}.1.cancel.accepted.a1", "io.taugrid.run.cancel.accepted.v1", run, "ws", 1, "/svc/test")
    assert ev.time == store_time(msg.time.timestamp())
    # a direct get reads the store's nanoseconds (get_msg: nats-py's microseconds): the same millisecond but at its
    # edge
    [direct] = await streams.at_many(bus, "RUNS", [s3])
    assert direct is not None and direct.id == ev.id and abs(direct.happened - ev.happened) <= 0.001
    # a replay reads HISTORY's copy (issue 27), stamped when HISTORY stored it (at or after RUNS; a few ms later
    # under load): once the copy is there (``through``), the copy's own nanoseconds, as a direct get reads them
    kept = [e for e in await run_events(bus, "ws", run, through=s3) if e.id == ev.id]
    replayed = [e async for e in follow(bus, f"run.ws.{run}.cancel.accepted")]
    assert [e.id for e in replayed] == [ev.id] and [(e.seq, e.time) for e in kept] == [(s3, replayed[0].time)]
    assert replayed[0].happened >= direct.happened


async def _loop_for(bus: Bus, name: str, subject: str, handler, max_deliver: int = 3) -> ConsumerLoop:
    await ensure_consumer(bus, ConsumerSpec(name, "RUNS", [subject], max_deliver=max_deliver, ack_wait=5))
    return ConsumerLoop(bus, stream="RUNS", durable=name, handler=handler, fetch_timeout=0.2)


async def test_verbs_ack_nak_term_and_dlq(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    seen: dict[str, int] = {}

    async def handler(ev: Event) -> None:
        seen[ev.subject] = seen.get(ev.subject, 0) + 1
        if ev.subject == "poison":
            raise PermanentError("bad payload: field 'x' missing")
        if ev.subject == "flaky" and seen["flaky"] < 2:
            raise TemporaryError("later", delay=0.1)

    loop = await _loop_for(bus, f"t-{ws}", f"run.{ws}.*.cancel.requested", handler)
    for run in ("ok", "poison", "flaky"):
        await bus.emit(workspace=ws, run_id=run, attempt=1, event_type="cancel.requested",
                       payload=CancelRequested())
    task = asyncio.create_task(loop.run())
    for _ in range(100):
        if loop.handled >= 2:
            break
        await asyncio.sleep(0.05)
    loop.stopping.set()
    await task
    assert seen == {"ok": 1, "poison": 1, "flaky": 2}
    dlq = await bus.js.get_last_msg("DLQ", f"dlq.RUNS.t-{ws}")
    assert "field 'x' missing" in dlq.headers["x-dlq-error"]


async def test_max_deliveries_advisory_is_captured_in_dlq(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"

    async def handler(ev: Event) -> None:
        raise TemporaryError("always", delay=0.05)

    loop = await _loop_for(bus, f"m-{ws}", f"run.{ws}.*.cancel.requested", handler, max_deliver=2)
    await bus.emit(workspace=ws, run_id="x", attempt=1, event_type="cancel.requested", payload=CancelRequested())
    task = asyncio.create_task(loop.run())
    subject = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.RUNS.m-{ws}"
    msg = None
    for _ in range(60):
        try:
            msg = await bus.js.get_last_msg("DLQ", subject)
            break
        except nats.js.errors.NotFoundError:
            await asyncio.sleep(0.1)
    loop.stopping.set()
    await task
    assert msg is not None
    assert msgspec.json.decode(msg.data)["deliveries"] == 2


async def test_two_replicas_share_one_durable(bus: Bus, bootstrapped: str) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    got: list[tuple[int, str]] = []

    def make(i: int):
        async def handler(ev: Event) -> None:
            got.append((i, ev.subject))
            await asyncio.sleep(0.01)
        return handler

    other = await connect(bootstrapped, name="replica-2")
    try:
        a = await _loop_for(bus, f"s-{ws}", f"run.{ws}.*.cancel.requested", make(1))
        b = ConsumerLoop(other, stream="RUNS", durable=f"s-{ws}", handler=make(2), fetch_timeout=0.2, batch=4)
        a.batch = 4
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        for n in range(60):
            await bus.emit(workspace=ws, run_id=f"r{n}", attempt=1, event_type="cancel.requested",
                           payload=CancelRequested())
        for _ in range(100):
            if len(got) >= 60:
                break
            await asyncio.sleep(0.05)
        a.stopping.set()
        b.stopping.set()
        await asyncio.gather(*tasks)
    finally:
        await other.close()
    runs = [r for _, r in got]
    assert sorted(runs) == sorted(f"r{n}" for n in range(60))  # each exactly once
    assert {i for i, _ in got} == {1, 2}  # both replicas worked


async def test_a_run_event_is_stored_without_its_defaults_and_read_back_whole(bus: Bus) -> None:
    """issue 27: the body leaves out every field at its default (core/wirejson); every reader gets them back."""
    run = f"r-{uuid.uuid4().hex[:6]}"
    approved = PolicyApproved(run=ResolvedRun(run_id=run, submission_id="s", workspace="ws", namespace="default",
                                              name=run, priority=100), platform_revision=3)
    seq = await bus.emit(workspace="ws", run_id=run, attempt=1, event_type="policy.approved", payload=approved)
    msg = await bus.js.get_msg("RUNS", seq=seq)
    assert msg.data == wirejson.encode(approved)
    assert msgspec.json.decode(msg.data) == {"run": {"run_id": run, "submission_id": "s", "workspace": "ws",
                                                     "namespace": "default", "name": run, "priority": 100},
                                             "platform_revision": 3}
    ev = from_message(msg.subject, msg.headers, msg.data, seq=seq)
    assert ev.payload(PolicyApproved) == approved
    assert ev.as_dict() == msgspec.to_builtins(approved)  # the projection, tau events, the evidence read this
    line = msgspec.json.decode(event_json_lines([ev]))
    assert line["data"] == msgspec.to_builtins(approved)  # tau events --output json
    apply = BackendApply(run_id=run, workspace="ws", attempt=1, manifests=[{"kind": "Job"}], platform_revision=3)
    cluster = f"t{uuid.uuid4().hex[:6]}"
    # BACKEND keeps a request only for a durable whose filter matches it (interest retention): a feed's
    await bus.js.add_consumer("BACKEND", ConsumerConfig(durable_name=f"test-{cluster}",
                                                        filter_subject=f"backend.{cluster}.>"))
    try:
        seq = await bus.publish(f"backend.{cluster}.apply", apply, event_type="apply", ce_subject=run,
                                msg_id=f"{run}.1.apply", workspace="ws", family="backend")
        msg = await bus.js.get_msg("BACKEND", seq=seq)
    finally:
        await bus.js.delete_consumer("BACKEND", f"test-{cluster}")
    assert msgspec.json.decode(msg.data) == {"run_id": run, "workspace": "ws", "attempt": 1,
                                             "manifests": [{"kind": "Job"}], "platform_revision": 3}
    assert from_message(msg.subject, msg.headers, msg.data).payload(BackendApply) == apply
