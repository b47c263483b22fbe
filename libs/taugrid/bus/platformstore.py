"""The platform policy in the ``platform`` KV bucket, versioned by KV revision.

Every resolved run records the revision it was resolved against; old revisions stay readable (history 64).
The stored revision is the one source of truth for the platform's people too: writers that edit what they read
(``tau platform apply``, ``tau admin user``) put with the revision they read, so a write in between is never
overwritten unseen (``Conflict``: read again and redo the change).
Beside it, ``local_user`` names the embedded stack's own person (written by ``tau up``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from nats.js.kv import KeyValue

from taugrid.bus.connection import Bus
from taugrid.bus.errors import KEY_ABSENT, TIMEOUT, WRONG_LAST
from taugrid.bus.kv import Conflict
from taugrid.bus.metrics import KV_SECONDS, timed
from taugrid.core.errors import TemporaryError

KEY = "current"


async def put_text(bus: Bus, text: str, *, revision: int | None = None) -> int:
    """Store ``text`` as the next revision; with ``revision``, only if the key is still at it (0: still absent),
    else ``Conflict``."""
    with timed(KV_SECONDS, "platform", "put") as timing:
        kv = await bus.kv("platform")
        # only a platform admin may put: a refusal is a PermissionDenied at once, not a timeout
        if revision is None:
            return int(await bus.guarded(kv.put(KEY, text.encode())))
        try:
            if revision == 0:
                return int(await bus.guarded(kv.create(KEY, text.encode())))
            return int(await bus.guarded(kv.update(KEY, text.encode(), last=revision)))
        except WRONG_LAST as exc:
            timing.outcome = "conflict"
            raise Conflict(f"the platform changed since revision {revision}", delay=0.1) from exc
        except TIMEOUT as exc:
            raise TemporaryError("platform KV unavailable", delay=1.0) from exc


async def get_text(bus: Bus, revision: int | None = None, *, leader: bool = False) -> tuple[str, int] | None:
    """The platform text at ``revision`` (None: the current one). ``leader``: read from the stream's leader, as
    ``mark`` is, never by a direct get, which any replica of a JetStream cluster may answer from behind the
    leader (a reader that holds a text under a mark must not hold one older than the mark)."""
    with timed(KV_SECONDS, "platform", "get") as timing:
        got = await _get_text(bus, revision, leader=leader)
        if got is None:
            timing.outcome = "absent"
        return got


async def _get_text(bus: Bus, revision: int | None, *, leader: bool) -> tuple[str, int] | None:
    kv = await bus.kv("platform")
    if leader:  # the same bucket, read with the stream's own get (STREAM.MSG.GET: the leader answers)
        kv = KeyValue(name="platform", stream="KV_platform", pre="$KV.platform.", js=bus.js, direct=False)
    try:
        entry = await kv.get(KEY, revision=revision)
    except KEY_ABSENT:
        return None
    except TIMEOUT as exc:
        raise TemporaryError("platform KV unavailable", delay=1.0) from exc
    if entry.value is None:
        return None
    return entry.value.decode(), int(entry.revision or 0)


class Mark(msgspec.Struct, frozen=True):
    """The ``platform`` bucket's stream as it stands: any write, delete or purge of any key changes it (``last_seq``
    only grows; a message deleted by sequence lowers ``messages``; a bucket made anew has another ``created``)."""

    created: str
    last_seq: int
    messages: int


class _StreamState(msgspec.Struct):
    messages: int = 0
    last_seq: int = 0


class _StreamInfo(msgspec.Struct):
    """The three fields of a stream info answer a ``Mark`` needs (the rest of its ~1 KB is skipped)."""

    created: str = ""
    state: _StreamState = msgspec.field(default_factory=_StreamState)
    error: dict[str, object] | None = None


async def mark(bus: Bus) -> Mark:
    """The bucket's ``Mark``, from the stream's info (about 1 KB, answered by the stream's leader), so a reader
    that holds the text it read under the same mark knows, without fetching it again, that it is still current.
    The answer is decoded into the three fields alone, not into nats-py's whole ``StreamInfo`` (services ask
    about six times a run: that conversion was about a third of each ask's CPU, issue 30); an error answer (no
    bucket) is asked again through nats-py, which raises it as before."""
    with timed(KV_SECONDS, "platform", "mark"):
        kv = await bus.kv("platform")
        try:
            answer = await bus.replies.request("$JS.API.STREAM.INFO.KV_platform", b"", timeout=10.0)
            info = msgspec.json.decode(answer.data, type=_StreamInfo)
            if info.error is not None:
                full = (await kv.status()).stream_info
                info = _StreamInfo(created=str(full.created or ""),
                                   state=_StreamState(messages=full.state.messages, last_seq=full.state.last_seq))
        except TIMEOUT as exc:
            raise TemporaryError("platform KV unavailable", delay=1.0) from exc
    return Mark(created=info.created, last_seq=info.state.last_seq, messages=info.state.messages)


async def follow_text(bus: Bus, *, tick: float = 1.0) -> AsyncIterator[tuple[str, int] | None]:
    """The platform text at every revision, the current one first; ``None`` after each ``tick`` seconds without
    a new one, so a follower can do periodic work. Deletions are skipped."""
    kv = await bus.kv("platform")
    watcher = await kv.watch(KEY)
    try:
        while True:
            try:
                entry = await watcher.updates(timeout=tick)
            except TIMEOUT:
                yield None
                continue
            if entry is not None and entry.value:
                yield entry.value.decode(), int(entry.revision or 0)
    finally:
        await watcher.stop()


LOCAL_USER_KEY = "local_user"


class LocalUser(msgspec.Struct, frozen=True):
    """The person who ran ``tau up``: the one signer a platform with no ``users`` accepts."""

    name: str
    nkey: str


async def put_local_user(bus: Bus, user: LocalUser) -> None:
    with timed(KV_SECONDS, "platform", "put"):
        kv = await bus.kv("platform")
        await kv.put(LOCAL_USER_KEY, msgspec.json.encode(user))


async def get_local_user(bus: Bus) -> LocalUser | None:
    with timed(KV_SECONDS, "platform", "get") as timing:
        found = await _get_local_user(bus)
        if found is None:
            timing.outcome = "absent"
        return found


async def _get_local_user(bus: Bus) -> LocalUser | None:
    kv = await bus.kv("platform")
    try:
        entry = await kv.get(LOCAL_USER_KEY)
    except KEY_ABSENT:
        return None
    except TIMEOUT as exc:
        raise TemporaryError("platform KV unavailable", delay=1.0) from exc
    if not entry.value:
        return None
    return msgspec.json.decode(entry.value, type=LocalUser)
