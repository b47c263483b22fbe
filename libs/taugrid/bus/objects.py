"""Objects in an object store (``evidence`` unless named), read and written with taugrid's errors (no nats
exception leaks out). Source snapshots have their own store and rules: ``snapshots``.

Invariant: a download streams into the caller's file, so memory does not grow with the object; the caller
checks what it expects of the bytes (the store's own chunk digest is checked by nats-py as well).
"""

from __future__ import annotations

from typing import BinaryIO

import nats

from taugrid.bus.connection import Bus
from taugrid.bus.topology import OBJECT_STORE
from taugrid.core.errors import NotFound, TemporaryError


async def download(bus: Bus, name: str, dest: BinaryIO, *, store: str = OBJECT_STORE) -> int:
    """Write object ``name`` of ``store`` into ``dest``; returns its size. ``NotFound`` if there is no such
    object, ``TemporaryError`` if the bus cannot answer."""
    try:
        obs = await bus.objects(store)
        result = await obs.get(name, writeinto=dest)  # type: ignore[arg-type]
    except nats.js.errors.ObjectNotFoundError as exc:
        raise NotFound(f"object {name!r} is not in the object store") from exc
    except nats.js.errors.NotFoundError as exc:
        raise NotFound(f"the object store does not exist (bootstrap the bus): {exc}") from exc
    except nats.js.errors.DigestMismatchError as exc:
        raise TemporaryError(f"object {name!r} arrived damaged (chunk digest mismatch)") from exc
    except (nats.errors.Error, OSError) as exc:
        raise TemporaryError(f"reading object {name!r} failed: {exc!r}", delay=1.0) from exc
    return int(result.info.size or 0)


async def exists(bus: Bus, name: str) -> bool:
    """Whether object ``name`` is stored (a content-addressed object need not be uploaded twice)."""
    try:
        obs = await bus.objects()
        await obs.get_info(name)
    except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
        return False
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"looking up object {name!r} failed: {exc!r}", delay=1.0) from exc
    return True


async def read(bus: Bus, name: str) -> bytes | None:
    """Object ``name`` in memory (for small objects: bundles, source snapshots), or None when absent."""
    try:
        obs = await bus.objects()
        result = await obs.get(name)
    except (nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError, nats.js.errors.ObjectDeletedError):
        return None
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"object store read of {name} failed: {exc!r}", delay=1.0) from exc
    return bytes(result.data or b"")


async def write(bus: Bus, name: str, data: bytes) -> None:
    """Store ``data`` as object ``name`` (replacing any object of that name)."""
    try:
        obs = await bus.objects()
        await obs.put(name, data)
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"object store write of {name} failed: {exc!r}", delay=1.0) from exc
