"""How one ``TAU_*`` value is read: a declaration (:func:`setting`) and the parsers it names.

A value that does not parse is a :class:`SettingsError` naming the variable, the value, what it must be and
how to fix it (``TAU_HEALTH_DRAIN_GRACE_S='abc': must be a whole number of seconds; set e.g.
TAU_HEALTH_DRAIN_GRACE_S=30, or unset it for the default (30)``). A variable that is unset, or set to blank,
takes its default; the two that treat blank as a value of its own (no container engine, no InfiniBand tree)
say so with ``blank=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taugrid.core.errors import ConfigError
from taugrid.core.quantity import parse_memory


class SettingsError(ConfigError):
    """A ``TAU_*`` variable whose value cannot be used; ``str()`` names it and the fix."""


@dataclass(frozen=True)
class Parser:
    """``read(raw) -> value`` (raises ValueError), ``kind`` what it takes (for errors and the table), ``example``
    a value that parses."""

    read: Callable[[str], Any]
    kind: str
    example: str


@dataclass(frozen=True)
class Var:
    """One variable as a field declares it (``dataclasses.field(metadata={"var": Var(...)})``)."""

    env: str
    parse: Parser
    why: str
    blank: bool = False  # set but blank is a value (parsed), not "unset"


def setting(env: str, default: Any, parse: Parser, why: str, *, blank: bool = False) -> Any:
    """A settings field read from ``env``; ``default`` when unset."""
    return field(default=default, metadata={"var": Var(env, parse, why, blank)})


def read(var: Var, raw: str | None, default: Any) -> Any:
    """``raw`` (None: unset) as ``var`` takes it."""
    if raw is None or (not raw.strip() and not var.blank):
        return default
    try:
        return var.parse.read(raw.strip())
    except ValueError as exc:
        detail = f" ({exc})" if str(exc) else ""
        raise SettingsError(f"{var.env}={raw!r}: must be {var.parse.kind}{detail}; set e.g. "
                            f"{var.env}={var.parse.example}, or unset it for the default "
                            f"({describe(default)})") from None


def describe(default: Any) -> str:
    """A default as the table and the errors show it."""
    if default is None:
        return "unset"
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default) if default != "" else "empty"


def _log_level(raw: str) -> str:
    if raw.upper() not in LOG_LEVELS:
        raise ValueError("")
    return raw.upper()


def _whole(raw: str) -> int:
    if not raw.lstrip("-").isdigit():
        raise ValueError("")
    return int(raw)


def _at_least(low: int, then: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(raw: str) -> Any:
        value = then(raw)
        if value < low:
            raise ValueError("")
        return value
    return check


def _between(low: int, high: int) -> Callable[[str], int]:
    def check(raw: str) -> int:
        value = _whole(raw)
        if not low <= value <= high:
            raise ValueError("")
        return value
    return check


def _number(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("")
    return value


def _above_zero(raw: str) -> float:
    value = _number(raw)
    if value <= 0:
        raise ValueError("")
    return value


def _flag(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


def _quantity(raw: str) -> int:
    value = parse_memory(raw)
    if value < 0:
        raise ValueError("")
    return value


def choice(*options: str) -> Parser:
    def pick(raw: str) -> str:
        if raw.lower() not in options:
            raise ValueError("")
        return raw.lower()
    return Parser(pick, "one of " + ", ".join(options), options[0])


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL = Parser(_log_level, "one of " + ", ".join(LOG_LEVELS), "WARNING")
TEXT = Parser(str, "text", "value")
PATH = Parser(lambda raw: Path(raw).expanduser(), "a path", "/path")
WHOLE = Parser(_whole, "a whole number", "3")
COUNT = Parser(_at_least(0, _whole), "a whole number, 0 or more", "3")
WHOLE_SECONDS = Parser(_at_least(0, _whole), "a whole number of seconds", "30")
SECONDS = Parser(_at_least(0, _number), "a number of seconds", "10")
POSITIVE_SECONDS = Parser(_above_zero, "a number of seconds above 0", "5")
NUMBER = Parser(_number, "a number", "0.5")
PORT = Parser(_between(0, 65535), "a port number, 0 to 65535", "8080")
FLAG = Parser(_flag, "1, true, yes, on or 0, false, no, off", "1")
NAMES = Parser(_names, "a comma-separated list of names", "a,b")
QUANTITY = Parser(_quantity, "a size in bytes, e.g. 64Mi or 1G", "64Mi")
REPLICAS = Parser(_between(1, 5), "a whole number from 1 to 5 (3 for a 3-node cluster)", "3")
