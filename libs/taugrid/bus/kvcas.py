"""One KV record read and written under compare-and-set, with taugrid's errors (no nats exception leaks out).

Invariant: ``save`` succeeds only if nobody wrote the key since the revision the caller read; otherwise it
raises ``Conflict`` (a ``TemporaryError``) and the caller re-reads. Revision 0 means "must not exist yet".
"""

from __future__ import annotations

from typing import TypeVar

import msgspec
import nats

from taugrid.bus.connection import Bus
from taugrid.core.errors import TemporaryError

T = TypeVar("T")


class Conflict(TemporaryError):
    """Someone else wrote the key since it was read: read again and redo the change."""


async def load(bus: Bus, bucket: str, key: str, kind: type[T]) -> tuple[T | None, int]:
    """(decoded value or None, revision; 0 when absent or deleted)."""
    try:
        kv = await bus.kv(bucket)
        entry = await kv.get(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None, 0
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"reading {bucket}/{key} failed: {exc!r}", delay=1.0) from exc
    if not entry.value:
        return None, int(entry.revision or 0)
    return msgspec.json.decode(entry.value, type=kind), int(entry.revision or 0)


async def save(bus: Bus, bucket: str, key: str, value: msgspec.Struct, *, revision: int) -> int:
    """Write ``value`` if the key is still at ``revision``; returns the new revision."""
    data = msgspec.json.encode(value)
    try:
        kv = await bus.kv(bucket)
        if revision == 0:
            return int(await kv.create(key, data))  # nats-py lets create() overwrite a deleted key
        return int(await kv.update(key, data, last=revision))
    except nats.js.errors.KeyWrongLastSequenceError as exc:
        raise Conflict(f"{bucket}/{key} changed since revision {revision}", delay=0.1) from exc
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"writing {bucket}/{key} failed: {exc!r}", delay=1.0) from exc


async def delete(bus: Bus, bucket: str, key: str) -> None:
    try:
        kv = await bus.kv(bucket)
        await kv.delete(key)
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"deleting {bucket}/{key} failed: {exc!r}", delay=1.0) from exc
