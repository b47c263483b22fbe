"""A stage's default lane yields to its high lane (``ConsumerLoop.yield_to``), over a real nats-server: with a
backlog in both lanes, the default lane's loop fetches nothing while the high lane's durable has a backlog, so
every high-lane event is handed to the handler before the first default-lane one; without the yield, the two
backlogs interleave (the case below that shows the check can fail).

The loops run on two durables of the LOGS stream (its messages carry no service source to check), as a stage's
two lanes run on theirs."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from taugrid.bus import Bus
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.topology import ConsumerSpec

BACKLOG = 100


async def handled_order(bus: Bus, *, yielding: bool) -> list[str]:
    """The lanes of the backlog's events in the order the handler was handed them."""
    tag = uuid.uuid4().hex[:8]
    for lane in ("high", "default"):  # log.<workspace>.<run>.<attempt>: a run of its own per event
        await ensure_consumer(bus, ConsumerSpec(f"yield-{tag}-{lane}", "LOGS", [f"log.yield{tag}{lane}.*.1"],
                                                ack_wait=10))
        for i in range(BACKLOG):
            await bus.js.publish(f"log.yield{tag}{lane}.{lane}-{i}.1", f"{lane} {i}".encode(),
                                 headers={"ce-subject": f"{lane}-{i}"})
    order: list[str] = []

    async def handler(ev: Event) -> None:
        order.append(ev.subject.split("-")[0])
        await asyncio.sleep(0.02)  # some work, so a loop that fetched keeps its events in flight a while

    high = ConsumerLoop(bus, stream="LOGS", durable=f"yield-{tag}-high", handler=handler, fetch_timeout=0.2)
    default = ConsumerLoop(bus, stream="LOGS", durable=f"yield-{tag}-default", handler=handler, fetch_timeout=0.2)
    if yielding:
        default.yield_to(high)
    tasks = [asyncio.create_task(high.run())]
    while not order:  # the high lane's first fetch is in: it has found its backlog
        await asyncio.sleep(0.001)
    tasks.append(asyncio.create_task(default.run()))
    try:
        async with asyncio.timeout(30):
            while high.handled + default.handled < 2 * BACKLOG:
                await asyncio.sleep(0.02)
    finally:
        high.stopping.set()
        default.stopping.set()
        await asyncio.gather(*tasks)
    return order


@pytest.mark.parametrize("yielding", [True, False])
async def test_the_default_lane_fetches_only_once_the_high_lane_has_no_backlog(bus: Bus, yielding: bool) -> None:
    order = await handled_order(bus, yielding=yielding)
    assert sorted(order) == ["default"] * BACKLOG + ["high"] * BACKLOG  # every event handled once
    last_high, first_default = max(i for i, lane in enumerate(order) if lane == "high"), order.index("default")
    if yielding:
        assert (last_high, first_default) == (BACKLOG - 1, BACKLOG)
    else:  # both lanes fetched freely: the backlogs interleave
        assert first_default < last_high


async def test_a_stopped_high_lane_never_holds_the_default_lane_back(bus: Bus) -> None:
    async def handler(ev: Event) -> None:
        del ev

    high = ConsumerLoop(bus, stream="LOGS", durable="unused", handler=handler)
    assert high.drained.is_set()  # before its first fetch: nothing to yield to yet
    high.drained.clear()
    high.stopping.set()
    await high._loop(psub=None)  # stopping at once: the loop's end marks it drained
    assert high.drained.is_set()


async def test_a_closed_gate_holds_every_fetch_until_it_opens(bus: Bus) -> None:
    """``ConsumerLoop(gate=…)``: a returning site's SITE_IN consumer fetches nothing until its lease is renewed
    (``LocalCluster.lease_held``); then the backlog is handled as ever."""
    tag = uuid.uuid4().hex[:8]
    await ensure_consumer(bus, ConsumerSpec(f"gate-{tag}", "LOGS", [f"log.gate{tag}.*.1"], ack_wait=10))
    for i in range(3):
        await bus.js.publish(f"log.gate{tag}.r{i}.1", b"x", headers={"ce-subject": f"r{i}"})
    handled: list[str] = []

    async def handler(ev: Event) -> None:
        handled.append(ev.subject)

    gate = asyncio.Event()
    loop = ConsumerLoop(bus, stream="LOGS", durable=f"gate-{tag}", handler=handler, fetch_timeout=0.1, gate=gate)
    task = asyncio.create_task(loop.run())
    try:
        await asyncio.sleep(0.4)  # four of its fetch timeouts: it looked at the gate again and fetched nothing
        assert handled == []
        gate.set()
        async with asyncio.timeout(10):
            while len(handled) < 3:
                await asyncio.sleep(0.02)
        assert sorted(handled) == ["r0", "r1", "r2"]
    finally:
        loop.stopping.set()
        await task
