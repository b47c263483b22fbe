"""Source snapshots: content-addressed, verified on upload, when promoted, and on every use; write-once.

A snapshot's name is its digest (``sources/<sha256 hex>.tar.gz``, ``sources/archive.source_object``), so what
a name may hold is fixed. Two object stores:
- ``uploads``: people put snapshots here (their grants allow put and read, never purge). Anyone may overwrite
  anyone's upload, so nothing runs from it.
- ``sources``: only the submitter writes it (``promote``: the upload is hashed and copied once its bytes match
  the name and the submission), and it never replaces an object that verifies. Pods and people only read it.
  Write-once is enforced by the server's permissions: no person can replace a promoted snapshot.
Invariants:
- ``upload`` skips the put only when ``sources`` already holds the named content (it verifies there), so the
  client is never tricked into relying on a planted object.
- ``promote`` (the submitter, before accepting a run) and ``fetch`` (the local controller, before unpacking;
  the Kubernetes init container has its own streaming check, ``taugrid.sources.fetch``) hash every byte and
  refuse content whose sha256 is not the one the name and the submission state, with ``SourceMismatch``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re

from taugrid.bus.connection import Bus
from taugrid.bus.errors import OBJECT_ABSENT, UNAVAILABLE
from taugrid.bus.metrics import OBJECT_SECONDS, timed
from taugrid.bus.objects import download
from taugrid.bus.topology import SOURCES_STORE, UPLOADS_STORE
from taugrid.core.errors import NotFound, PermanentError, PermissionDenied, TemporaryError

_NAME = re.compile(r"sources/([0-9a-f]{64})\.tar\.gz")


class SourceMismatch(PermanentError):
    """A source snapshot's content is not what its name and the submission say."""


def digest_in_name(name: str) -> str | None:
    """``sha256:<hex>`` that a content-addressed name stands for; None for a name of another form."""
    m = _NAME.fullmatch(name)
    return f"sha256:{m.group(1)}" if m else None


def expected_digest(name: str, digest: str = "") -> str:
    """The digest ``name`` must hold: the one its name states, which ``digest`` (when given) must equal.
    ``SourceMismatch`` for a name that is not content-addressed or that disagrees with ``digest``."""
    named = digest_in_name(name)
    if named is None:
        raise SourceMismatch(f"source object {name!r} is not named by its digest (sources/<sha256 hex>.tar.gz)")
    if digest and digest != named:
        raise SourceMismatch(f"source object {name} is named for {named}, but the submission says {digest}")
    return named


class _Hasher(io.RawIOBase):
    """A sink that only hashes (nats-py writes the object into it chunk by chunk)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        return len(data)


class _Bounded(io.BytesIO):
    """An in-memory sink that refuses more than ``limit`` bytes (an upload larger than any snapshot the client
    makes is refused before it fills the submitter's memory)."""

    def __init__(self, name: str, limit: int) -> None:
        super().__init__()
        self.name, self.limit = name, limit

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.tell() + len(data) > self.limit:
            raise SourceMismatch(f"uploaded source snapshot {self.name} is larger than {self.limit} bytes, "
                                 "the most a project snapshot may be")
        return super().write(data)


async def stored_digest(bus: Bus, name: str, store: str = SOURCES_STORE) -> str:
    """``sha256:<hex>`` of the object's bytes as stored now; ``NotFound`` if there is none."""
    sink = _Hasher()
    await download(bus, name, sink, store=store)  # type: ignore[arg-type]
    return "sha256:" + sink.sha.hexdigest()


async def recorded_digest(bus: Bus, name: str) -> str | None:
    """``sha256:<hex>`` that ``sources`` records for ``name`` in its object info (one request, no download); None
    when there is no such object or no digest recorded.

    Why the record can stand for the bytes when promoting: the object info is written by whoever puts the
    object, and only the submitter (``promote``, after hashing every byte itself, through nats-py's ``put``,
    which computes the recorded digest from the same bytes) and the bus's bootstrap identity may write
    ``sources``; people may only read it. A snapshot replaced by another ``put`` records the new bytes' digest,
    so it no longer matches and is checked (and re-promoted) byte by byte. What runs is still hashed on use
    (``fetch``, ``taugrid.sources.fetch``), so a damaged chunk is refused there."""
    try:
        obs = await bus.objects(SOURCES_STORE)
        info = await obs.get_info(name)
    except OBJECT_ABSENT:
        return None
    except UNAVAILABLE as exc:
        raise TemporaryError(f"looking up source snapshot {name} failed: {exc!r}", delay=1.0) from exc
    recorded = (info.digest or "").partition("=")
    if recorded[0].upper() != "SHA-256" or not recorded[2]:
        return None
    try:
        return "sha256:" + base64.urlsafe_b64decode(recorded[2]).hex()
    except (ValueError, binascii.Error):
        return None


async def verify(bus: Bus, name: str, digest: str = "") -> str:
    """Check that object ``name`` holds exactly its content address; returns the digest. ``SourceMismatch``
    when it does not, ``NotFound`` when it is missing."""
    want = expected_digest(name, digest)
    got = await stored_digest(bus, name)
    if got != want:
        raise SourceMismatch(f"source snapshot {name} holds content with digest {got}, not {want}: "
                             "it was replaced after upload; refusing to run code that is not what was submitted")
    return want


async def upload(bus: Bus, name: str, data: bytes) -> bool:
    """Put ``data`` into ``uploads`` under its content address ``name`` unless ``sources`` already holds it
    verified, or ``uploads`` does (a sweep's runs share one snapshot, submitted before the submitter promoted it:
    putting it again would replace it, which ends in a purge people may not do, and the server's refusal was
    printed once per run). Returns whether it was written. Nothing runs from ``uploads``: ``promote`` hashes
    every byte again, so an upload replaced after this check is refused there."""
    want = expected_digest(name)
    if "sha256:" + hashlib.sha256(data).hexdigest() != want:
        raise SourceMismatch(f"refusing to upload to {name}: the data's digest is not the one the name states")
    for store in (SOURCES_STORE, UPLOADS_STORE):
        try:
            if await stored_digest(bus, name, store) == want:
                return False
        except (NotFound, TemporaryError):
            pass  # not there, or not readable now (a server restarting mid-read): the check only saves a transfer
    await _put(bus, UPLOADS_STORE, name, data, want)
    return True


async def promote(bus: Bus, name: str, digest: str = "", *, max_bytes: int) -> str:
    """Make ``sources`` hold the snapshot (the submitter's step before accepting a run): kept as it is when
    it verifies there, else copied from ``uploads`` once the upload's bytes hash to the name. Returns the
    digest; ``SourceMismatch`` for an upload that does not verify or exceeds ``max_bytes``, ``NotFound`` when
    neither store has it."""
    want = expected_digest(name, digest)
    if await recorded_digest(bus, name) == want:
        return want  # promoted before: trusted from its record, without reading it back (see recorded_digest)
    try:
        if await stored_digest(bus, name) == want:
            return want
    except NotFound:
        pass
    buf = _Bounded(name, max_bytes)
    await download(bus, name, buf, store=UPLOADS_STORE)
    data = _checked(buf.getvalue(), name, want, what="uploaded source snapshot")
    await _put(bus, SOURCES_STORE, name, data, want)
    return want


async def _put(bus: Bus, store: str, name: str, data: bytes, want: str) -> None:
    with timed(OBJECT_SECONDS, store, "write"):
        await _put_once(bus, store, name, data, want)


async def _put_once(bus: Bus, store: str, name: str, data: bytes, want: str) -> None:
    try:
        obs = await bus.objects(store)
        await bus.guarded(obs.put(name, data))
    except PermissionDenied:
        # Replacing an object ends with a purge of its old chunks, which people may not do; the new object is
        # in place by then (its old chunks stay behind, unreferenced, until the uploads' TTL).
        if await stored_digest(bus, name, store) != want:
            raise
    except UNAVAILABLE as exc:
        raise TemporaryError(f"uploading source snapshot {name} failed: {exc!r}", delay=1.0) from exc


async def fetch(bus: Bus, name: str, digest: str = "") -> bytes:
    """The snapshot's bytes, verified against its content address (and ``digest`` when given)."""
    want = expected_digest(name, digest)
    buf = io.BytesIO()
    await download(bus, name, buf, store=SOURCES_STORE)
    return _checked(buf.getvalue(), name, want, what="source snapshot")


def _checked(data: bytes, name: str, want: str, *, what: str) -> bytes:
    """``data`` when it hashes to ``want``; else ``SourceMismatch``."""
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != want:
        raise SourceMismatch(f"{what} {name} holds content with digest {got}, not {want}: "
                             "it was replaced after upload; refusing to run code that is not what was submitted")
    return data
