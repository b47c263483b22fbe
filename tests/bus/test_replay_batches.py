"""History in batches against a real nats-server: every stored event once, in stream order, with its stream
sequence, and `tau events --output json`'s JSON Lines equal to each event's ``to_json``."""

from __future__ import annotations

import asyncio
import json
import uuid

from taugrid.bus import Bus, replay
from taugrid.cli.views import event_json_lines
from taugrid.core.contracts import CancelRequested


async def _emit_many(bus: Bus, ws: str, count: int) -> None:
    # run ids unique to the test: message ids (`<run>.<attempt>.<type>`) are deduplicated across workspaces
    await asyncio.gather(*(bus.emit(workspace=ws, run_id=f"{ws}-r{i}", attempt=1, event_type="cancel.requested",
                                    payload=CancelRequested(reason=f"n{i}")) for i in range(count)))


async def test_history_comes_in_fetched_batches_in_stream_order_with_stream_sequences(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 2500)
    got = [batch async for batch in replay.batches(bus, f"run.{ws}.>", batch=1000)]
    assert [len(b) for b in got] == [1000, 1000, 500]
    events = [ev for b in got for ev in b]
    stored = await replay.replay(bus, stream="RUNS", subject=f"run.{ws}.>")  # nats-py's own metadata parse
    assert [ev.seq for ev in events] == [m.metadata.sequence.stream for m in stored]
    assert sorted(ev.subject for ev in events) == sorted(f"{ws}-r{i}" for i in range(2500))
    assert [ev async for ev in replay.follow(bus, f"run.{ws}.>")] == events  # follow reads the same path


async def test_a_filter_with_no_history_yields_no_batch(bus: Bus) -> None:
    assert [b async for b in replay.batches(bus, f"run.w{uuid.uuid4().hex[:6]}.>")] == []


async def test_json_lines_equal_each_events_to_json(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:6]}"
    await _emit_many(bus, ws, 3)
    [events] = [b async for b in replay.batches(bus, f"run.{ws}.>")]
    lines = event_json_lines(events).decode().splitlines()
    assert [json.loads(line) for line in lines] == [ev.to_json() for ev in events]
    assert sorted(json.loads(line)["data"]["reason"] for line in lines) == ["n0", "n1", "n2"]
