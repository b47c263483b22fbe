"""The evidence store's object metadata (issue 27): what readers need and no more, still the layout nats-py's
object store reads, one metadata message per object name, against a real nats-server."""

from __future__ import annotations

import base64
import io
import json
import secrets

from taugrid.bus import Bus, objects, streams
from taugrid.bus.topology import OBJECT_STORE


async def _metas(bus: Bus, name: str) -> list[bytes]:
    subject = f"$O.{OBJECT_STORE}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
    sub = await bus.js.subscribe(subject, stream=f"OBJ_{OBJECT_STORE}", ordered_consumer=True)
    try:
        count = (await bus.js.stream_info(f"OBJ_{OBJECT_STORE}", subjects_filter=subject)).state.subjects or {}
        return [(await sub.next_msg(timeout=5)).data for _ in range(count.get(subject, 0))]
    finally:
        await sub.unsubscribe()


async def test_an_objects_metadata_keeps_what_readers_need_and_one_message_a_name(bus: Bus) -> None:
    name = f"runs/meta-{secrets.token_hex(4)}/bundle.json"
    await objects.write(bus, name, b"first", workspace="ws")
    [meta] = await _metas(bus, name)
    info = json.loads(meta)
    assert sorted(info) == ["bucket", "chunks", "digest", "name", "nuid", "size"]
    assert (info["name"], info["bucket"], info["size"], info["chunks"]) == (name, OBJECT_STORE, 5, 1)
    assert info["nuid"].startswith("ws.") and b" " not in meta
    # nats-py's object store reads it as its own (`nats object get` likewise)
    store = await bus.objects()
    got = await store.get_info(name)
    assert (got.size, got.chunks, got.digest, got.mtime, got.options) == (5, 1, info["digest"], None, None)
    assert (await store.get(name)).data == b"first"
    assert await objects.read(bus, name) == b"first"
    sink = io.BytesIO()
    assert await objects.download(bus, name, sink) == 5 and sink.getvalue() == b"first"

    # replaced: the new metadata rolls the old one up, and the old chunks are purged
    old_chunks = f"$O.{OBJECT_STORE}.C.{info['nuid']}"
    assert await streams.count(bus, f"OBJ_{OBJECT_STORE}", old_chunks) == 1
    await objects.write(bus, name, b"second!", workspace="ws")
    assert await streams.count(bus, f"OBJ_{OBJECT_STORE}", old_chunks) == 0
    [meta] = await _metas(bus, name)
    assert json.loads(meta)["size"] == 7 and await objects.read(bus, name) == b"second!"
    assert await objects.remove(bus, name) and await objects.read(bus, name) is None
