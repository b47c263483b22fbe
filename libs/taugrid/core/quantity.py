"""Kubernetes-style quantities and human durations, parsed without any I/O.

Invariants: CPU parses to cores (``"500m"`` → 0.5), memory to whole bytes (``"64Gi"`` → 68719476736),
durations to seconds (``"5m"`` → 300.0). Every parser raises ``ValueError`` with a message a person can act
on, so pydantic validators can pass it straight through. ``bool`` is never a quantity (YAML ``yes`` must not
become 1 core).
"""

from __future__ import annotations

import math
import re

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

Number = str | int | float


def _split(value: Number, what: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number or a quantity string, not a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{what} must be a finite, non-negative number, got {value!r}")
        return float(value), ""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a number or a quantity string, got {type(value).__name__}")
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError(f"{what} {value!r} is not a quantity (examples: 2, 500m, 64Gi)")
    number = float(match.group(1)) * (10 ** int(match.group(2)) if match.group(2) else 1)
    return number, match.group(3)


def parse_cpu(value: Number) -> float:
    """CPU cores from ``2``, ``"2"``, ``"1.5"`` or ``"500m"``."""
    number, suffix = _split(value, "cpu")
    if suffix == "":
        return number
    if suffix == "m":
        return number / 1000.0
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise ValueError(f"cpu {value!r} has unknown unit {suffix!r}; use cores (2, 0.5) or millicores (500m)")


def parse_memory(value: Number) -> int:
    """Bytes from ``1073741824``, ``"64Gi"``, ``"512Mi"``, ``"1G"`` (binary and decimal suffixes)."""
    number, suffix = _split(value, "memory")
    if suffix == "":
        factor = 1
    elif suffix in _BINARY:
        factor = _BINARY[suffix]
    elif suffix in _DECIMAL:
        factor = _DECIMAL[suffix]
    elif suffix == "m":
        return math.ceil(number / 1000.0)  # Kubernetes millibytes; rare but legal
    else:
        raise ValueError(f"memory {value!r} has unknown unit {suffix!r}; use Ki, Mi, Gi, Ti (or k, M, G, T)")
    return math.ceil(number * factor)


def format_memory(value: int) -> str:
    """The shortest exact binary form: 68719476736 → ``"64Gi"``, 1500 → ``"1500"``."""
    if value < 0:
        raise ValueError(f"memory must be non-negative, got {value}")
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _BINARY[suffix]
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)


def human_bytes(value: float) -> str:
    """Bytes for a person, worded one way wherever taugrid prints a size: 209715200 → ``"200 MiB"``,
    1610612736 → ``"1.5 GiB"``, 512 → ``"512 B"`` (one decimal below 100 of a unit, none from there)."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= factor:
            amount = value / factor
            shown = f"{amount:.0f}" if amount >= 100 else f"{amount:.1f}".removesuffix(".0")
            return f"{shown} {unit}"
    return f"{value:.0f} B"


def format_cpu(value: float) -> str:
    """Cores as Kubernetes writes them: 2.0 → ``"2"``, 0.5 → ``"500m"``."""
    if value == int(value):
        return str(int(value))
    return f"{round(value * 1000)}m"


def parse_duration(value: Number) -> float:
    """Seconds from ``30``, ``"30"``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` or ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError("a duration must be seconds or a string like 30s, 5m, 1h, not a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a duration must be non-negative, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(
            f"a duration must be seconds or a string like 30s, 5m, 1h, got {type(value).__name__}"
        )
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a duration must be non-negative, got {value!r}")
        return seconds
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a duration; write seconds (90) or 30s, 5m, 1h, 1h30m, 2d")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
