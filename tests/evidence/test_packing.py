"""Bundles are stored gzip-compressed and read back as their canonical JSON; plain bundles (stored before
compression) read as they are; damaged or oversized compressed bytes are refused, never returned."""

from __future__ import annotations

import gzip

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
