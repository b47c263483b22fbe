"""Reading objects from the ``evidence`` object store with taugrid's errors (no nats exception leaks out).

Invariant: a download streams into the caller's file, so memory does not grow with the object; the caller
checks what it expects of the bytes (the store's own chunk digest is checked by nats-py as well).
"""

from __future__ import annotations

from typing import BinaryIO

import nats

from taugrid.bus.connection import Bus
from taugrid.core.errors import NotFound, TemporaryError


async def download(bus: Bus, name: str, dest: BinaryIO) -> int:
    """Write object ``name`` into ``dest``; returns its size. ``NotFound`` if there is no such object,
    ``TemporaryError`` if the bus cannot answer."""
    try:
        obs = await bus.objects()
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
