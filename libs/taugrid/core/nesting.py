"""JSON decoding bounded by depth: how every reader of an event's payload decodes it.

msgspec (like ``json``) recurses once per level and raises ``RecursionError`` near Python's recursion limit, which
no caller expected: a 200k-deep body crashed the run-record projection, evidence sealing and ``tau events``. And a
body a little under that limit decodes, then breaks whatever recurses over it further down a deeper stack (an
encoder, a walk). So a payload nesting deeper than ``EVENT_MAX_DEPTH`` is refused before it is decoded, as a
``msgspec.DecodeError`` (a ``PermanentError``-like outcome every consumer already dead-letters with its reason).

Invariants: pure (no I/O); the depth is measured on the bytes, strings skipped, so an attacker's nesting never
reaches a recursive decoder; the measure is linear (a 2 MB hostile body ~0.1 s).
"""

from __future__ import annotations

import itertools
import operator
import re
from typing import Any, TypeVar

import msgspec

from taugrid.core.limits import EVENT_MAX_DEPTH

T = TypeVar("T")

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
# an opening bracket counts 2 and a closing one 0, so the running sum at position i less (i + 1) is the depth there
_WEIGHT = bytes(2 if b in b"[{" else 0 for b in range(256))


def depth(data: bytes) -> int:
    """How many levels the JSON text ``data`` nests lists and objects (strings skipped); linear, in C loops."""
    skeleton = _STRING.sub(b"", data).translate(None, _NOT_BRACKET).translate(_WEIGHT)
    return max(map(operator.sub, itertools.accumulate(skeleton), itertools.count(1)), default=0)


def nests_deeper(data: bytes, limit: int = EVENT_MAX_DEPTH) -> bool:
    """Whether ``data`` nests more than ``limit`` levels deep; a payload no longer than the limit (each level takes
    a byte) is answered by its length, an ordinary one, with fewer brackets than the limit, by two ``bytes.count``
    calls."""
    return len(data) > limit and data.count(b"[") + data.count(b"{") > limit and depth(data) > limit


def too_deep(limit: int = EVENT_MAX_DEPTH) -> msgspec.DecodeError:
    return msgspec.DecodeError(
        f"JSON nests deeper than {limit} levels (the limit for an event payload, core.limits.EVENT_MAX_DEPTH): "
        "not read; a publisher must send flatter data")


def decode(data: bytes, kind: type[T]) -> T:
    """``msgspec.json.decode(data, type=kind)``, refusing hostile nesting with ``msgspec.DecodeError``."""
    if nests_deeper(data):
        raise too_deep()
    try:
        return msgspec.json.decode(data, type=kind)
    except RecursionError:  # a caller already deep in its stack: still the payload's fault, still permanent
        raise too_deep() from None


def decode_any(data: bytes) -> Any:
    """``msgspec.json.decode(data)`` (plain JSON values), refusing hostile nesting with ``msgspec.DecodeError``."""
    if nests_deeper(data):
        raise too_deep()
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise too_deep() from None
