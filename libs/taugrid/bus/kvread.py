"""Reading whole KV buckets: every live value under a key prefix, decoded, skipping what cannot be read."""

from __future__ import annotations

import logging
from typing import TypeVar

import msgspec
import nats

from taugrid.bus.connection import Bus

T = TypeVar("T")
log = logging.getLogger("taugrid.bus")


async def values(bus: Bus, bucket: str, kind: type[T], *, prefix: str = "") -> list[T]:
    """Decoded values of the keys starting with ``prefix``. A record that no longer decodes is logged and
    skipped: one bad record must not stop a service from starting or listing."""
    kv = await bus.kv(bucket)
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    out: list[T] = []
    for key in keys:
        if not key.startswith(prefix):
            continue
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue  # deleted between listing and reading
        if not entry.value:
            continue
        try:
            out.append(msgspec.json.decode(entry.value, type=kind))
        except msgspec.ValidationError as exc:
            log.error("skipping unreadable %s record %s: %s", bucket, key, exc)
    return out
