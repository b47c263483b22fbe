"""The platform the services act on: the newest revision in the ``platform`` KV that validates.

``tau platform apply`` validates before it writes, but anyone allowed to put the key could store a text that does
not parse. Services never act on such a revision: they keep the last good one (walking the key's history back,
each revision parsed once and remembered) and log the bad one once. Only when no stored revision validates is the
caller told to wait (``TemporaryError``, naming the problem), so a run that met it is retried after the fix.
"""

from __future__ import annotations

import logging

from taugrid.bus import platformstore
from taugrid.bus.connection import Bus
from taugrid.bus.errors import UNAVAILABLE
from taugrid.config.platform import Platform, load_platform
from taugrid.core.errors import ConfigError, TauError, TemporaryError

log = logging.getLogger(__name__)

INVALID_RETRY_S = 15.0


_NO_ANSWER: tuple[type[Exception], ...] = (TauError, *UNAVAILABLE)  # no grant, a server away, an invalid platform

class PlatformReader:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._parsed: dict[int, Platform | ConfigError] = {}
        self._good: tuple[int, int] | None = None  # (current revision, the good revision chosen for it)

    def _parse(self, text: str, revision: int) -> Platform | ConfigError:
        known = self._parsed.get(revision)
        if known is None:
            try:
                known = load_platform(text, path=f"platform.yaml@{revision}")
            except ConfigError as err:
                known = err
                log.error("platform revision %d is invalid and is not used: %s", revision, err)
            self._parsed[revision] = known
        return known

    async def get(self) -> tuple[Platform, int] | None:
        """(platform, its revision) of the newest valid revision; None before any is applied."""
        got = await platformstore.get_text(self.bus)
        if got is None:
            return None
        text, revision = got
        current = self._parse(text, revision)
        if isinstance(current, Platform):
            return current, revision
        if self._good is not None and self._good[0] == revision:
            good = self._parsed[self._good[1]]
            assert isinstance(good, Platform)
            return good, self._good[1]
        for older_text, older in await self._history(revision):
            parsed = self._parse(older_text, older)
            if isinstance(parsed, Platform):
                self._good = (revision, older)
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
