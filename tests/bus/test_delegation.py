"""Delegation tokens (the portal's sessions): what a token proves and every way it fails."""

from __future__ import annotations

import pytest

from taugrid.access import delegation
from taugrid.bus import identity
from taugrid.bus.envelope import SignatureInvalid

NOW = 1_800_000_000.0


def _pair() -> tuple[bytes, str]:
    seed = identity.new_user_seed()
    return seed, identity.public_key(seed)


def test_a_token_names_its_signer_and_holds_until_it_expires() -> None:
    seed, user = _pair()
    _, portal = _pair()
    token = delegation.issue(seed, delegate=portal, ttl_s=3600, now=NOW)
    got = delegation.read(token, delegate=portal, now=NOW + 3599)
    assert (got.user, got.delegate, got.issued, got.expires) == (user, portal, NOW, NOW + 3600)
    with pytest.raises(SignatureInvalid, match="tau-delegation expired 1 s ago"):
        delegation.read(token, delegate=portal, now=NOW + 3601)


def test_a_token_is_refused_for_another_delegate_tampered_or_malformed() -> None:
    seed, _ = _pair()
    _, portal = _pair()
    _, other = _pair()
    token = delegation.issue(seed, delegate=portal, ttl_s=60, now=NOW)
    with pytest.raises(SignatureInvalid, match=f"issued to {portal}, not to {other}"):
        delegation.read(token, delegate=other, now=NOW)
    body, sig = token.split(".")
    forged = delegation.issue(identity.new_user_seed(), delegate=portal, ttl_s=60, now=NOW).split(".")[1]
    with pytest.raises(SignatureInvalid, match="signature does not match"):
        delegation.read(f"{body}.{forged}", delegate=portal, now=NOW)
    with pytest.raises(SignatureInvalid, match="is not <body>.<signature>"):
        delegation.read(body, delegate=portal, now=NOW)
    with pytest.raises(SignatureInvalid, match="body does not decode"):
        delegation.read(f"bm90IGpzb24.{sig}", delegate=portal, now=NOW)


def test_a_token_from_the_future_or_longer_than_a_week_is_refused() -> None:
    seed, _ = _pair()
    _, portal = _pair()
    early = delegation.issue(seed, delegate=portal, ttl_s=60, now=NOW + 600)
    with pytest.raises(SignatureInvalid, match="issued in the future"):
        delegation.read(early, delegate=portal, now=NOW)
    with pytest.raises(ValueError, match="between 1 s and 7 days"):
        delegation.issue(seed, delegate=portal, ttl_s=8 * 86400)
