"""Objects in an object store (``evidence`` unless named), read and written with taugrid's errors (no nats
exception leaks out). Source snapshots have their own store and rules: ``snapshots``.

Invariant: a download streams into the caller's file, so memory does not grow with the object; the caller
checks what it expects of the bytes (the store's own chunk digest is checked by nats-py as well).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
from typing import BinaryIO

from nats.js.api import ConsumerConfig, DeliverPolicy, ObjectInfo

from taugrid.bus.connection import Bus
from taugrid.bus.errors import DAMAGED, MISSING, OBJECT_GONE, TIMEOUT, UNAVAILABLE, unavailable
from taugrid.bus.metrics import OBJECT_SECONDS, timed
from taugrid.bus.topology import OBJECT_STORE
from taugrid.core.errors import NotFound, PermissionDenied, TemporaryError
from taugrid.core.ids import token

_CHUNK = 128 * 1024  # nats-py's default chunk size
_READ_FAILED: tuple[type[Exception], ...] = (*UNAVAILABLE, OSError)  # the bus, or the file written into
DOWNLOAD_TIMEOUT_S = 60.0  # a snapshot is at most 64 MiB: seconds even on a loaded machine


async def download(bus: Bus, name: str, dest: BinaryIO, *, store: str = OBJECT_STORE) -> int:
    """Write object ``name`` of ``store`` into ``dest``; returns its size. ``NotFound`` if there is no such
    object, ``TemporaryError`` if the bus cannot answer."""
    with timed(OBJECT_SECONDS, store, "download") as timing:
        try:
            return await _download(bus, name, dest, store=store)
        except NotFound:
            timing.outcome = "absent"
            raise


async def _download(bus: Bus, name: str, dest: BinaryIO, *, store: str) -> int:
    try:
        obs = await bus.objects(store)
        # nats-py reads the chunks from a subscription with no timeout: bounded here, so a read whose chunks never
        # come (seen while services were SIGKILLed around it) fails and is retried instead of hanging its handler
        result = await asyncio.wait_for(obs.get(name, writeinto=dest), DOWNLOAD_TIMEOUT_S)  # type: ignore[arg-type]
    except TIMEOUT as exc:
        raise TemporaryError(f"reading object {name!r} timed out ({exc!r}; a whole read may take "
                             f"{DOWNLOAD_TIMEOUT_S:.0f}s)", delay=1.0) from exc
    except OBJECT_GONE as exc:
        raise NotFound(f"object {name!r} is not in the object store") from exc
    except MISSING as exc:
        raise NotFound(f"the object store does not exist (bootstrap the bus): {exc}") from exc
    except DAMAGED as exc:
        raise TemporaryError(f"object {name!r} arrived damaged (chunk digest mismatch)") from exc
    except _READ_FAILED as exc:
        raise unavailable(f"reading object {name!r}", exc) from exc
    return int(result.info.size or 0)


async def exists(bus: Bus, name: str) -> bool:
    """Whether object ``name`` is stored (a content-addressed object need not be uploaded twice)."""
    with timed(OBJECT_SECONDS, OBJECT_STORE, "exists") as timing:
        found = await _exists(bus, name)
        if not found:
            timing.outcome = "absent"
        return found


async def _exists(bus: Bus, name: str) -> bool:
    try:
        obs = await bus.objects()
        await obs.get_info(name)
    except OBJECT_GONE:
        return False
    except UNAVAILABLE as exc:
        raise unavailable(f"looking up object {name!r}", exc) from exc
    return True


async def read(bus: Bus, name: str) -> bytes | None:
    """Object ``name`` in memory (bundles, attempt logs, kept outputs), or None when absent. Its chunks are
    read through a named consumer whose create subject names the chunk subject, so a person may read the
    objects ``write`` stored under their workspaces and no others; the content is checked against the
    object's digest."""
    with timed(OBJECT_SECONDS, OBJECT_STORE, "read") as timing:
        data = await _read(bus, name)
        if data is None:
            timing.outcome = "absent"
        return data


async def _read(bus: Bus, name: str) -> bytes | None:
    try:
        await bus.objects()  # the store exists
        meta = await bus.guarded(bus.js.get_last_msg(f"OBJ_{OBJECT_STORE}", _meta_subject(name), direct=True))
    except MISSING:
        return None
    except UNAVAILABLE as exc:
        raise unavailable(f"object store read of {name}", exc) from exc
    info = ObjectInfo.from_response(json.loads(meta.data or b"{}"))
    if info.deleted:
        return None
    if not info.chunks:
        return b""
    cfg = ConsumerConfig(name=f"obj-{secrets.token_hex(16)}", deliver_policy=DeliverPolicy.ALL,
                         inactive_threshold=30.0)
    parts: list[bytes] = []
    try:
        sub = await bus.guarded(bus.js.subscribe(f"$O.{OBJECT_STORE}.C.{info.nuid}", stream=f"OBJ_{OBJECT_STORE}",
                                                 ordered_consumer=True, config=cfg))
        try:
            while len(parts) < info.chunks:
                parts.append(bytes((await sub.next_msg(timeout=10)).data))
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                await sub.unsubscribe()
            with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
                await bus.guarded(bus.js.delete_consumer(f"OBJ_{OBJECT_STORE}", cfg.name or ""))
    except UNAVAILABLE as exc:
        raise unavailable(f"object store read of {name}", exc) from exc
    data = b"".join(parts)
    if info.digest != _digest(data):
        raise TemporaryError(f"object {name!r} arrived damaged (digest mismatch)", delay=1.0)
    return data


def _meta_subject(name: str) -> str:
    return f"$O.{OBJECT_STORE}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


async def write(bus: Bus, name: str, data: bytes, *, workspace: str) -> None:
    """Store ``data`` as object ``name`` (replacing any object of that name), its chunks under
    ``$O.evidence.C.<workspace>.<nuid>`` so people's permissions can confine reads to their workspaces
    (the layout nats-py's object store reads; only its chunk subject names the workspace)."""
    with timed(OBJECT_SECONDS, OBJECT_STORE, "write"):
        await _write(bus, name, data, workspace=workspace)


async def _write(bus: Bus, name: str, data: bytes, *, workspace: str) -> None:
    nuid = f"{token(workspace)}.{secrets.token_hex(11)}"
    chunks = f"$O.{OBJECT_STORE}.C.{nuid}"
    try:
        obs = await bus.objects()
        try:
            old = await obs.get_info(name)
        except OBJECT_GONE:
            old = None
        count = 0
        for offset in range(0, len(data), _CHUNK):
            await bus.guarded(bus.js.publish(chunks, data[offset:offset + _CHUNK]))
            count += 1
        # What a reader needs of the metadata, nats-py's and the nats CLI's included (issue 27: ~120 B of every
        # object): no ``mtime`` (the message's own stored time says when), no ``options`` (the default chunk
        # size), no ``deleted: false``, compact JSON; and the rollup header only when an older metadata message
        # is there to roll up.
        meta = {"name": name, "bucket": OBJECT_STORE, "nuid": nuid, "size": len(data), "chunks": count,
                "digest": _digest(data)}
        await bus.guarded(bus.js.publish(_meta_subject(name), json.dumps(meta, separators=(",", ":")).encode(),
                                         headers={"Nats-Rollup": "sub"} if old is not None else None))
        if old is not None and old.nuid != nuid:
            await bus.js.purge_stream(f"OBJ_{OBJECT_STORE}", subject=f"$O.{OBJECT_STORE}.C.{old.nuid}")
    except UNAVAILABLE as exc:
        raise unavailable(f"object store write of {name}", exc) from exc


async def remove(bus: Bus, name: str) -> bool:
    """Delete object ``name`` of the evidence store, chunks and metadata (nats-py's delete leaves a ~300-byte
    deleted marker per object, which nothing here reads: purged too, so an archived run leaves no bytes in the
    store); False when there is none. Used once its copy in an archive is verified."""
    with timed(OBJECT_SECONDS, OBJECT_STORE, "delete"):
        try:
            obs = await bus.objects()
            await bus.guarded(obs.delete(name))
            await bus.guarded(bus.js.purge_stream(f"OBJ_{OBJECT_STORE}", subject=_meta_subject(name)))
        except (*OBJECT_GONE, *MISSING):
            return False
        except UNAVAILABLE as exc:
            raise unavailable(f"object store delete of {name}", exc) from exc
        return True
