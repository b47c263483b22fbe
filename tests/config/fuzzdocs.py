"""Hypothesis strategies for tau.yaml and platform.yaml documents, generated from the JSON Schemas the code
publishes: mostly the right keys with values of the right and the wrong types, some unknown keys, and now and
then text mangled into invalid YAML. Used by tests/config/test_fuzz.py (a few hundred cases) and
bench/fuzz_config.py (10,000 and more)."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["1", "0.5", "2Gi", "500m", "30s", "1h", "-1", "gpu", "*", "../x", "/abs", "", "null",
                     "a100-1", "default", "Error", "Preempted", "Any", "python", "main.py", "x" * 300]),
)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def value_for(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A value shaped like ``schema`` most of the time, any junk otherwise."""
    schema = _resolve(schema, defs)
    if depth > 4:
        return SCALARS
    options = [s for key in ("anyOf", "oneOf") for s in schema.get(key, [])]
    if options:
        return st.one_of(*[value_for(o, defs, depth + 1) for o in options], SCALARS)
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), SCALARS)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return st.one_of(object_for(schema, defs, depth + 1), SCALARS)
    if kind == "array":
        item = value_for(schema.get("items", {}), defs, depth + 1)
        return st.one_of(st.lists(item, max_size=3), SCALARS)
    if kind == "string":
        return st.one_of(st.text(max_size=20), SCALARS)
    if kind in ("integer", "number"):
        return st.one_of(st.integers(min_value=-5, max_value=10**6), st.floats(allow_nan=False), SCALARS)
    if kind == "boolean":
        return st.one_of(st.booleans(), SCALARS)
    return SCALARS


def object_for(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    schema = _resolve(schema, defs)
    props: dict[str, Any] = schema.get("properties", {})
    if not props:
        return st.dictionaries(st.text(max_size=8), SCALARS, max_size=3)
    known = st.fixed_dictionaries({}, optional={k: value_for(v, defs, depth) for k, v in props.items()})
    unknown = st.dictionaries(st.sampled_from(["nmae", "extra", "Compute", "gpu", "x-y"]), SCALARS, max_size=2)
    return st.one_of(known, st.builds(lambda a, b: {**a, **b}, known, unknown))


def document(schema: dict[str, Any], base: dict[str, Any] | None = None) -> st.SearchStrategy[str]:
    """YAML text: a generated object (merged over ``base``, so many get past the required keys), or that text
    mangled (cut short, a character swapped in) into something YAML may refuse."""
    defs = schema.get("$defs", {})
    objects = object_for(schema, defs).map(lambda d: {**(base or {}), **d})
    texts = objects.map(lambda d: yaml.safe_dump(d, sort_keys=False, allow_unicode=True))

    def mangle(text: str, cut: int, char: str) -> str:
        at = cut % (len(text) + 1)
        return text[:at] + char + text[at + 1:]

    mangled = st.builds(mangle, texts, st.integers(min_value=0, max_value=10**4),
                        st.sampled_from([":", "[", "{", "&a", "*a", "\t", "'", '"', "\n  - ", "!!python/int "]))
    return st.one_of(texts, texts, texts, mangled)
