"""K8S is an interest-retention stream (issue 27), on a real nats-server: a watch change is dropped once the
admission watcher's durable for its lane acked it, kept while that durable has not, and a K8S an earlier release
made with limits retention is reported by the bootstrap and switched by ``--update``, which drops what the
durables had acked already."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from taugrid.bus import Bus, dlq
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import PermanentError
from tests.owners import acting_as

DEFAULT = "k8s.local.pod.default.r1-a1-0.modified"  # the admission-watcher's: six tokens
HIGH = "k8s.local.pod.default.r2-a1-0.modified.high"  # the high lane's (admission-watcher-high): seven


async def held(bus: Bus) -> list[str]:
    """The subjects K8S holds, in stream order."""
    info = await bus.js.stream_info("K8S")
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            out.append(str((await bus.js.get_msg("K8S", seq)).subject))
        except Exception:  # noqa: BLE001 - a sequence already removed: a gap
            continue
    assert len(out) == info.state.messages
    return out


async def take(bus: Bus, durable: str, count: int) -> list[Any]:
    """Fetch ``count`` messages from ``durable`` (bound, as the admission watcher's ConsumerLoop binds)."""
    psub = await bus.js.pull_subscribe_bind(durable, stream="K8S")
    try:
        msgs = await psub.fetch(count, timeout=5)
    finally:
        await psub.unsubscribe()
    assert len(msgs) == count
    return msgs


async def ack_all(msgs: list[Any]) -> None:
    for m in msgs:
        await m.ack_sync()


async def test_a_fresh_k8s_keeps_a_watch_change_until_its_lane_s_durable_acked_it(private_bus: Bus) -> None:
    assert await bootstrap(private_bus, replicas=1) == []
    info = await private_bus.js.stream_info("K8S")
    assert info.config.retention == RetentionPolicy.INTEREST
    # RUNS is the stages' input too (issue 27: HISTORY, with limits retention, keeps the runs' events); the
    # streams read back as records keep limits retention
    assert (await private_bus.js.stream_info("RUNS")).config.retention == RetentionPolicy.INTEREST
    for stream in ("NODES", "HISTORY", "AUDIT", "LOGS"):
        assert (await private_bus.js.stream_info(stream)).config.retention == RetentionPolicy.LIMITS, stream
    assert sorted(c.name for c in await private_bus.js.consumers_info("K8S")) == [
        "admission-watcher", "admission-watcher-high"]

    for subject in (DEFAULT, HIGH, DEFAULT.replace("modified", "deleted")):
        await private_bus.js.publish(subject, b"{}")
    # a subject neither durable's filter matches is not stored at all
    ack = await private_bus.js.publish("k8s.local.pod.default.odd", b"{}")
    assert ack.seq == 4
    assert await held(private_bus) == [DEFAULT, HIGH, DEFAULT.replace("modified", "deleted")]

    # the high lane acks its one: the default lane's two stay, unacked by theirs
    await ack_all(await take(private_bus, "admission-watcher-high", 1))
    assert await held(private_bus) == [DEFAULT, DEFAULT.replace("modified", "deleted")]
    # one delivered and acked, one delivered and not: only the acked one goes
    first, second = await take(private_bus, "admission-watcher", 2)
    await first.ack_sync()
    assert await held(private_bus) == [DEFAULT.replace("modified", "deleted")]
    await second.ack_sync()
    assert (await private_bus.js.stream_info("K8S")).state.messages == 0

    # the kube-bridge's repeat of a change (a re-list, a takeover) is still dropped by the duplicate window, though
    # the change itself has left the stream
    first_id = await private_bus.js.publish(DEFAULT, b"{}", headers={"Nats-Msg-Id": "uid-1.42"})
    await ack_all(await take(private_bus, "admission-watcher", 1))
    assert (await private_bus.js.stream_info("K8S")).state.messages == 0
    again = await private_bus.js.publish(DEFAULT, b"{}", headers={"Nats-Msg-Id": "uid-1.42"})
    assert (again.duplicate, again.seq) == (True, first_id.seq)
    assert (await private_bus.js.stream_info("K8S")).state.messages == 0


async def test_a_watch_change_its_durable_gave_up_on_stays_for_a_replay_and_a_refused_one_leaves(
        private_bus: Bus) -> None:
    """``tau dlq replay`` reads a max-deliveries letter's original from K8S: the server keeps a message that
    reached its durable's max deliveries. A terminated one (the watcher refused it) is removed like an acked one."""
    assert await bootstrap(private_bus, replicas=1) == []
    await private_bus.js.add_consumer("K8S", ConsumerConfig(  # the watcher's filter with one delivery, no wait
        durable_name="once", ack_policy=AckPolicy.EXPLICIT, filter_subject="k8s.*.*.*.*.*", max_deliver=1,
        ack_wait=0.5))
    await private_bus.js.publish(DEFAULT, b"{}")
    await private_bus.js.publish(DEFAULT.replace("modified", "deleted"), b"{}")
    await ack_all(await take(private_bus, "admission-watcher", 2))
    gave_up, refused = await take(private_bus, "once", 2)
    await refused.term()
    psub = await private_bus.js.pull_subscribe_bind("once", stream="K8S")
    with pytest.raises(asyncio.TimeoutError):  # past the ack wait, the one never acked is not delivered again
        await psub.fetch(1, timeout=1.5)
    await psub.unsubscribe()
    assert await held(private_bus) == [DEFAULT]
    assert gave_up.subject == DEFAULT


async def test_a_watch_change_the_watcher_refused_is_replayed_from_its_dead_letter(private_bus: Bus) -> None:
    """The refused change left K8S with its term; ``tau dlq replay`` republishes the DLQ's copy of it, which the
    watcher then handles, and K8S is left empty."""
    assert await bootstrap(private_bus, replicas=1) == []
    seen: list[tuple[str, str, str]] = []

    async def handler(ev: Event) -> None:
        seen.append((ev.nats_subject, ev.type, ev.subject))
        if len(seen) == 1:
            raise PermanentError("not a pod this watcher knows")

    loop = ConsumerLoop(private_bus, stream="K8S", durable="admission-watcher", handler=handler, fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    try:
        pod = {"kind": "Pod", "metadata": {"name": "r1-a1-0", "namespace": "default",
                                           "labels": {"taugrid.io/run-id": "r1", "taugrid.io/attempt": "1"}}}
        with acting_as(private_bus, "local-cluster"):
            seq = await private_bus.publish(DEFAULT, WatchEvent(type="MODIFIED", object=pod), event_type="pod.modified",
                                            ce_subject="r1", msg_id="local.r1-a1-0.1", family="k8s")
        for _ in range(200):
            letters = await dlq.dead_letters(private_bus, durable="admission-watcher")
            if letters and (await private_bus.js.stream_info("K8S")).state.messages == 0:
                break
            await asyncio.sleep(0.05)
        [letter] = letters
        assert (letter.kind, letter.stream, letter.stream_seq, letter.subject) == ("refused", "K8S", seq, DEFAULT)
        assert (await private_bus.js.stream_info("K8S")).state.messages == 0  # terminated: gone from K8S

        [replayed] = await dlq.replay(private_bus, [letter.seq])
        assert (replayed.seq, replayed.subject) == (letter.seq, DEFAULT)
        for _ in range(200):
            if len(seen) == 2 and (await private_bus.js.stream_info("K8S")).state.messages == 0:
                break
            await asyncio.sleep(0.05)
        assert seen == [(DEFAULT, "pod.modified", "r1"), (DEFAULT, "pod.modified", "r1")]  # the same change again
        assert (await private_bus.js.stream_info("K8S")).state.messages == 0
        assert await dlq.dead_letters(private_bus) == []
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, 10)


async def test_an_earlier_release_s_limits_k8s_is_reported_and_switched_by_update(
        private_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    # what an earlier release made: K8S with limits retention, the admission watcher's durables on it
    await private_bus.js.add_stream(StreamConfig(name="K8S", subjects=["k8s.>"], max_age=7 * 86400.0,
                                                 duplicate_window=120.0))
    for durable, subject in (("admission-watcher", "k8s.*.*.*.*.*"), ("admission-watcher-high", "k8s.*.*.*.*.*.high")):
        await private_bus.js.add_consumer("K8S", ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                                                                filter_subject=subject, max_deliver=8, ack_wait=60.0))
    for subject in (DEFAULT, HIGH, DEFAULT.replace("modified", "deleted")):
        await private_bus.js.publish(subject, b"{}")
    await ack_all(await take(private_bus, "admission-watcher-high", 1))
    await ack_all(await take(private_bus, "admission-watcher", 1))  # the default lane's second is not handled yet
    assert len(await held(private_bus)) == 3  # limits retention: acked or not, all kept

    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream K8S: retention is 'limits', declared 'interest'; not changed" in caplog.text
    assert (await private_bus.js.stream_info("K8S")).config.retention == RetentionPolicy.LIMITS

    assert await bootstrap(private_bus, update=True, replicas=1) == []
    assert (await private_bus.js.stream_info("K8S")).config.retention == RetentionPolicy.INTEREST
    # the switch dropped what both durables had acked; the one still pending stays, and goes once acked
    assert await held(private_bus) == [DEFAULT.replace("modified", "deleted")]
    await ack_all(await take(private_bus, "admission-watcher", 1))
    assert (await private_bus.js.stream_info("K8S")).state.messages == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream K8S" not in caplog.text
