"""Secret values kept off disk and out of logs, with nothing else: what the pod shim needs of ``secrets``.

A pod's ``spec.json`` holds a placeholder (``\\0tau-secret-<n>\\0``; NUL cannot occur in an argument or env value,
so it never collides) where a secret value stood (``seal``); the shim gets the values on its stdin and puts them
back in memory just before the processes start (``unseal``), and blanks them from what it writes (``redactor``).
Its own module because the shim starts once per pod: importing ``secrets`` (the store, the settings, the pod
spec's planner) cost the shim's interpreter more than its own start.
"""

from __future__ import annotations

import json
import re
from typing import Any

from taugrid.core.redaction import Redactor

_PLACEHOLDER = re.compile("\x00tau-secret-([0-9]+)\x00")


def seal(doc: Any, values: list[str]) -> Any:
    """``doc`` with every occurrence of a secret value replaced by its placeholder (longest values first)."""
    order = sorted(range(len(values)), key=lambda i: -len(values[i]))

    def one(text: str) -> str:
        for i in order:
            if values[i]:
                text = text.replace(values[i], f"\x00tau-secret-{i}\x00")
        return text

    return _walk(doc, one)


def unseal(doc: Any, values: list[str]) -> Any:
    def one(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: values[int(m.group(1))], text) if "\x00" in text else text

    return _walk(doc, one)


def _walk(doc: Any, fn: Any) -> Any:
    if isinstance(doc, str):
        return fn(doc)
    if isinstance(doc, list):
        return [_walk(v, fn) for v in doc]
    if isinstance(doc, dict):
        return {k: _walk(v, fn) for k, v in doc.items()}
    return doc


def redactor(values: list[str]) -> Redactor:
    """What the shim blanks from a pod's logs: every value and its common encodings (``core.redaction``)."""
    return Redactor(values)


def encode_for_shim(values: list[str]) -> bytes:
    return json.dumps(values).encode()
