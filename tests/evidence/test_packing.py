"""Bundles are stored gzip-compressed and read back as their canonical JSON; plain bundles (stored before
compression) read as they are; damaged or oversized compressed bytes are refused, never returned."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from taugrid.evidence import packing

BUNDLE = (b'{"schema":"taugrid.evidence.bundle/v1","config":{"text":"name: x\\n"},"events":['
          + b'{"type":"a"},' * 200 + b'{}]}')


def test_a_bundle_packs_deterministically_and_unpacks_to_its_canonical_bytes() -> None:
    stored = packing.pack(BUNDLE)
    assert stored[:2] == packing.GZIP_MAGIC and stored == packing.pack(BUNDLE)
    assert len(stored) < len(BUNDLE) // 10
    assert packing.unpack(stored) == BUNDLE


def test_a_plain_bundle_stored_before_compression_reads_as_it_is() -> None:
    assert packing.unpack(BUNDLE) == BUNDLE
    assert packing.unpack(b"") == b""


def test_damaged_cut_or_oversized_compressed_bytes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    stored = packing.pack(BUNDLE)
    with pytest.raises(packing.PackingError, match="does not inflate"):
        packing.unpack(stored[:10] + b"\xff" * 20 + stored[30:])
    with pytest.raises(packing.PackingError, match="cut short"):
        packing.unpack(stored[: len(stored) // 2])
    monkeypatch.setattr(packing, "MAX_UNPACKED", 1024)
    with pytest.raises(packing.PackingError, match="inflating past 1024 bytes"):
        packing.unpack(gzip.compress(b"x" * 4096))


BASE = f"bases/ws-1/{hashlib.sha256(BUNDLE[-100:]).hexdigest()}"


def test_a_bundle_packed_against_a_base_reads_back_only_with_it() -> None:
    dictionary = BUNDLE[-100:]
    stored = packing.pack_against(BUNDLE, base=BASE, dictionary=dictionary)
    assert stored.startswith(packing.COMPACT_MAGIC) and packing.base_of(stored) == BASE
    # the base's name packed (issue 27): magic, the workspace token's length and the token, the raw sha256
    assert stored[:4 + 1 + 4 + 32] == packing.COMPACT_MAGIC + b"\x04ws-1" + bytes.fromhex(BASE[-64:])
    assert packing.unpack(stored, dictionary=dictionary) == BUNDLE
    assert packing.base_of(packing.pack(BUNDLE)) == "" and packing.base_of(BUNDLE) == ""
    with pytest.raises(packing.PackingError, match=f"stored against the base {BASE} read without it"):
        packing.unpack(stored)
    with pytest.raises(packing.PackingError, match="names no valid base"):
        packing.base_of(packing.DELTA_MAGIC + b"runs/../x\n" + stored[-20:])
    with pytest.raises(ValueError, match="is not a base"):
        packing.pack_against(BUNDLE, base="bases/ws-1/abc", dictionary=dictionary)


def test_a_base_is_checked_against_the_sha256_its_name_carries() -> None:
    assert packing.dictionary_of(BASE, packing.pack(BUNDLE[-100:])) == BUNDLE[-100:]
    with pytest.raises(packing.PackingError, match=f"its base {BASE} hashes to .*: it was modified"):
        packing.dictionary_of(BASE, packing.pack(BUNDLE[-99:]))
    with pytest.raises(packing.PackingError, match=f"its base {BASE} is damaged: a compressed bundle cut short"):
        packing.dictionary_of(BASE, packing.pack(BUNDLE[-100:])[:20])


def test_a_bundle_an_earlier_release_stored_against_a_base_with_its_name_written_out_reads_the_same() -> None:
    dictionary = BUNDLE[-100:]
    compact = packing.pack_against(BUNDLE, base=BASE, dictionary=dictionary)
    body = compact[4 + 1 + 4 + 32:]
    earlier = packing.DELTA_MAGIC + BASE.encode() + b"\n" + body
    assert packing.base_of(earlier) == BASE and packing.unpack(earlier, dictionary=dictionary) == BUNDLE
    assert len(earlier) - len(compact) == len(packing.DELTA_MAGIC) + len(BASE) + 1 - (4 + 1 + 4 + 32)  # 60 B


@pytest.mark.parametrize("header", [
    packing.COMPACT_MAGIC,  # cut after the magic
    packing.COMPACT_MAGIC + b"\x00" + bytes(32),  # no workspace
    packing.COMPACT_MAGIC + b"\x04ws-1" + bytes(31),  # the sha256 cut short
    packing.COMPACT_MAGIC + b"\x04ws/1" + bytes(32),  # not a workspace token
])
def test_a_packed_base_name_that_is_no_base_is_refused(header: bytes) -> None:
    with pytest.raises(packing.PackingError, match="names no valid base"):
        packing.base_of(header)
    with pytest.raises(packing.PackingError, match="names no valid base"):
        packing.unpack(header, dictionary=b"x")

