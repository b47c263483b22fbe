"""Who wrote an event, checked before any stage acts on it.

Server permissions say who may publish where; this says who *did*. Every service signs each event it publishes
with its bus nkey (``envelope.sign_service_headers``, done by ``Bus.publish``), and a consumer of a checked
stream acts on a stage's event only when

- its headers agree with its subject (``Event.problem``: the subject alone says workspace, run and type),
- its ``ce-source`` names a service that ``publishing.SERVICE_PUBLISH`` allows to publish the subject, and
- it is signed by that same service's key, as the ``service_keys`` bucket lists it. A service's event stores no
  ``tau-signer`` (``envelope.compact``): its signature is checked against the key of the service its
  ``ce-source`` names, which is the only key that could pass here anyway; a ``tau-signer`` that is there must
  still be that service's.

People's requests (``publishing.PERSON_REQUESTS``) pass here: their own signature is checked where they are
handled (``signers``). A permission mistake, a stolen routine credential that may publish a subject, or a
message copied onto another subject is thus refused, not applied (``../shared/design/trust.md`` §2).

The keys. The bootstrap identity, and only it (``permissions``: no other identity may write the bucket), puts
each service's public key under the service's name (``publish_keys``: ``tau up``; the chart's bootstrap Job).
A connection without credentials (a bus without authentication) has no boundary to keep: there the check is
the ``ce-source`` one alone. On an authenticated bus whose keys are not recorded yet, an event waits (a
``TemporaryError``: the consumer naks it, backing off as for any handler's, so its deliveries span about a
minute); it is never acted on unchecked: one still waiting after ``max_deliver`` reaches the DLQ through the
server's max-deliveries advisory (``tau dlq replay`` sends it again). A signer not yet
known makes the keys be read again (at most every ``REFRESH_S``), so a rotated key is taken without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time

from taugrid.bus import kv as kvstore
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, SignatureInvalid, verify_service_signature
from taugrid.bus.errors import KEY_ABSENT, NO_BUCKET
from taugrid.core import publishing
from taugrid.core.errors import TemporaryError

log = logging.getLogger("taugrid.authors")

BUCKET = "service_keys"
REFRESH_S = 2.0
_PREFIX_LEN = len(publishing.SOURCE_PREFIX)


async def publish_keys(bus: Bus, keys: dict[str, str]) -> None:
    """Record each service's public key (``service`` as in ``ce-source``, e.g. ``admission-watcher``); only the
    bootstrap identity may. A key already recorded is replaced (a rotation)."""
    kv = await bus.kv(BUCKET)
    for service, public_key in sorted(keys.items()):
        name = service.replace("_", "-")
        try:
            current = await kv.get(name)
            if current.value is not None and current.value.decode() == public_key:
                continue
        except KEY_ABSENT:
            pass
        await kv.put(name, public_key.encode())


class Authors:
    """The service keys of one connection's bus, read lazily, and the author check."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.services: dict[str, str] = {}  # public key → service
        self.keys: dict[str, str] = {}  # service → public key (an event without tau-signer is checked by it)
        self.read_at = 0.0
        self._reading: asyncio.Lock = asyncio.Lock()

    @classmethod
    def of(cls, bus: Bus) -> Authors:
        """The connection's one instance (its consumer loops share the keys they read)."""
        if not isinstance(bus.authors, Authors):
            bus.authors = cls(bus)
        return bus.authors

    async def _refresh(self) -> None:
        async with self._reading:
            if time.monotonic() - self.read_at < REFRESH_S:
                return
            self.read_at = time.monotonic()
            try:
                kv = await self.bus.kv(BUCKET)
            except NO_BUCKET:
                return  # an older bus provisioned before the bucket: no keys to check against yet
            # from the stream's per-subject state, not nats-py's kv.keys(): its watch may end before the first
            # delivery is counted and answer a partial list under load, and a key left out refuses that service
            names = await kvstore.matching_keys(self.bus, BUCKET, ">")
            found: dict[str, str] = {}
            for name in names:
                try:
                    entry = await kv.get(name)
                except KEY_ABSENT:
                    continue  # deleted (a retired service)
                if entry.value:
                    found[entry.value.decode()] = name
            if found != self.services:
                log.info("service keys: %s", ", ".join(sorted(found.values())) or "none (no authentication)")
            self.services = found
            self.keys = {service: key for key, service in found.items()}

    async def problem(self, ev: Event, *, verdict: tuple[bool, tuple[str, ...]] | None = None) -> str | None:
        """Why a stage must not act on ``ev``; None when it may. ``verdict``: ``publishing.verdict`` of its
        subject, when the caller has it already (the consumer reads it for every event)."""
        if ev.problem:
            return ev.problem
        person, allowed = publishing.verdict(ev.nats_subject) if verdict is None else verdict
        if person:
            return None
        source = ev.source
        if not (source.startswith(publishing.SOURCE_PREFIX) and source[_PREFIX_LEN:] in allowed):
            claimed = publishing.source_problem(ev.nats_subject, source)  # says why (the same verdict)
            if claimed is not None:
                return claimed
        if self.bus.identity is None:
            return None  # a bus without authentication: nobody to tell apart, no keys to check against
        claimed_service = ev.source.removeprefix(publishing.SOURCE_PREFIX)
        if not self.services or (ev.signer and ev.signer not in self.services) or \
                (not ev.signer and ev.signature and claimed_service not in self.keys):
            await self._refresh()
        if not self.services:  # authenticated, but the bootstrap has not recorded the keys yet (a chart's Job
            # runs after the services start): wait for them rather than act on an event nobody can vouch for
            raise TemporaryError("no service keys recorded yet (the bootstrap publishes them)", delay=2.0)
        signer = ev.signer or (self.keys.get(claimed_service, "") if ev.signature else "")
        service = self.services.get(signer)
        if service is None:
            return (f"{ev.type} on {ev.nats_subject} is not signed by any service's key (signer "
                    f"{ev.signer or 'none'}): only {', '.join(allowed) or 'no service'} may publish it")
        if service not in allowed or ev.source != f"{publishing.SOURCE_PREFIX}{service}":
            return (f"{ev.type} on {ev.nats_subject} is signed by {service}, which may not publish it as "
                    f"{ev.source!r}: only {', '.join(allowed) or 'no service'} may")
        try:
            verify_service_signature(ev, public_key=signer)
        except SignatureInvalid as exc:
            if ev.signer or not await self._rotated(claimed_service, signer):
                return f"{ev.type} on {ev.nats_subject} claims {service}'s key, but {exc}"
            try:  # no tau-signer, and the service's key changed since we read it: check against the new one
                verify_service_signature(ev, public_key=self.keys[claimed_service])
            except SignatureInvalid as again:
                return f"{ev.type} on {ev.nats_subject} claims {service}'s key, but {again}"
        return None

    async def _rotated(self, service: str, key: str) -> bool:
        """Whether reading the keys again (at most every ``REFRESH_S``) gives ``service`` another key than
        ``key``: a rotation this connection had not seen, for an event that names no signer."""
        await self._refresh()
        return self.keys.get(service, key) != key
