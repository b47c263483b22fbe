"""Secret values blanked out of text, in the forms a program commonly prints them.

A run that prints a secret rarely prints only the literal value: ``base64``, ``hex``, URL-encoding and reversal
are one line of code each, and each carried the value past a redaction that matched the literal alone (into LOGS
and the evidence bundle). So every value is searched for as:
- itself and reversed;
- hex, lower and upper case;
- URL-encoded as the common encoders do (``quote``, ``quote_plus``, JavaScript's ``encodeURIComponent`` and
  ``encodeURI``; upper and lower case escapes);
- base64, standard and URL-safe alphabets, with and without ``=`` padding, and, since a value encoded as part
  of a longer string lands at one of three alignments, the characters that encode the value alone at each
  alignment (``_base64_cores``), so ``base64("token=" + value)`` loses the value too.

Invariants: pure (no I/O); longer forms are replaced first (a form that contains another is blanked whole); a
form shorter than ``REDACT_MIN`` bytes is never searched for (it would blank ordinary words), nor a base64 core
shorter than ``CORE_MIN`` (random base64-looking text would match it).
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"
REDACT_MIN = 4  # shorter values would blank out ordinary words of the log
CORE_MIN = 8  # a base64 fragment this long occurs by chance about once in 64**8 characters
# What URL encoders leave alone besides letters, digits and "_.-~": nothing (quote(safe="")), "/" (quote's default),
# JavaScript's encodeURIComponent, and encodeURI.
_URL_SAFE = ("", "/", "!'()*", ";,/?:@&=+$#!'()*")


def forms(value: str) -> set[bytes]:
    """Every form of ``value`` that is searched for (empty when the value is shorter than ``REDACT_MIN``)."""
    raw = value.encode()
    if len(raw) < REDACT_MIN:
        return set()
    found = {raw, value[::-1].encode(), binascii.hexlify(raw), binascii.hexlify(raw).upper()}
    for safe in _URL_SAFE:
        for quoted in (urllib.parse.quote(value, safe=safe), urllib.parse.quote_plus(value, safe=safe)):
            found |= {quoted.encode(), _lower_escapes(quoted).encode()}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw)
        found |= {whole, whole.rstrip(b"=")}
        found |= {core for core in _base64_cores(raw, encode) if len(core) >= CORE_MIN}
    return {f for f in found if len(f) >= REDACT_MIN}


def _lower_escapes(quoted: str) -> str:
    """``%2F`` → ``%2f``: both spellings decode the same, and encoders differ."""
    parts = quoted.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


def _base64_cores(raw: bytes, encode: Any) -> list[bytes]:
    """The base64 characters that encode ``raw`` alone when it starts ``k`` bytes into what is encoded (k = 0, 1,
    2): character ``i`` covers bits ``6i..6i+5``, so the ones wholly inside the value are ``ceil(8k/6)`` up to
    ``floor(8(k+n)/6)``; the characters around them mix in the neighbouring bytes, whatever they are."""
    out = []
    for k in range(3):
        encoded = encode(bytes(k) + raw)
        out.append(encoded[(8 * k + 5) // 6: (8 * (k + len(raw))) // 6])
    return out


class Redactor:
    """Blanks every form of the given values: ``bytes → bytes`` (a log stream), ``text`` and ``doc`` (JSON values).
    ``longest`` is how many bytes a caller cutting a stream into pieces must hold back so no form is split unseen.
    """

    def __init__(self, values: Iterable[str]) -> None:
        every: set[bytes] = set()
        for value in values:
            every |= forms(value)
        self.needles = sorted(every, key=lambda n: (-len(n), n))
        self.longest = len(self.needles[0]) if self.needles else 0
        self._texts = [n.decode(errors="surrogateescape") for n in self.needles]

    def __bool__(self) -> bool:
        return bool(self.needles)

    def __call__(self, data: bytes) -> bytes:
        # one C-speed replace per form, longest first; a regex alternation tried every form at every position
        for needle in self.needles:
            if needle in data:
                data = data.replace(needle, REDACTED.encode())
        return data

    def text(self, text: str) -> str:
        for needle in self._texts:
            if needle in text:
                text = text.replace(needle, REDACTED)
        return text

    def doc(self, value: Any) -> Any:
        """``value`` (plain JSON values) with every string, and every mapping key, redacted."""
        if not self.needles:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.doc(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.doc(v) for k, v in value.items()}
        return value
