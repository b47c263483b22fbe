"""Source snapshots in the ``sources`` object store: content-addressed, verified on upload and on every use.

A snapshot's name is its digest (``sources/<sha256 hex>.tar.gz``, ``client/snapshot.source_object``), so what
a name may hold is fixed. Invariants:
- ``upload`` never replaces an object that already holds the named content, and never skips one that does not
  (a name that exists but does not verify is uploaded again): the client cannot be tricked into relying on a
  planted object, and never overwrites a good one.
- ``verify`` (the submitter, before accepting a run) and ``fetch`` (the local controller, before unpacking;
  the Kubernetes init container has its own streaming check, ``taugrid.sourcefetch``) hash every byte and
  refuse content whose sha256 is not the one the name and the submission state, with ``SourceMismatch``.
- People may put objects into this store (their grants allow nothing else there), so write-once is not
  enforced by the server: a replaced object fails the next verification instead of running.
"""

from __future__ import annotations

import hashlib
import io
import re

import nats

from taugrid.bus.connection import Bus
from taugrid.bus.objects import download
from taugrid.bus.topology import SOURCES_STORE
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


async def stored_digest(bus: Bus, name: str) -> str:
    """``sha256:<hex>`` of the object's bytes as stored now; ``NotFound`` if there is none."""
    sink = _Hasher()
    await download(bus, name, sink, store=SOURCES_STORE)  # type: ignore[arg-type]
    return "sha256:" + sink.sha.hexdigest()


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
    """Store ``data`` under its content address ``name`` unless an object there already verifies. Returns
    whether it was written."""
    want = expected_digest(name)
    if "sha256:" + hashlib.sha256(data).hexdigest() != want:
        raise SourceMismatch(f"refusing to upload to {name}: the data's digest is not the one the name states")
    try:
        if await stored_digest(bus, name) == want:
            return False
    except NotFound:
        pass
    try:
        obs = await bus.objects(SOURCES_STORE)
        await bus.guarded(obs.put(name, data))
    except PermissionDenied:
        # Replacing an object ends with a purge of its old chunks, which people may not do; the new object is
        # in place by then (its old chunks stay behind, unreferenced).
        if await stored_digest(bus, name) != want:
            raise
    except (nats.errors.Error, TimeoutError) as exc:
        raise TemporaryError(f"uploading source snapshot {name} failed: {exc!r}", delay=1.0) from exc
    return True


async def fetch(bus: Bus, name: str, digest: str = "") -> bytes:
    """The snapshot's bytes, verified against its content address (and ``digest`` when given)."""
    want = expected_digest(name, digest)
    buf = io.BytesIO()
    await download(bus, name, buf, store=SOURCES_STORE)
    data = buf.getvalue()
    got = "sha256:" + hashlib.sha256(data).hexdigest()
    if got != want:
        raise SourceMismatch(f"source snapshot {name} holds content with digest {got}, not {want}: "
                             "it was replaced after upload; refusing to run code that is not what was submitted")
    return data
