"""How a bundle is stored: its canonical JSON gzip-compressed (issue 27: a trivial run's bundle, ~20 KB of
JSON that repeats its config and manifests across its events, stores in a few KB).

The bundle's digest stays the sha256 of the canonical JSON, never of the stored bytes: the seal, the ledger,
``evidence.sealed`` and an exported bundle all name the same bytes as before, so ``tau verify`` checks bundles
stored either way. A bundle stored before compression is plain JSON (its first byte ``{``), told apart from a
compressed one by gzip's magic number; both read back as the canonical JSON.

Pure: no I/O. The compression is deterministic (no file name, mtime 0), so the same bundle stores as the same
bytes.
"""

from __future__ import annotations

import gzip
import zlib

GZIP_MAGIC = b"\x1f\x8b"
MAX_UNPACKED = 512 * 1024 * 1024  # a bundle is at most a few MB; a stored object inflating past this is refused


class PackingError(ValueError):
    """Stored bytes that are neither a plain bundle nor one this module compressed."""


def pack(canonical: bytes) -> bytes:
    """The bytes to store for the bundle whose canonical JSON is ``canonical``."""
    return gzip.compress(canonical, compresslevel=9, mtime=0)


def unpack(stored: bytes) -> bytes:
    """The canonical JSON of a stored bundle, compressed or (stored before compression) plain."""
    if not stored.startswith(GZIP_MAGIC):
        return stored
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
    try:
        out = inflate.decompress(stored, MAX_UNPACKED)
    except zlib.error as exc:
        raise PackingError(f"a compressed bundle that does not inflate: {exc}") from exc
    if inflate.unconsumed_tail:
        raise PackingError(f"a compressed bundle inflating past {MAX_UNPACKED} bytes")
    if not inflate.eof:
        raise PackingError("a compressed bundle cut short")
    return out
