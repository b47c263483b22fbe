"""Reusable pydantic field types for the human-edited configs: quantities, durations, lenient scalars.

Invariants: quantities are stored as the string the person wrote (numbers become their decimal string) after
being checked by ``core.quantity``; durations are stored as float seconds; JSON Schema for both admits a
string or a number, so editors accept ``"64Gi"``, ``16``, ``"30s"`` and ``90`` alike.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from pydantic import BeforeValidator, WithJsonSchema

from taugrid.core.quantity import parse_cpu, parse_duration, parse_memory


class Strict(pydantic.BaseModel):
    """Base of every config model: unknown keys are errors, never silently ignored."""

    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=False, validate_default=True)


def _as_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    return str(value)


def _cpu(value: Any) -> Any:
    if value is None:
        return value
    parse_cpu(value)
    return _as_text(value)


def _memory(value: Any) -> Any:
    if value is None:
        return value
    parse_memory(value)
    return _as_text(value)


def _duration(value: Any) -> Any:
    return value if value is None else parse_duration(value)


def _scalar_text(value: Any) -> Any:
    """YAML numbers (``LOG_LEVEL: 1``, ``--epochs 3``) read as the text meant; booleans spell out."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (int, float)) else value


_QTY_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "number", "minimum": 0}]}

CpuQuantity = Annotated[
    str,
    BeforeValidator(_cpu),
    WithJsonSchema({**_QTY_SCHEMA, "description": "CPU cores: 2, 0.5 or 500m"}),
]
MemoryQuantity = Annotated[
    str,
    BeforeValidator(_memory),
    WithJsonSchema({**_QTY_SCHEMA, "description": "bytes, or a quantity like 64Gi, 512Mi"}),
]
Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema({**_QTY_SCHEMA, "description": "seconds, or 30s, 5m, 1h, 1h30m, 2d"}),
]
Text = Annotated[
    str, BeforeValidator(_scalar_text), WithJsonSchema({"type": ["string", "number", "boolean"]})
]
