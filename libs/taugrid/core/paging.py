"""Pages of a runs list, newest first, shared by ``tau list`` and the portal's ``/api/runs``.

Keyset paging: runs are ordered by (``created``, ``run_id``) descending and a cursor names the last row of a
page, so the next page starts right after it whatever was submitted meanwhile (new runs land on the first page,
never shift a later one). The cursor is opaque to callers: base64url (no padding) of the JSON
``[created, run_id]``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Protocol, TypeVar

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class BadPage(ValueError):
    """A limit or cursor that cannot be honoured; the message names the parameter and the fix."""


class Listed(Protocol):
    @property
    def created(self) -> float: ...

    @property
    def run_id(self) -> str: ...


R = TypeVar("R", bound=Listed)


def _key(record: Listed) -> tuple[float, str]:
    return (record.created, record.run_id)


def newest_first(records: Sequence[R]) -> list[R]:
    return sorted(records, key=_key, reverse=True)


def encode_cursor(record: Listed) -> str:
    raw = json.dumps([record.created, record.run_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(text: str, *, param: str = "cursor") -> tuple[float, str]:
    """The (created, run_id) a cursor names; ``BadPage`` naming ``param`` when it is not one we gave."""
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise BadPage(f"{param} {text!r} is not a cursor of a runs list: pass the `next` value of the "
                      "previous page unchanged") from exc
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int | float)
            or isinstance(value[0], bool) or not isinstance(value[1], str)):
        raise BadPage(f"{param} {text!r} is not a cursor of a runs list: pass the `next` value of the "
                      "previous page unchanged")
    return float(value[0]), value[1]


def parse_limit(text: str | int, *, param: str = "limit", maximum: int = MAX_LIMIT) -> int:
    """A page size between 1 and ``maximum``; ``BadPage`` naming ``param`` otherwise."""
    try:
        limit = int(text)
    except ValueError:
        raise BadPage(f"{param} must be a whole number from 1 to {maximum}, not {text!r}") from None
    if not 1 <= limit <= maximum:
        raise BadPage(f"{param} must be from 1 to {maximum}, not {limit}: ask for the next page with its "
                      "cursor instead of a larger page")
    return limit


def page(records: Sequence[R], *, limit: int | None, after: str = "", param: str = "cursor") -> tuple[list[R], str]:
    """Up to ``limit`` of ``records`` (any order; None: all) newest first, starting after the cursor ``after``;
    and the cursor of the next page ("" when this one is the last)."""
    ordered = newest_first(records)
    if after:
        mark = decode_cursor(after, param=param)
        ordered = [r for r in ordered if _key(r) < mark]
    if limit is None or len(ordered) <= limit:
        return ordered, ""
    shown = ordered[:limit]
    return shown, encode_cursor(shown[-1])
