"""Typed helpers for JetStream KV buckets, with taugrid's errors: no nats exception leaks out of here.

Every read goes through ``get`` (the one reader; the bucket handle is cached by ``Bus.kv``) and answers None
for an absent or deleted key. Writes are of three kinds: ``create`` writes a key only if it does not exist
(write-once records), ``save`` is a compare-and-set against the revision the caller read (revision 0: "must
not exist yet") and raises ``Conflict`` when someone wrote in between, and ``put`` overwrites (last writer
wins, for values with a single writer). A bus that cannot answer raises ``TemporaryError``.

``filtered_values`` and ``last_by_wildcard`` put the key filter in the request *subject* (a named consumer's
create subject, a direct get's subject), never only in the body, so the server's subject permissions can
confine a reader to some keys (``permissions``: people read ``run_state`` and ``ledger`` only under
``run.<their workspace>.>``).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import re
import secrets
import zlib
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import msgspec
import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from taugrid.bus.connection import PUBLISH_TIMEOUT_S as _WRITE_TIMEOUT_S
from taugrid.bus.connection import Bus, stored_seq
from taugrid.bus.errors import (
    KEY_ABSENT,
    MISSING,
    NO_RESPONDERS,
    REFUSED,
    TIMEOUT,
    UNAVAILABLE,
    WRONG_LAST,
    conflicted,
    unavailable,
)
from taugrid.bus.metrics import KV_SECONDS, timed
from taugrid.core import wirejson
from taugrid.core.errors import PermissionDenied, TemporaryError

T = TypeVar("T")
log = logging.getLogger("taugrid.bus")
_VALID_KEY = re.compile(r"[-/_=a-zA-Z0-9][-/_=.a-zA-Z0-9]*")  # nats-py's key rule: no leading or trailing dot
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_TTL = "Nats-TTL"  # a per-message TTL in whole seconds (nats-server 2.11; nats-py's KV buckets allow it)
_TTL_DISABLED = 10166  # the server's answer for a bucket made without per-message TTLs (an older nats-py's)

# Buckets whose values are stored gzip-compressed (issue 27). A run record is ~5 KB of JSON that repeats its keys
# in every phase, pod and history entry, ~1.6 KB compressed, rewritten at each of its run's events; the fastest
# level loses little on so small a value. Every reader here inflates, so callers only ever see the JSON, and a
# value stored plain (by an earlier release, or a test that puts bytes) reads as it is: JSON never starts with
# gzip's magic number. A reader outside this module (``nats kv get``) sees the gzip stream. A Struct put there
# is written without its fields at their defaults (``core/wirejson``: a trivial run's record ~1.25 KB compressed
# instead of ~1.9), which every reader gets back by decoding into the Struct, as all of them do.
PACKED_BUCKETS = frozenset({"run_state"})
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_UNPACKED = 64 * 1024 * 1024  # a record is KBs; a stored value inflating past this is refused


class Conflict(TemporaryError):
    """Someone else wrote the key since it was read (or created it first): read again and redo the change."""


class Record(msgspec.Struct, frozen=True):
    """One stored value and its KV revision."""

    value: bytes
    revision: int


def _encode(value: msgspec.Struct | bytes, bucket: str = "") -> bytes:
    if bucket not in PACKED_BUCKETS:
        return value if isinstance(value, bytes) else msgspec.json.encode(value)
    data = value if isinstance(value, bytes) else wirejson.encode(value)
    return gzip.compress(data, compresslevel=1, mtime=0)


def unpack(bucket: str, stored: bytes) -> bytes:
    """A value as its writer gave it: inflated when ``bucket`` stores compressed values and this one is."""
    if bucket not in PACKED_BUCKETS or not stored.startswith(_GZIP_MAGIC):
        return stored
    try:
        return inflate_bounded(stored, _MAX_UNPACKED, wbits=16 + zlib.MAX_WBITS)  # gzip framing
    except ValueError as exc:
        raise ValueError(f"a compressed {bucket} value {exc}") from exc


def inflate_bounded(stored: bytes, limit: int, *, wbits: int = zlib.MAX_WBITS) -> bytes:
    """``stored`` inflated, refused (ValueError) when it does not inflate whole within ``limit`` bytes."""
    inflate = zlib.decompressobj(wbits=wbits)
    try:
        out = inflate.decompress(stored, limit)
    except zlib.error as exc:
        raise ValueError(f"that does not inflate: {exc}") from exc
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(f"cut short or inflating past {limit} bytes")
    return out


_GONE_OPERATIONS = ("DEL", "PURGE")  # the KV-Operation header of a delete or purge marker


async def _latest(bus: Bus, bucket: str, key: str) -> Record | None | bool:
    """The key's latest value by a direct get sent through ``Bus.replies`` (nats-py's request and message lift
    cost about twice the client CPU, and every stage reads KV per run: issue 30); None when absent or deleted;
    False when this answer cannot say (no direct gets on the bucket, an unexpected status): the caller then asks
    through nats-py, which raises what it meets as before."""
    subject = f"$KV.{bucket}.{key}"
    try:
        msg = await bus.replies.request(f"$JS.API.DIRECT.GET.KV_{bucket}.{subject}", b"", timeout=10.0)
    except NO_RESPONDERS:
        return False
    headers = msg.headers or {}
    status = headers.get("Status", "")
    if status == "404":
        return None
    if status or headers.get("Nats-Subject") != subject:
        return False
    if headers.get("KV-Operation") in _GONE_OPERATIONS:
        return None
    return Record(value=unpack(bucket, msg.data or b""), revision=int(headers.get("Nats-Sequence") or 0))


async def get(bus: Bus, bucket: str, key: str, *, revision: int | None = None) -> Record | None:
    """The key's value (at ``revision``, else the latest), or None when it is absent or deleted."""
    with timed(KV_SECONDS, bucket, "get") as timing:
        try:
            if revision is None and _VALID_KEY.fullmatch(key) and not key.endswith("."):
                latest = await _latest(bus, bucket, key)
                if latest is not False:
                    if latest is None:
                        timing.outcome = "absent"
                    return latest  # type: ignore[return-value]
            kv = await bus.kv(bucket)
            entry = await kv.get(key, revision=revision)
        except KEY_ABSENT:
            timing.outcome = "absent"
            return None
        except UNAVAILABLE as exc:
            raise unavailable(f"reading {bucket}/{key}", exc) from exc
    return Record(value=unpack(bucket, entry.value or b""), revision=int(entry.revision or 0))


async def load(bus: Bus, bucket: str, key: str, kind: type[T]) -> tuple[T | None, int]:
    """(decoded value or None, revision; 0 when absent or deleted): what ``save`` needs to write it back."""
    found = await get(bus, bucket, key)
    if found is None:
        return None, 0
    if not found.value:
        return None, found.revision  # an emptied key: still at a revision a compare-and-set must name
    return msgspec.json.decode(found.value, type=kind), found.revision


async def create(bus: Bus, bucket: str, key: str, value: msgspec.Struct | bytes, *,
                 ttl: float | None = None) -> int | None:
    """Write a key that must not exist yet; its revision, or None when it exists already (left alone).
    ``ttl``: seconds after which the server removes the key, leaving no marker (a bucket made without
    per-message TTLs keeps it)."""
    with timed(KV_SECONDS, bucket, "create") as timing:
        try:
            return await _create(bus, bucket, key, _encode(value, bucket), ttl=ttl)
        except WRONG_LAST:
            timing.outcome = "exists"
            return None
        except UNAVAILABLE as exc:
            raise unavailable(f"creating {bucket}/{key}", exc) from exc


async def _create(bus: Bus, bucket: str, key: str, data: bytes, *, ttl: float | None = None) -> int:
    """Write a key that must not exist (``WRONG_LAST`` when it does): first as a plain write
    expecting no revision, through ``Bus.replies``; only when that fails, nats-py's ``create``, which reuses a
    deleted or purged key (its delete marker is a revision) and raises for a live one."""
    try:
        return await _write(bus, bucket, key, data, revision=0, ttl=ttl)
    except REFUSED as exc:
        if not conflicted(exc):
            raise
    kv = await bus.kv(bucket)
    try:
        return int(await kv.create(key, data, msg_ttl=ttl))
    except REFUSED as exc:
        if not (ttl and _ttl_refused(bucket, exc)):
            raise
    return int(await kv.create(key, data))


def _ttl_refused(bucket: str, exc: BaseException) -> bool:
    """Whether ``exc`` says the bucket takes no per-message TTL (made by an earlier release); logged, since
    its keys then stay until deleted (``bootstrap --update`` allows TTLs)."""
    if getattr(exc, "err_code", None) != _TTL_DISABLED:
        return False
    log.warning("bucket %s was made without per-message TTLs: its keys are kept until deleted "
                "(python -m taugrid.bus.bootstrap --update allows them)", bucket)
    return True


async def _write(bus: Bus, bucket: str, key: str, data: bytes, *, revision: int, ttl: float | None = None,
                 extra: dict[str, str] | None = None) -> int:
    """What nats-py's ``update`` sends (the key's expected last revision, 0: none), through the bus's cheaper
    request (``Bus.replies``); a stale revision raises ``APIError`` with a wrong-last code (``conflicted``).
    ``revision`` -1 expects nothing (a purge); ``extra``: more headers."""
    if not _VALID_KEY.fullmatch(key) or key[-1] == ".":
        raise nats.js.errors.InvalidKeyError(key)
    kv = await bus.kv(bucket)
    headers = {**({_EXPECTED_LAST: str(revision)} if revision >= 0 else {}), **(extra or {})}
    if ttl:
        headers[_TTL] = str(max(1, int(ttl)))
    reply = await bus.replies.request(f"{getattr(kv, '_pre', f'$KV.{bucket}.')}{key}", data,
                                      headers=headers, timeout=_WRITE_TIMEOUT_S)
    try:
        return stored_seq(reply)
    except REFUSED as exc:
        if not (ttl and _ttl_refused(bucket, exc)):
            raise
    return await _write(bus, bucket, key, data, revision=revision, extra=extra)


async def save(bus: Bus, bucket: str, key: str, value: msgspec.Struct | bytes, *, revision: int) -> int:
    """Write ``value`` if the key is still at ``revision`` (0: still absent); returns the new revision."""
    data = _encode(value, bucket)
    with timed(KV_SECONDS, bucket, "save") as timing:
        try:
            if revision == 0:
                return await _create(bus, bucket, key, data)
            return await _write(bus, bucket, key, data, revision=revision)
        except UNAVAILABLE as exc:
            if conflicted(exc):  # nats-py's class, or a stale revision's code as its ``update`` reads it
                timing.outcome = "conflict"
                raise Conflict(f"{bucket}/{key} changed since revision {revision}", delay=0.1) from exc
            raise unavailable(f"writing {bucket}/{key}", exc) from exc


async def put(bus: Bus, bucket: str, key: str, value: msgspec.Struct | bytes, *, ttl: float | None = None) -> int:
    """Overwrite the key whatever it holds; returns the new revision. ``ttl``: as for ``create``."""
    with timed(KV_SECONDS, bucket, "put"):
        try:
            if ttl:
                return await _write(bus, bucket, key, _encode(value, bucket), revision=-1, ttl=ttl)
            kv = await bus.kv(bucket)
            return int(await kv.put(key, _encode(value, bucket)))
        except UNAVAILABLE as exc:
            raise unavailable(f"writing {bucket}/{key}", exc) from exc


async def purge(bus: Bus, bucket: str, key: str, *, marker_ttl: float) -> None:
    """Remove the key with every revision, leaving a purge marker that watchers see as a deletion and that the
    server itself removes after ``marker_ttl`` seconds, so a key written once per run leaves nothing behind
    (``delete``'s marker stays forever: a subject the server indexes, issue 27). A bucket made without
    per-message TTLs keeps the marker."""
    with timed(KV_SECONDS, bucket, "purge"):
        try:
            await _write(bus, bucket, key, b"", revision=-1, ttl=marker_ttl,
                         extra={"KV-Operation": "PURGE", "Nats-Rollup": "sub"})
        except UNAVAILABLE as exc:
            raise unavailable(f"purging {bucket}/{key}", exc) from exc


async def delete(bus: Bus, bucket: str, key: str) -> None:
    """Delete the key; an absent key is already deleted."""
    with timed(KV_SECONDS, bucket, "delete") as timing:
        try:
            kv = await bus.kv(bucket)
            await kv.delete(key)
        except KEY_ABSENT:
            timing.outcome = "absent"
        except UNAVAILABLE as exc:
            raise unavailable(f"deleting {bucket}/{key}", exc) from exc


async def values(bus: Bus, bucket: str, kind: type[T], *, prefix: str = "",
                 decode: Callable[[bytes], T] | None = None) -> list[T]:
    """Decoded live values of the keys starting with ``prefix`` ("" or whole tokens ending in a dot, e.g.
    ``run.``). A record that no longer decodes is logged and skipped: one bad record must not stop a service
    from starting or listing.

    Read through one filtered consumer (``filtered_values``), not nats-py's ``kv.keys()`` plus a get per key:
    ``keys()`` decides it has seen everything by asking the consumer's pending count while its callbacks are
    still held back, so when the server had already pushed every key it returns none (``tau list`` and the
    portal then showed no runs, now and then, in CI). ``decode``: how a value is read when it is not ``kind``'s
    plain JSON (the ledger's compressed values)."""
    if prefix and not prefix.endswith("."):
        raise ValueError(f"prefix {prefix!r} must be whole key tokens ending in a dot (e.g. 'run.'), or empty")
    return await filtered_values(bus, bucket, kind, key_filter=f"{prefix}>", decode=decode)


_DELETED = ("DEL", "PURGE")


async def filtered_values(bus: Bus, bucket: str, kind: type[T], *, key_filter: str,
                          timeout: float = 5.0, decode: Callable[[bytes], T] | None = None) -> list[T]:
    """Decoded live values of the keys matching ``key_filter`` (NATS wildcards), read through a short-lived
    named consumer whose create subject carries the filter; ``decode`` reads a value (default: ``kind``'s JSON)."""
    with timed(KV_SECONDS, bucket, "filtered"):
        return await _filtered_values(bus, bucket, kind, key_filter=key_filter, timeout=timeout,
                                      decode=decode or (lambda data: msgspec.json.decode(data, type=kind)))


async def _filtered_values(bus: Bus, bucket: str, kind: type[T], *, key_filter: str, timeout: float,
                           decode: Callable[[bytes], T]) -> list[T]:
    stream, pre = f"KV_{bucket}", f"$KV.{bucket}."
    cfg = ConsumerConfig(name=f"kvr-{secrets.token_hex(16)}", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
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
                    out.append(decode(unpack(bucket, msg.data)))
                except (msgspec.DecodeError, ValueError) as exc:  # ValidationError and an uninflatable value too
                    log.error("skipping unreadable %s record %s: %s", bucket, msg.subject[len(pre):], exc)
            if msg.metadata.num_pending == 0:
                return out
    finally:
        with contextlib.suppress(*UNAVAILABLE):
            await sub.unsubscribe()
        # deleted at once, not left to its inactive threshold: a polling `tau list` would pile them up
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
            await bus.guarded(bus.js.delete_consumer(stream, cfg.name or ""))


class _KeyCounts(msgspec.Struct):
    subjects: dict[str, int] = msgspec.field(default_factory=dict)


class _KeyCountsAnswer(msgspec.Struct):
    state: _KeyCounts = msgspec.field(default_factory=_KeyCounts)
    error: dict[str, object] | None = None


async def _key_subjects(bus: Bus, bucket: str, key_filter: str) -> dict[str, int]:
    """The bucket's subjects matching ``key_filter`` with their message counts, from the stream's per-subject state
    (one request, whatever the number of keys). Sent through ``Bus.replies`` and decoded into the subject counts
    alone, not into nats-py's whole ``StreamInfo`` (the run-record projection asks once a run, issue 30, as
    ``streams.count`` does); an error answer is asked again through nats-py, which raises it (``MISSING`` for a
    missing bucket) as before."""
    subject = f"$KV.{bucket}.{key_filter}"
    answer = await bus.replies.request(f"$JS.API.STREAM.INFO.KV_{bucket}",
                                       msgspec.json.encode({"subjects_filter": subject}), timeout=10.0)
    counted = msgspec.json.decode(answer.data, type=_KeyCountsAnswer)
    if counted.error is None:
        return counted.state.subjects
    info = await bus.guarded(bus.js.stream_info(f"KV_{bucket}", subjects_filter=subject))
    return info.state.subjects or {}


async def count_keys(bus: Bus, bucket: str, key_filter: str) -> int:
    """How many keys match ``key_filter`` (NATS wildcards), deleted ones included, from the stream's per-subject
    state (one request, whatever the number of keys)."""
    with timed(KV_SECONDS, bucket, "count"):
        try:
            return len(await _key_subjects(bus, bucket, key_filter))
        except MISSING:
            return 0
        except UNAVAILABLE as exc:
            raise unavailable(f"counting {bucket}/{key_filter}", exc) from exc


async def matching_keys(bus: Bus, bucket: str, key_filter: str) -> list[str]:
    """The keys matching ``key_filter`` (NATS wildcards), deleted ones included, from the stream's per-subject
    state (one request, whatever the number of keys), sorted."""
    with timed(KV_SECONDS, bucket, "keys"):
        try:
            subjects = await _key_subjects(bus, bucket, key_filter)
        except MISSING:
            return []
        except UNAVAILABLE as exc:
            raise unavailable(f"listing {bucket}/{key_filter}", exc) from exc
    prefix = len(f"$KV.{bucket}.")
    return sorted(subject[prefix:] for subject in subjects)


async def newest_key(bus: Bus, bucket: str, key_filter: str) -> str | None:
    """The key written last among those matching ``key_filter`` (NATS wildcards), deleted ones included; None when
    none matches. One direct get whose subject is the filter, sent through ``Bus.replies``: the server answers it
    from its subject index, where ``matching_keys``' stream-info request also builds the stream's whole state and
    config (issue 30: about twice the server's CPU with 1,000 workspaces' keys, asked twice a run). An answer this
    cannot read is asked again through nats-py, which raises what it meets."""
    with timed(KV_SECONDS, bucket, "newest") as timing:
        stream, subject = f"KV_{bucket}", f"$KV.{bucket}.{key_filter}"
        try:
            try:
                msg = await bus.replies.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=10.0)
            except NO_RESPONDERS:  # no direct gets on the bucket, or no bucket: the stream's own get tells which
                found = (await bus.guarded(bus.js.get_last_msg(stream, subject))).subject or ""
            else:
                headers = msg.headers or {}
                if headers.get("Status") == "404":
                    timing.outcome = "absent"
                    return None
                found = "" if headers.get("Status") else headers.get("Nats-Subject", "")
                if not found:
                    found = (await bus.guarded(bus.js.get_last_msg(stream, subject, direct=True))).subject or ""
        except MISSING:
            timing.outcome = "absent"
            return None
        except UNAVAILABLE as exc:
            raise unavailable(f"reading {bucket}/{key_filter}", exc) from exc
    return found[len(f"$KV.{bucket}."):] or None


async def last_by_wildcard(bus: Bus, bucket: str, key_filter: str) -> bytes | None:
    """The newest live value among the keys matching ``key_filter`` (one direct get whose subject is the
    filter); None when none matches or the newest was deleted. ``TemporaryError`` when the bus cannot answer."""
    with timed(KV_SECONDS, bucket, "last") as timing:
        found = await _last_by_wildcard(bus, bucket, key_filter)
        if found is None:
            timing.outcome = "absent"
        return found


async def _last_by_wildcard(bus: Bus, bucket: str, key_filter: str) -> bytes | None:
    try:
        msg = await bus.guarded(bus.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key_filter}", direct=True))
    except MISSING:
        return None
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {bucket}/{key_filter}", exc) from exc
    if (msg.headers or {}).get("KV-Operation") in _DELETED or not msg.data:
        return None
    return unpack(bucket, bytes(msg.data))


async def updates(bus: Bus, bucket: str, key: str, *, idle: float = 1.0) -> AsyncIterator[Record | None]:
    """Every new value of ``key`` from now on; None after ``idle`` seconds without one (so the caller can
    check whether to stop). Raises ``TemporaryError`` when the bus goes away."""
    try:
        kv = await bus.kv(bucket)
        watcher = await kv.watch(key, include_history=False)
    except UNAVAILABLE as exc:
        raise unavailable(f"watching {bucket}/{key}", exc) from exc
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=idle)
            except TIMEOUT:
                yield None
                continue
            except UNAVAILABLE as exc:
                raise unavailable(f"watching {bucket}/{key}", exc) from exc
            if entry is not None and entry.value:
                yield Record(value=unpack(bucket, entry.value), revision=int(entry.revision or 0))
    finally:
        with contextlib.suppress(*UNAVAILABLE):  # the connection is gone already
            await watcher.stop()


CAUGHT_UP = ("", None)  # what ``watch`` yields once it has handed out every value stored when it started


async def watch(bus: Bus, bucket: str, key_filter: str) -> AsyncIterator[tuple[str, bytes | None]]:
    """Every key matching ``key_filter`` (NATS wildcards) with its current value, then every change as it is
    stored, as ``(key, value)``; ``value`` is None for a deleted key. ``CAUGHT_UP`` marks the end of the current
    values. It subscribes through a named consumer whose create subject carries the filter, so a person whose
    permissions cover only some keys (``run.<ws>.>`` in ``run_state``) may watch those. ``TemporaryError`` when
    the bus goes away."""
    stream, pre = f"KV_{bucket}", f"$KV.{bucket}."
    cfg = ConsumerConfig(name=f"kvw-{secrets.token_hex(16)}", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                         inactive_threshold=30.0)
    try:
        sub = await bus.guarded(bus.js.subscribe(pre + key_filter, stream=stream, ordered_consumer=True,
                                                 config=cfg))
    except UNAVAILABLE as exc:
        raise unavailable(f"watching {bucket}/{key_filter}", exc) from exc
    try:
        info = await sub.consumer_info()
        caught_up = info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq)
        if caught_up:
            yield CAUGHT_UP
        while True:
            try:
                msg = await sub.next_msg(timeout=None)
            except UNAVAILABLE as exc:
                raise unavailable(f"watching {bucket}/{key_filter}", exc) from exc
            deleted = (msg.headers or {}).get("KV-Operation") in _DELETED or not msg.data
            yield msg.subject[len(pre):], None if deleted else unpack(bucket, bytes(msg.data))
            if not caught_up and msg.metadata.num_pending == 0:
                caught_up = True
                yield CAUGHT_UP
    finally:
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
            await sub.unsubscribe()
        with contextlib.suppress(*UNAVAILABLE, PermissionDenied):
            await bus.guarded(bus.js.delete_consumer(stream, cfg.name or ""))
