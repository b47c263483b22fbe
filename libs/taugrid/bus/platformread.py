"""The platform the services act on: the newest revision in the ``platform`` KV that validates.

``tau platform apply`` validates before it writes, but anyone allowed to put the key could store a text that does
not parse. Services never act on such a revision: they keep the last good one (walking the key's history back,
each revision parsed once and remembered) and log the bad one once. Only when no stored revision validates is the
caller told to wait (``TemporaryError``, naming the problem), so a run that met it is retried after the fix.

Read once per revision: a platform of 1,000 queues is 577 KB of text, and the services read it several times per
run. Every ``get`` still asks the bucket whether anything changed (``platformstore.mark``: the stream's info, 963
bytes, from the stream's leader), so it is exactly as fresh as a fetch of the text (a person removed by an apply
that has returned is refused by the next ``get``); only when the mark differs from the one the held text was read
under is the text fetched again, once however many handlers meet the new mark together, and from the leader too
(never a direct get, which a lagging replica of a JetStream cluster may answer: its older text would then be held
under the newer mark until the bucket is written again). A revision is immutable,
so parses are kept by revision number (the last ``PARSED_KEPT``: a parsed 1,000-queue platform holds ~6 MB,
``config.platform.load_platform_kept``).
``at`` serves the current revision from memory (it is kept, being current) and fetches any other, so a revision
the bucket no longer keeps is still reported so.

Marks asked together are asked once (``_Marks``): a ``get`` that starts while the reader's mark request is in
flight (sent before it began, so possibly older than an apply that returned since) waits for the next request,
sent when that one is answered and shared by every ``get`` that started meanwhile. Each ``get`` is still
answered by a mark asked after it began, so exactly as fresh as before; a service handling a burst (the
submitter, the policy, the evidence: a run's marks were five of its ~30 JetStream API requests, issue 30) asks
two a wave rather than one a message, and an idle one, one a message as before. Within ``one_mark()`` (a
handler whose platform reads need not be fresher than its first: the evidence's seal, pricing the run and finding
the archive) the reads after the first reuse its mark.

A mark can be handed on (``get_marked``, ``get(vouched=…)``): the submitter asks one after a request was stored and
puts its token in ``submit.accepted``; the policy, holding its text under that same mark, serves it without asking
(every apply that returned before the request is in it; issue 30: one round trip of every idle run's path). Only
a mark the call itself asked is handed on, never a ``one_mark`` one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar

from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.bus.errors import UNAVAILABLE
from taugrid.config.platform import Platform, load_platform_kept
from taugrid.core.errors import ConfigError, TauError, TemporaryError

log = logging.getLogger(__name__)

INVALID_RETRY_S = 15.0
PARSED_KEPT = 4  # parsed revisions held: the current one, the last good one, a few pinned by reproduced runs


_NO_ANSWER: tuple[type[Exception], ...] = (TauError, *UNAVAILABLE)  # no grant, a server away, an invalid platform

class _Marks:
    """The bucket's mark for concurrent readers, each answered by a request sent after it asked: the first asks at
    once; those that ask while a request is in flight (sent before them, so it may predate an apply that returned
    since) share the next one, sent as soon as that one is answered. A failed request fails all who shared it,
    as each one's own would have."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._sending: asyncio.Future[platformstore.Mark] | None = None  # the request in flight
        self._next: asyncio.Future[platformstore.Mark] | None = None  # the one after it, not sent yet

    async def ask(self) -> platformstore.Mark:
        if self._sending is None:
            return await self._send()
        if self._next is None:
            self._next = asyncio.ensure_future(self._after(self._sending))
            self._next.add_done_callback(_retrieved)
        return await asyncio.shield(self._next)

    async def _send(self) -> platformstore.Mark:
        sending = self._sending = asyncio.ensure_future(platformstore.mark(self.bus))
        sending.add_done_callback(_retrieved)  # every asker may have gone (cancelled): its failure is no warning
        try:
            return await asyncio.shield(sending)
        finally:
            if self._sending is sending:
                self._sending = None

    async def _after(self, previous: asyncio.Future[platformstore.Mark]) -> platformstore.Mark:
        await asyncio.wait([previous])  # its outcome is its own askers'
        self._next = None  # who asks from now on waits for the request after this one
        return await self._send()


def mark_token(mark: platformstore.Mark) -> str:
    """A mark as a stage hands it to the next one (``SubmitAccepted.platform_mark``): equal tokens, equal marks."""
    return f"{mark.last_seq}/{mark.messages}/{mark.created}"


def _retrieved(fut: asyncio.Future[platformstore.Mark]) -> None:
    if not fut.cancelled():
        fut.exception()


# The marks ``one_mark()`` holds for the task it runs in (and the tasks that task starts): connection → mark.
_ONE_MARK: ContextVar[dict[int, platformstore.Mark] | None] = ContextVar("platform_one_mark", default=None)


@contextlib.contextmanager
def one_mark() -> Iterator[None]:
    """Within it, the platform reads of this task after its first on a connection reuse that first read's mark
    (one mark request, not one a read): each serves what is held under that mark, or else fetches the current
    text, so a read is never older than the first one (an apply made meanwhile may show in a later read). For
    a handler whose reads decide nothing a later apply must change at once (the evidence's seal: the run's price
    at the revision it was approved against, and the archive its bundle goes to); never around a check of a
    person's rights, which must see an apply that returned before the read."""
    token = _ONE_MARK.set({})
    try:
        yield
    finally:
        _ONE_MARK.reset(token)


class PlatformReader:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._marks = _Marks(bus)
        self._parsed: OrderedDict[int, Platform | ConfigError] = OrderedDict()  # least recently used first
        self._good: tuple[int, int, Platform] | None = None  # (current revision, the good one chosen for it, it)
        # The bucket's mark when the current revision (0: none stored) was last fetched: while the mark is the
        # same, nothing was written since, so that revision is still the current one.
        self._seen: tuple[platformstore.Mark, int] | None = None
        self._fetching = asyncio.Lock()

    def _parse(self, text: str, revision: int) -> Platform | ConfigError:
        known = self._known(revision)
        if known is None:
            try:
                known = load_platform_kept(text, path=f"platform.yaml@{revision}")
            except ConfigError as err:
                known = err
                log.error("platform revision %d is invalid and is not used: %s", revision, err)
            self._parsed[revision] = known
            while len(self._parsed) > PARSED_KEPT:
                self._parsed.popitem(last=False)
        return known

    def _known(self, revision: int) -> Platform | ConfigError | None:
        known = self._parsed.get(revision)
        if known is not None:
            self._parsed.move_to_end(revision)
        return known

    async def _current(self, vouched: str = "") -> tuple[Platform | ConfigError, int] | None:
        """The current revision, parsed (or its ConfigError), fetched only when the bucket changed since.
        ``vouched``: a mark (``mark_token``) another stage asked after the request at hand was stored; while it is
        the one this reader holds a text under, that text is served without asking (``get``)."""
        return (await self._current_marked(vouched))[0]

    async def _current_marked(self, vouched: str = "") -> tuple[tuple[Platform | ConfigError, int] | None, str]:
        """``_current`` and the token of the mark it was read under, asked by this call ("" when reused from
        ``one_mark`` or taken from ``vouched``: no freshness this call can vouch for)."""
        if vouched and self._seen is not None and mark_token(self._seen[0]) == vouched:
            held = self._held(self._seen[0])
            if held is not None:
                return held or None, ""
        mark, reused = await self._mark()
        held = self._held(mark)
        if held is not None:
            return held or None, "" if reused else mark_token(mark)
        async with self._fetching:  # concurrent handlers that met the same new mark fetch the text once
            held = self._held(mark)
            if held is not None:
                return held or None, "" if reused else mark_token(mark)
            # Marked before fetching: a write in between only makes the next mark differ, never hides a revision.
            # Fetched from the leader, which answered the mark: a replica's direct get may lag it, and a text older
            # than its mark would be held until the next write to the bucket.
            got = await platformstore.get_text(self.bus, leader=True)
            if not reused:  # a ``one_mark`` mark may be older than the text just fetched: it must not label it
                self._seen = (mark, got[1] if got is not None else 0)
            token = "" if reused else mark_token(mark)
            if got is None:
                return None, token
            return (self._parse(*got), got[1]), token

    async def _mark(self) -> tuple[platformstore.Mark, bool]:
        """The bucket's mark, asked after this call began (``_Marks``), or the one ``one_mark()`` holds (then
        True: reused, possibly older than the bucket's latest write)."""
        held = _ONE_MARK.get()
        if held is not None and (mark := held.get(id(self.bus))) is not None:
            return mark, True
        mark = await self._marks.ask()
        if held is not None:
            held.setdefault(id(self.bus), mark)
        return mark, False

    def _held(self, mark: platformstore.Mark) -> tuple[Platform | ConfigError, int] | tuple[()] | None:
        """What was read under ``mark``: the current revision parsed, () when none is stored, None when the text
        must be fetched (another mark, or its parse no longer kept)."""
        if self._seen is None or self._seen[0] != mark:
            return None
        revision = self._seen[1]
        if revision == 0:
            return ()
        known = self._known(revision)
        return (known, revision) if known is not None else None

    async def get(self, *, vouched: str = "") -> tuple[Platform, int] | None:
        """(platform, its revision) of the newest valid revision; None before any is applied.

        ``vouched``: the bucket's mark (``mark_token``) as a stage before this one read it after the request at
        hand was stored (the submitter's, in ``submit.accepted``). A reader holding its text under that very mark
        serves it without asking the bucket again: every apply that returned before the request is in it, which is
        all a fresh mark would add for that request (an apply returning meanwhile may or may not bind a request
        already in flight either way). Any other mark, or none, is asked as without it."""
        return (await self.get_marked(vouched=vouched))[0]

    async def get_marked(self, *, vouched: str = "") -> tuple[tuple[Platform, int] | None, str]:
        """``get``, and the token of the bucket's mark this call asked (``mark_token``; "" when it asked none):
        what a later stage may be handed as ``vouched`` for the same request."""
        got, token = await self._current_marked(vouched)
        if got is None:
            return None, token
        return await self._valid(*got), token

    async def _valid(self, current: Platform | ConfigError, revision: int) -> tuple[Platform, int]:
        """The newest valid revision at or below ``revision`` (whose parse is ``current``)."""
        if isinstance(current, Platform):
            return current, revision
        if self._good is not None and self._good[0] == revision:
            return self._good[2], self._good[1]
        for older_text, older in await self._history(revision):
            parsed = self._parse(older_text, older)
            if isinstance(parsed, Platform):
                self._good = (revision, older, parsed)
                return parsed, older
        first = str(current).splitlines()[0]
        raise TemporaryError(f"the platform (revision {revision}) is invalid and no earlier revision is valid: "
                             f"{first}; apply a fixed one with `tau platform apply`", delay=INVALID_RETRY_S)

    async def get_or_none(self) -> Platform | None:
        """The newest valid platform, or None when there is none or it cannot be read now (no grant, a server
        away): for hints that may go without it, such as the priority lane a client claims."""
        try:
            got = await self.get()
        except _NO_ANSWER:
            return None
        return got[0] if got is not None else None

    async def at(self, revision: int) -> Platform | ConfigError | None:
        """That revision of the platform (``tau reproduce`` pins the one a run was resolved against): the
        platform, the ConfigError it fails with, or None when the bucket no longer keeps it."""
        current = await self._current()
        if current is not None and current[1] == revision:
            return current[0]
        got = await platformstore.get_text(self.bus, revision=revision)
        if got is None:
            return None
        return self._parse(*got)

    async def _history(self, below: int) -> list[tuple[str, int]]:
        """Older texts of the platform key, newest first."""
        try:
            kv = await self.bus.kv("platform")
            entries = await kv.history(platformstore.KEY)
        except UNAVAILABLE as exc:  # NoKeysError too: an Error
            raise TemporaryError(f"reading the platform's history failed: {exc!r}", delay=2.0) from exc
        out = [(e.value.decode(), int(e.revision or 0)) for e in entries
               if e.value and (e.revision or 0) < below and e.operation is None]
        return sorted(out, key=lambda t: -t[1])


# One reader per connection for the modules of a process that read the platform apart (the evidence service
# prices a seal in one and finds the archive in another): each revision is then fetched, parsed and held once
# (a parsed platform of 1,000 ClusterQueues holds ~6 MB).
_SHARED: weakref.WeakKeyDictionary[Bus, PlatformReader] = weakref.WeakKeyDictionary()


def shared_reader(bus: Bus) -> PlatformReader:
    """The process's one ``PlatformReader`` on ``bus``, made on first use."""
    reader = _SHARED.get(bus)
    if reader is None:
        reader = _SHARED[bus] = PlatformReader(bus)
    return reader

