"""A consumer loop on a real 3-server JetStream cluster (``natsserver.Cluster``, as `tau up --ha` runs it) whose
consumer's leader is SIGKILLed while a handler runs: the ack the handler's return sends lands with the new leader
(the loop sends it again until the server confirms it), so the message is handled once and nothing waits out
``ack_wait``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from taugrid.bus import connect
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.stack import natsserver

ACK_WAIT = 30.0


async def until(check, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if await check():
                return True
        except Exception:  # noqa: BLE001 - the cluster is electing a leader
            pass
        await asyncio.sleep(0.2)
    return False


async def test_an_ack_sent_while_the_consumer_leader_dies_lands_with_the_next_leader(tmp_path: Path) -> None:
    cluster = natsserver.Cluster(tmp_path / "nats")
    cluster.start()
    try:
        bus = await connect(cluster.url, name="recovery")  # a service that may publish node events

        async def provision() -> bool:
            await bus.js.add_stream(StreamConfig(name="FAIL", subjects=["run.>"], num_replicas=3))
            await bus.js.add_consumer("FAIL", ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT,
                                                             ack_wait=ACK_WAIT, max_deliver=5))
            return True

        assert await until(provision, 90), "the cluster never elected a JetStream leader"
        await bus.publish("run.ws.r1.recovery.gave_up", b"{}", event_type="recovery.gave_up", ce_subject="r1",
                          msg_id="r1.1.recovery.gave_up", workspace="ws")
        handling, release = asyncio.Event(), asyncio.Event()
        handled: list[int] = []

        async def handler(ev: Event) -> None:
            handled.append(ev.seq)
            handling.set()
            await release.wait()

        loop = ConsumerLoop(bus, stream="FAIL", durable="d", handler=handler, fetch_timeout=0.5)
        task = asyncio.create_task(loop.run())
        await asyncio.wait_for(handling.wait(), 30)
        leader = (await bus.js.consumer_info("FAIL", "d")).cluster.leader  # type: ignore[union-attr]
        victim = next(n for n in cluster.nodes if n.route.server_name == leader)
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        release.set()  # the handler returns now: its ack goes out while the consumer has no leader

        async def settled() -> bool:
            info = await bus.js.consumer_info("FAIL", "d")
            return info.num_ack_pending == 0 and info.num_pending == 0 and info.cluster.leader != leader

        assert await until(settled, ACK_WAIT - 5), "the ack was lost: the message waits out ack_wait"
        print(f"settled {time.monotonic() - killed:.1f} s after the consumer's leader was killed")
        loop.stopping.set()
        await task
        assert handled == [1], handled
        await bus.close()
    finally:
        cluster.stop()
