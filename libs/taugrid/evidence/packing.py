"""How a bundle is stored: its canonical JSON gzip-compressed (issue 27: a trivial run's bundle, ~20 KB of
JSON that repeats its config and manifests across its events, stores in a few KB), or deflated against a base
shared by the workspace's bundles (``bases.py``: the config, manifests and event layout that a sweep's runs
repeat are stored once, in the base; a trivial run's bundle then stores in ~1.5 KB).

The bundle's digest stays the sha256 of the canonical JSON, never of the stored bytes: the seal, the ledger,
``evidence.sealed`` and an exported bundle all name the same bytes as before, so ``tau verify`` checks bundles
stored either way. A bundle stored before compression is plain JSON (its first byte ``{``), told apart from a
compressed one by gzip's magic number; both read back as the canonical JSON.

A bundle stored against a base starts with ``COMPACT_MAGIC``, then the base's name in ~40 bytes (the workspace
token's length in one byte, the token, the sha256 as 32 raw bytes: issue 27, ~60 B of a trivial run's ~1,200 where
the name was written out), then a raw deflate stream whose preset dictionary is the base's bytes: it reads back
only with that base, whose name carries its sha256 (the reader checks it, ``bases.py``), and the canonical JSON it
inflates to is what the seal's digest covers, so a base changed or lost can only fail verification, never pass it.
One stored by an earlier release starts with ``DELTA_MAGIC``, the name written out and a newline; it reads the same.

Pure: no I/O. The compression is deterministic (no file name, mtime 0), so the same bundle stores as the same
bytes (against the same base).
"""

from __future__ import annotations

import gzip
import hashlib
import re
import zlib

GZIP_MAGIC = b"\x1f\x8b"
DELTA_MAGIC = b"taugrid.evidence.delta/1\n"  # neither ``{`` nor gzip's magic: a bundle stored against a base
COMPACT_MAGIC = b"\x00td2"  # the same, its base's name packed (``pack_against``); never a first byte of the others
MAX_UNPACKED = 512 * 1024 * 1024  # a bundle is at most a few MB; a stored object inflating past this is refused
DICTIONARY_BYTES = 32 * 1024  # deflate's window: the most of a base a stream can refer back to
_BASE_NAME = re.compile(r"bases/[A-Za-z0-9_-]+/[0-9a-f]{64}")  # ``bases.base_name``: workspace token, sha256


class PackingError(ValueError):
    """Stored bytes that are neither a plain bundle nor one this module compressed."""


def pack(canonical: bytes) -> bytes:
    """The bytes to store for the bundle whose canonical JSON is ``canonical``."""
    return gzip.compress(canonical, compresslevel=9, mtime=0)


def pack_against(canonical: bytes, *, base: str, dictionary: bytes) -> bytes:
    """The bytes to store for ``canonical`` deflated against the base object ``base`` whose bytes are
    ``dictionary`` (at most ``DICTIONARY_BYTES``: deflate reaches no further back)."""
    if not _BASE_NAME.fullmatch(base) or len(dictionary) > DICTIONARY_BYTES:
        raise ValueError(f"{base!r} ({len(dictionary)} bytes) is not a base a bundle can be stored against")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS, 9, zdict=dictionary)
    return _header(base) + deflate.compress(canonical) + deflate.flush()


def _header(base: str) -> bytes:
    """What precedes the deflate stream of a bundle stored against ``base``: the name packed
    (``COMPACT_MAGIC``), or written out (``DELTA_MAGIC``) for a workspace token too long for its length byte."""
    _, workspace, digest = base.split("/")
    if len(workspace) > 255:
        return DELTA_MAGIC + base.encode() + b"\n"
    return COMPACT_MAGIC + bytes([len(workspace)]) + workspace.encode() + bytes.fromhex(digest)


def _split(stored: bytes) -> tuple[str, bytes]:
    """(the base's name, the deflate stream) of a bundle stored against a base; ("", stored) for one that is not."""
    if stored.startswith(COMPACT_MAGIC):
        at = len(COMPACT_MAGIC)
        size = stored[at] if len(stored) > at else 0
        workspace, digest = stored[at + 1:at + 1 + size], stored[at + 1 + size:at + 33 + size]
        text = f"bases/{workspace.decode('ascii', errors='replace')}/{digest.hex()}"
        if not size or len(digest) != 32 or not _BASE_NAME.fullmatch(text):
            raise PackingError(f"a bundle stored against a base names no valid base ({text[:80]!r})")
        return text, stored[at + 33 + size:]
    if not stored.startswith(DELTA_MAGIC):
        return "", stored
    name, newline, _ = stored[len(DELTA_MAGIC):len(DELTA_MAGIC) + 200].partition(b"\n")
    text = name.decode("ascii", errors="replace")
    if not newline or not _BASE_NAME.fullmatch(text):
        raise PackingError(f"a bundle stored against a base names no valid base ({text[:80]!r})")
    return text, stored[len(DELTA_MAGIC) + len(name) + 1:]


def base_of(stored: bytes) -> str:
    """The base object a stored bundle needs to read back (``pack_against``); "" when it needs none."""
    return _split(stored)[0]


def dictionary_of(base: str, stored: bytes) -> bytes:
    """The bytes of the base object ``base`` as stored (gzip), checked against the sha256 its name carries;
    ``PackingError`` saying which when they do not inflate or do not hash to it."""
    try:
        dictionary = unpack(stored)
    except PackingError as exc:
        raise PackingError(f"its base {base} is damaged: {exc}") from exc
    got = hashlib.sha256(dictionary).hexdigest()
    if got != base.rsplit("/", 1)[-1]:
        raise PackingError(f"its base {base} hashes to {got[:12]}…: it was modified")
    return dictionary


def unpack(stored: bytes, *, dictionary: bytes | None = None) -> bytes:
    """The canonical JSON of a stored bundle, compressed, deflated against a base (whose bytes the caller read
    and checked: ``dictionary``), or (stored before compression) plain."""
    base, body = _split(stored)
    if base:
        if dictionary is None:
            raise PackingError(f"a bundle stored against the base {base} read without it")
        return _inflate(zlib.decompressobj(wbits=-zlib.MAX_WBITS, zdict=dictionary), body)
    if not stored.startswith(GZIP_MAGIC):
        return stored
    return _inflate(zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), stored)  # gzip framing


def _inflate(inflate: zlib._Decompress, stored: bytes) -> bytes:
    try:
        out = inflate.decompress(stored, MAX_UNPACKED)
    except zlib.error as exc:
        raise PackingError(f"a compressed bundle that does not inflate: {exc}") from exc
    if inflate.unconsumed_tail:
        raise PackingError(f"a compressed bundle inflating past {MAX_UNPACKED} bytes")
    if not inflate.eof:
        raise PackingError("a compressed bundle cut short")
    return out
