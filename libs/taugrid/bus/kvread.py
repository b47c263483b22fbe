"""Reading KV buckets: every live value under a key prefix or a key filter, decoded, skipping what cannot be
read; and the newest value among the keys a wildcard matches.

``filtered_values`` and ``last_by_wildcard`` put the key filter in the request *subject* (a named consumer's
create subject, a direct get's subject), never only in the body, so the server's subject permissions can
confine a reader to some keys (``permissions``: people read ``run_state`` and ``ledger`` only under
``run.<their workspace>.>``).
"""

from __future__ import annotations

import logging
import secrets
from typing import TypeVar

import msgspec
import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

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


_DELETED = ("DEL", "PURGE")


async def filtered_values(bus: Bus, bucket: str, kind: type[T], *, key_filter: str,
                          timeout: float = 5.0) -> list[T]:
    """Decoded live values of the keys matching ``key_filter`` (NATS wildcards), read through a short-lived
    named consumer whose create subject carries the filter."""
    stream, pre = f"KV_{bucket}", f"$KV.{bucket}."
    cfg = ConsumerConfig(name=f"kvr-{secrets.token_hex(8)}", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                         inactive_threshold=30.0)
    sub = await bus.guarded(bus.js.subscribe(pre + key_filter, stream=stream, ordered_consumer=True, config=cfg))
    out: list[T] = []
    try:
        info = await sub.consumer_info()
        if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
            return out  # nothing matches (a push consumer may already have delivered what it had)
        while True:
            msg = await sub.next_msg(timeout=timeout)
            if (msg.headers or {}).get("KV-Operation") not in _DELETED and msg.data:
                try:
                    out.append(msgspec.json.decode(msg.data, type=kind))
                except msgspec.ValidationError as exc:
                    log.error("skipping unreadable %s record %s: %s", bucket, msg.subject[len(pre):], exc)
            if msg.metadata.num_pending == 0:
                return out
    finally:
        try:
            await sub.unsubscribe()
        except nats.errors.Error:
            pass  # a closing connection drops it anyway; the server removes it after inactive_threshold


async def last_by_wildcard(bus: Bus, bucket: str, key_filter: str) -> bytes | None:
    """The newest live value among the keys matching ``key_filter`` (one direct get whose subject is the
    filter); None when none matches or the newest was deleted."""
    try:
        msg = await bus.guarded(bus.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key_filter}", direct=True))
    except nats.js.errors.NotFoundError:
        return None
    if (msg.headers or {}).get("KV-Operation") in _DELETED or not msg.data:
        return None
    return bytes(msg.data)
