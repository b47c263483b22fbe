"""The KV writes of ``bus/kv.py`` against a real nats-server: create-once, compare-and-set, and a deleted key
created again (the writes go through ``Bus.replies``; a deleted key's create falls back to nats-py's)."""

from __future__ import annotations

import uuid

import pytest

from taugrid.bus import Bus, kv


async def test_create_once_compare_and_set_and_a_deleted_key_created_again(bus: Bus) -> None:
    key = f"kvw-{uuid.uuid4().hex[:8]}"
    first = await kv.create(bus, "submissions", key, b"one")
    assert first is not None
    assert await kv.create(bus, "submissions", key, b"two") is None  # exists: left alone
    with pytest.raises(kv.Conflict):
        await kv.save(bus, "submissions", key, b"two", revision=0)  # "must not exist yet"
    with pytest.raises(kv.Conflict):
        await kv.save(bus, "submissions", key, b"two", revision=first - 1 if first > 1 else first + 1000)
    second = await kv.save(bus, "submissions", key, b"two", revision=first)
    assert second > first and await kv.get(bus, "submissions", key) == kv.Record(value=b"two", revision=second)
    await kv.delete(bus, "submissions", key)
    assert await kv.get(bus, "submissions", key) is None
    third = await kv.create(bus, "submissions", key, b"three")  # its delete marker is a revision: reused
    assert third is not None and third > second
    assert await kv.get(bus, "submissions", key) == kv.Record(value=b"three", revision=third)
