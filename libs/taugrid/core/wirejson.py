"""The JSON a service's run event is stored as: its Struct with every field at its default left out.

Pure (no I/O). Invariant: ``msgspec.json.decode(encode(value), type=type(value)) == value`` for every contract
Struct, since decoding fills each missing field with its default, and the JSON Schema the contract publishes
(``docs/events.schema.json``) already marks those fields optional and names their defaults. The Structs keep
their own encoding (``omit_defaults`` is not set on them): the run record, the evidence bundle and every
``--output json`` write them whole; only what is stored on the bus for every run, twice (RUNS and AUDIT), is
written without what a reader knows anyway (issue 27: ~1.7 KB of a trivial run's ~7 KB of run-event bodies).
A field whose default is a factory (``[]``, ``{}``) is left out when equal to a fresh one.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

_NO = msgspec.NODEFAULT


@functools.lru_cache(maxsize=512)
def _fields(kind: type[msgspec.Struct]) -> tuple[tuple[str, str, Any, Any], ...]:
    """(attribute, JSON name, default, default factory) of each field of ``kind``; computed once per Struct."""
    return tuple((f.name, f.encode_name, f.default, f.default_factory) for f in msgspec.structs.fields(kind))


def plain(value: Any) -> Any:
    """``value`` as JSON-ready values, every Struct inside it as a dict without its fields at their defaults."""
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        for name, key, default, factory in _fields(type(value)):
            field = getattr(value, name)
            if (default is not _NO and field == default and type(field) is type(default)) or \
                    (factory is not _NO and field == factory()):
                continue
            out[key] = plain(field)
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def encode(value: msgspec.Struct) -> bytes:
    """The JSON of ``value`` with every field at its default left out (see the module docstring)."""
    return msgspec.json.encode(plain(value))
