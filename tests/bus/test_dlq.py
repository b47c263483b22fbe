"""Dead letters on a real nats-server: an undecodable payload is dead-lettered on its first delivery (it will never
decode), a handler that keeps failing ends as the server's max-deliveries advisory, both are listed with their
consumer, subject and reason, and a replay republishes the original event (from RUNS, or from its copy once RUNS, an
interest stream, let it go), which the consumer then handles."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from taugrid.bus import Bus, dlq, history, streams
from taugrid.bus.bootstrap import bootstrap, ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.topology import FEEDS, ConsumerSpec
from taugrid.core.contracts import SubmitAccepted
from taugrid.core.errors import NotFound
from tests.owners import acting_as


async def publish_unreadable_acceptance(bus: Bus, ws: str, run_id: str) -> int:
    """A ``submit.accepted`` from the submitter whose body never decodes as one; its RUNS sequence."""
    with acting_as(bus, "submitter"):
        return await bus.publish(f"run.{ws}.{run_id}.submit.accepted", b'{"not": "a submission"}',
                                 event_type="submit.accepted", ce_subject=run_id, msg_id=f"m-{ws}", workspace=ws)


async def until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def start_loop(bus: Bus, durable: str, subject: str, handler, max_deliver: int = 8):  # type: ignore[no-untyped-def]
    await ensure_consumer(bus, ConsumerSpec(durable, "RUNS", [subject], max_deliver=max_deliver))
    loop = ConsumerLoop(bus, stream="RUNS", durable=durable, handler=handler, fetch_timeout=0.2)
    return loop, asyncio.create_task(loop.run())


async def stop_loop(loop: ConsumerLoop, task: asyncio.Task[None]) -> None:
    loop.stopping.set()
    await asyncio.wait_for(task, 10)


async def test_an_undecodable_payload_is_dead_lettered_at_once_and_a_replay_is_handled(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    durable, run_id = f"dlq-{ws}", f"r-{ws}"
    seen: list[tuple[str, int]] = []
    fixed = asyncio.Event()

    async def handler(ev: Event) -> None:
        seen.append((ev.type, ev.seq))
        if not fixed.is_set():
            ev.payload(SubmitAccepted)  # the bad payload below never decodes as one

    loop, task = await start_loop(bus, durable, f"run.{ws}.*.submit.accepted", handler)
    try:
        seq = await publish_unreadable_acceptance(bus, ws, run_id)

        async def dead() -> list[dlq.DeadLetter]:
            return await dlq.dead_letters(bus, durable=durable)

        await until(lambda: _non_empty(dead()))
        [letter] = await dead()
        assert seen == [("submit.accepted", seq)]  # one delivery, no retries of what cannot decode
        assert (letter.kind, letter.stream, letter.stream_seq, letter.durable, letter.subject) == (
            "refused", "RUNS", seq, durable, f"run.{ws}.{run_id}.submit.accepted")
        assert letter.error.startswith("undecodable submit.accepted payload: Object missing required field")

        fixed.set()
        [replayed] = await dlq.replay(bus, [letter.seq])
        assert (replayed.seq, replayed.subject) == (letter.seq, letter.subject)
        await until(lambda: _true(len(seen) == 2))
        assert seen[1][0] == "submit.accepted" and seen[1][1] > seq  # the same event, republished
        assert await dead() == []  # replayed letters leave the DLQ
        with pytest.raises(NotFound) as gone:
            await dlq.replay(bus, [letter.seq])
        assert str(gone.value) == f"no dead letter #{letter.seq}: `tau dlq list` shows the ones held"
    finally:
        await stop_loop(loop, task)


async def test_a_replay_whose_id_was_taken_first_on_another_subject_is_still_handled(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    durable, run_id = f"dlq-{ws}", f"r-{ws}"
    seen: list[int] = []
    fixed = asyncio.Event()

    async def handler(ev: Event) -> None:
        if not fixed.is_set():
            ev.payload(SubmitAccepted)
        seen.append(ev.seq)

    loop, task = await start_loop(bus, durable, f"run.{ws}.*.submit.accepted", handler)
    try:
        with acting_as(bus, "submitter"):
            await bus.publish(f"run.{ws}.{run_id}.submit.accepted", b'{"not": "a submission"}',
                              event_type="submit.accepted", ce_subject=run_id, msg_id=f"m-{ws}", workspace=ws)
        await until(lambda: _non_empty(dlq.dead_letters(bus, durable=durable)))
        [letter] = await dlq.dead_letters(bus, durable=durable)
        # a researcher stores a request of her own under the id the replay will carry
        await bus.js.publish(f"run.{ws}.squat.cancel.requested", b"{}",
                             headers={"Nats-Msg-Id": f"m-{ws}.replay-{letter.seq}"})
        fixed.set()
        await dlq.replay(bus, [letter.seq])
        await until(lambda: _true(len(seen) == 1))
        assert await dlq.dead_letters(bus, durable=durable) == []
    finally:
        await stop_loop(loop, task)
async def test_a_handler_that_keeps_failing_ends_as_a_max_deliveries_dead_letter(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    durable, run_id = f"dlq-{ws}", f"r-{ws}"
    tries = 0

    async def handler(ev: Event) -> None:
        nonlocal tries
        tries += 1
        raise RuntimeError("the database is down")

    loop, task = await start_loop(bus, durable, f"run.{ws}.*.submit.accepted", handler, max_deliver=2)
    try:
        with acting_as(bus, "submitter"):
            seq = await bus.publish(f"run.{ws}.{run_id}.submit.accepted", b"{}", event_type="submit.accepted",
                                    ce_subject=run_id, msg_id=f"m-{ws}", workspace=ws)
        await until(lambda: _non_empty(dlq.dead_letters(bus, durable=durable)), timeout=15)
        [letter] = await dlq.dead_letters(bus, durable=durable)
        assert (letter.kind, letter.stream_seq, letter.subject, letter.error) == (
            "max-deliveries", seq, f"run.{ws}.{run_id}.submit.accepted", "handler failed 2 deliveries")
        assert tries == 2
    finally:
        await stop_loop(loop, task)


async def test_a_refused_run_event_runs_let_go_is_replayed_from_its_dead_letter_into_history(
        private_bus: Bus) -> None:
    """RUNS is an interest stream (issue 27): a run event its one reader refused leaves RUNS once HISTORY's and
    AUDIT's feeds stored it. ``tau dlq replay`` republishes the DLQ's copy, which the reader then handles, and
    HISTORY keeps the replay after the original, naming it."""
    bus = private_bus
    assert await bootstrap(bus, replicas=1) == []
    feeds = {feed.durable for feed in FEEDS}
    for info in await bus.js.consumers_info("RUNS"):  # the stages' durables: none runs here to ack the event
        if info.name not in feeds:
            await bus.js.delete_consumer("RUNS", info.name)
    ws, run_id = f"w{uuid.uuid4().hex[:8]}", "r1"
    durable = f"dlq-{ws}"
    seen: list[int] = []

    async def handler(ev: Event) -> None:
        seen.append(ev.seq)
        if len(seen) == 1:
            ev.payload(SubmitAccepted)  # the first one's payload never decodes

    loop, task = await start_loop(bus, durable, f"run.{ws}.*.submit.accepted", handler)
    try:
        seq = await publish_unreadable_acceptance(bus, ws, run_id)

        async def let_go() -> bool:
            return bool(await dlq.dead_letters(bus, durable=durable)) and not await streams.holds(
                bus, "RUNS", f"run.{ws}.>")

        await until(let_go)
        [letter] = await dlq.dead_letters(bus, durable=durable)
        assert (letter.kind, letter.stream, letter.stream_seq, letter.subject) == (
            "refused", "RUNS", seq, f"run.{ws}.{run_id}.submit.accepted")
        assert await streams.at(bus, "RUNS", seq) is None  # terminated, and stored by both feeds: gone from RUNS

        [replayed] = await dlq.replay(bus, [letter.seq])
        assert (replayed.seq, replayed.subject) == (letter.seq, letter.subject)
        await until(lambda: _true(len(seen) == 2))
        assert seen[0] == seq and seen[1] > seq  # the same event, republished from its copy
        kept = await history.run_events(bus, ws, run_id, through=seen[1])
        assert [(ev.seq, ev.type, ev.data, ev.headers.get("x-replay-of")) for ev in kept] == [
            (seq, "submit.accepted", b'{"not": "a submission"}', None),
            (seen[1], "submit.accepted", b'{"not": "a submission"}', f"RUNS.{seq}")]
        assert await dlq.dead_letters(bus) == []
    finally:
        await stop_loop(loop, task)


def test_tau_dlq_list_and_replay_from_the_cli(bootstrapped: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def make_letter() -> tuple[int, str]:
        from taugrid.bus import connect

        b = await connect(bootstrapped, name="test")
        try:
            ws = f"w{uuid.uuid4().hex[:8]}"
            durable = f"dlq-{ws}"

            async def handler(ev: Event) -> None:
                ev.payload(SubmitAccepted)

            loop, task = await start_loop(b, durable, f"run.{ws}.*.submit.accepted", handler)
            with acting_as(b, "submitter"):
                await b.publish(f"run.{ws}.r.submit.accepted", b"[]", event_type="submit.accepted",
                                ce_subject="r", msg_id=f"m-{ws}", workspace=ws)
            await until(lambda: _non_empty(dlq.dead_letters(b, durable=durable)))
            await stop_loop(loop, task)
            [letter] = await dlq.dead_letters(b, durable=durable)
            return letter.seq, durable
        finally:
            await b.close()

    seq, durable = asyncio.run(make_letter())
    env = {**os.environ, "TAU_NATS_URL": bootstrapped, "TAU_DATA_DIR": str(tmp_path)}
    tau = [sys.executable, "-m", "taugrid.cli.main", "dlq"]
    listed = subprocess.run([*tau, "list", "--durable", durable, "-o", "json"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert '"kind": "refused"' in listed.stdout and f'"seq": {seq}' in listed.stdout
    replayed = subprocess.run([*tau, "replay", str(seq)], capture_output=True, text=True, env=env, timeout=60)
    assert (replayed.returncode, replayed.stdout.split(" (")[0]) == (0, f"replayed #{seq}: run.{durable[4:]}.r."
                                                                         "submit.accepted")


async def _non_empty(aw) -> bool:  # type: ignore[no-untyped-def]
    return bool(await aw)


async def _true(value: bool) -> bool:
    return value
