"""``kv.values`` lists every live record under a prefix, every time, against a real nats-server.

nats-py's ``kv.keys()`` (what ``kv.values`` used before) now and then answered no keys at all when the server
pushed them before its pending count was read: ``tau list`` showed an empty page in CI. Listing the same
bucket many times in a row is what caught it."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from taugrid.bus import Bus, kv


class Thing(msgspec.Struct):
    name: str
    size: int = 0


async def test_every_listing_holds_every_live_record_under_the_prefix(bus: Bus) -> None:
    top = f"t{uuid.uuid4().hex[:8]}"
    for i in range(5):
        await kv.put(bus, "submissions", f"{top}.a.{i}", msgspec.json.encode(Thing(name=f"a{i}", size=i)))
    await kv.put(bus, "submissions", f"{top}.b.0", msgspec.json.encode(Thing(name="b0")))
    await kv.put(bus, "submissions", f"{top}.a.1", msgspec.json.encode(Thing(name="a1", size=10)))  # newest wins
    await kv.delete(bus, "submissions", f"{top}.a.4")
    await kv.put(bus, "submissions", f"{top}.a.bad", b"not json")  # logged and skipped
    expected = [("a0", 0), ("a1", 10), ("a2", 2), ("a3", 3)]
    for _ in range(60):
        listed = await kv.values(bus, "submissions", Thing, prefix=f"{top}.a.")
        assert sorted((t.name, t.size) for t in listed) == expected
    assert [t.name for t in await kv.values(bus, "submissions", Thing, prefix=f"{top}.b.")] == ["b0"]
    assert await kv.values(bus, "submissions", Thing, prefix=f"{top}.none.") == []


async def test_a_prefix_that_is_not_whole_tokens_is_refused(bus: Bus) -> None:
    with pytest.raises(ValueError, match="must be whole key tokens ending in a dot"):
        await kv.values(bus, "submissions", Thing, prefix="run")
