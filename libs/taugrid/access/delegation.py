"""A person's signed permission for one service to act for them for a while: the web portal's session.

A token is ``<base64url(JSON body)>.<base64url(signature)>`` (no padding). The body is the msgspec JSON of
``Delegation{user, delegate, issued, expires}``; the signature is the person's nkey (ed25519) over the UTF-8 bytes
``tau-delegation-v1\\n`` + the body. ``tau portal`` (and ``tau up`` for the stack's owner) issues one naming the
portal's public key as ``delegate``.

Two readers trust it, and each checks it in full (signature, expiry, the delegate is who presents it):
- the portal, to know who is signed in (the token is the session cookie);
- ``signers.Signers.identify``, for a request the portal signs with its own key and carries the token in the
  ``tau-delegation`` header: the request then counts as the person's, so the same authorization applies to a
  cancel from the portal as to ``tau cancel``. Nobody else can use a token: the delegate must sign the request.
"""

from __future__ import annotations

import base64
import binascii
import time

import msgspec
import nkeys

from taugrid.bus.envelope import DELEGATION_HEADER, SignatureInvalid, verify_form

SCHEME = "tau-delegation-v1"
HEADER = DELEGATION_HEADER
MAX_TTL_S = 7 * 86400.0  # a session at most a week long
CLOCK_SKEW_S = 60.0  # issued this far in the future is still accepted (two machines' clocks)


class Delegation(msgspec.Struct, frozen=True, kw_only=True):
    user: str  # the person's public nkey (U…)
    delegate: str  # the public nkey of the service allowed to act for them
    issued: float  # epoch seconds
    expires: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _form(body: bytes) -> bytes:
    return SCHEME.encode() + b"\n" + body


def issue(seed: bytes, *, delegate: str, ttl_s: float, now: float | None = None) -> str:
    """A token by the person whose nkey ``seed`` is, letting ``delegate`` act for them for ``ttl_s`` seconds."""
    if not 0 < ttl_s <= MAX_TTL_S:
        raise ValueError(f"a delegation lasts between 1 s and {MAX_TTL_S / 86400:.0f} days, not {ttl_s:g} s")
    key = nkeys.from_seed(seed)
    issued = time.time() if now is None else now
    body = msgspec.json.encode(Delegation(user=key.public_key.decode(), delegate=delegate, issued=issued,
                                          expires=issued + ttl_s))
    return f"{_b64(body)}.{_b64(key.sign(_form(body)))}"


def read(token: str, *, delegate: str, now: float) -> Delegation:
    """The delegation in ``token`` if it is well formed, signed by its ``user``, names ``delegate`` and holds at
    ``now``; else ``SignatureInvalid`` saying which of these failed."""
    body_text, dot, sig_text = token.strip().partition(".")
    if not dot:
        raise SignatureInvalid(f"{HEADER} is not <body>.<signature>")
    try:
        body = _unb64(body_text)
        signed = msgspec.json.decode(body, type=Delegation)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise SignatureInvalid(f"{HEADER} body does not decode: {exc}") from exc
    verify_form(_form(body), public_key=signed.user, signature=sig_text)
    if signed.delegate != delegate:
        raise SignatureInvalid(f"{HEADER} was issued to {signed.delegate}, not to {delegate}")
    if signed.expires - signed.issued > MAX_TTL_S:
        raise SignatureInvalid(f"{HEADER} lasts longer than {MAX_TTL_S / 86400:.0f} days")
    if now > signed.expires:
        raise SignatureInvalid(f"{HEADER} expired {now - signed.expires:.0f} s ago: sign in again (`tau portal`)")
    if signed.issued > now + CLOCK_SKEW_S:
        raise SignatureInvalid(f"{HEADER} is issued in the future ({signed.issued - now:.0f} s): check the clocks")
    return signed
