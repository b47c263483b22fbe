"""The JSON a service's run event is stored as: its Struct with every field at its default left out.

Pure (no I/O). Invariant: ``msgspec.json.decode(encode(value), type=type(value)) == value`` for every contract
Struct, since decoding fills each missing field with its default, and the JSON Schema the contract publishes
(``docs/events.schema.json``) already marks those fields optional and names their defaults. The Structs keep
their own encoding (``omit_defaults`` is not set on them): the run record, the evidence bundle and every
``--output json`` write them whole; only what is stored on the bus for every run, twice (RUNS and AUDIT), is
written without what a reader knows anyway (issue 27: ~1.7 KB of a trivial run's ~7 KB of run-event bodies).
A field whose default is a factory (``[]``, ``{}``) is left out when equal to a fresh one.

A Struct may also name fields that follow from its others (``wire_derived``: each such field's name and the value
it then has; for a Struct field, a mapping of that Struct's own derived fields). Such a field is left out when it
has that value, and the Struct's ``__post_init__`` gives it back at decoding, where it finds the field at its
default: the invariant above holds for it too (``ResolvedRun``'s checkpoint directories, issue 27).
"""

from __future__ import annotations

from typing import Any

import msgspec

_NO = msgspec.NODEFAULT


# Values ``plain`` hands back as they are, looked up by exact type: most fields of a record are one of them, and a
# record is encoded at each of its run's events (issue 30: the walk was ~15 % of run_record's CPU).
_SCALARS = frozenset({str, int, float, bool, type(None)})
_FIELDS: dict[type[msgspec.Struct], tuple[tuple[str, str, Any, Any], ...]] = {}
_FIELDS_MAX = 512  # Struct types seen (a fixed set in practice; bounded against types made at run time)


def _fields(kind: type[msgspec.Struct]) -> tuple[tuple[str, str, Any, Any], ...]:
    """(attribute, JSON name, default, what its default factory makes) of each field of ``kind``; computed once
    per Struct. A factory is called once here, not at every comparison: the factories of the contracts (``list``,
    ``dict``, ``set``, a Struct of defaults, a constant list) always make equal values, and the value made is only
    ever compared with, never handed out."""
    found = _FIELDS.get(kind)
    if found is None:
        if len(_FIELDS) >= _FIELDS_MAX:
            _FIELDS.clear()
        found = _FIELDS[kind] = tuple(
            (f.name, f.encode_name, f.default, _NO if f.default_factory is _NO else f.default_factory())
            for f in msgspec.structs.fields(kind))
    return found


def _derives(kind: type[msgspec.Struct]) -> bool:
    """Whether ``kind`` names fields that follow from its others (``wire_derived``); looked up once per Struct."""
    found = _DERIVES.get(kind)
    if found is None:
        if len(_DERIVES) >= _FIELDS_MAX:
            _DERIVES.clear()
        found = _DERIVES[kind] = callable(getattr(kind, "wire_derived", None))
    return found


_DERIVES: dict[type[msgspec.Struct], bool] = {}


def plain(value: Any, derived: dict[str, Any] | None = None) -> Any:
    """``value`` as JSON-ready values, every Struct inside it as a dict without its fields at their defaults, nor
    those at the value they follow from the Struct's others (``derived``: its container's say about its fields)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, msgspec.Struct):
        if _derives(kind):
            derived = {**(derived or {}), **value.wire_derived()}  # type: ignore[attr-defined]
        out: dict[str, Any] = {}
        for name, key, default, made in _fields(kind):
            field = getattr(value, name)
            field_kind = type(field)
            if default is not _NO:
                if field_kind is type(default) and field == default:
                    continue
            elif made is not _NO and field == made:
                continue
            if derived is not None and name in derived:
                follows = derived[name]
                if isinstance(follows, dict) and isinstance(field, msgspec.Struct):
                    nested = plain(field, follows)
                    if nested or (default is _NO and made is _NO):  # {} of a field with a default: decoding
                        out[key] = nested                               # gives that back, then derives the rest
                    continue
                if field == follows:
                    continue
            out[key] = field if field_kind in _SCALARS else plain(field)
        return out
    if isinstance(value, (list, tuple)):
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if isinstance(value, dict):
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    return value


def encode(value: msgspec.Struct) -> bytes:
    """The JSON of ``value`` with every field at its default left out (see the module docstring)."""
    return msgspec.json.encode(plain(value))
