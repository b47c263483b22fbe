"""Who is signed in to the portal: the session is a delegation token (``taugrid.access.delegation``) that the person
signed with their nkey for this portal's key, carried in a cookie (the browser) or an ``Authorization: Bearer``
header (scripts). Each token is checked in full (signature, delegate, expiry) and its person looked up in the
platform, then cached briefly so a page of requests costs one platform read; a removed user or a changed
membership takes effect within ``CACHE_S``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from taugrid.access import delegation
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import SignatureInvalid
from taugrid.client.access import Viewer, viewer

COOKIE = "tau_portal"
CACHE_S = 15.0


class NotSignedIn(Exception):
    """No valid session; the message says why and what to do."""


@dataclass(frozen=True)
class Session:
    token: str
    viewer: Viewer
    expires: float


class Sessions:
    def __init__(self, bus: Bus, portal_key: str) -> None:
        self.bus = bus
        self.portal_key = portal_key
        self._cache: dict[str, tuple[float, Session]] = {}

    async def open(self, token: str) -> Session:
        """The session ``token`` stands for; ``NotSignedIn`` with the reason when it does not hold."""
        now = time.time()
        cached = self._cache.get(token)
        if cached is not None and now - cached[0] < CACHE_S and now <= cached[1].expires:
            return cached[1]
        try:
            signed = delegation.read(token, delegate=self.portal_key, now=now)
        except SignatureInvalid as exc:
            raise NotSignedIn(f"{exc}") from exc
        person = await viewer(self.bus, signed.user)
        if person is None:
            raise NotSignedIn(f"the key {signed.user} is not a user of this platform (ask a platform admin)")
        session = Session(token, person, signed.expires)
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[token] = (now, session)
        return session
