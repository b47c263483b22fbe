"""Pure checks on NATS nkey identities (no I/O): is a string a well-formed public user key.

A user nkey is the base32 (no padding) of one prefix byte (``U``), the 32-byte ed25519 public key and a
CRC16 checksum: 56 characters starting with ``U``.
"""

from __future__ import annotations

import base64
import binascii

import nkeys


def is_user_public_key(value: str) -> bool:
    """``U…`` public user nkey with a valid checksum."""
    if not value.startswith("U") or len(value) != 56:
        return False
    try:
        raw = base64.b32decode(value + "=" * (-len(value) % 8))
    except binascii.Error:
        return False
    return len(raw) == 35 and bytes(nkeys.crc16_checksum(raw[:-2])) == raw[-2:]
