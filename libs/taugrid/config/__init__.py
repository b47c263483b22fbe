"""Human-edited configuration: ``tau.yaml`` (a run) and ``platform.yaml`` (policy), and their resolution.

pydantic lives here and only here (the human edge); everything downstream receives msgspec ``ResolvedRun``s.
The package's names load on first use (PEP 562): checking a ``tau.yaml`` needs no platform models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taugrid.config.machine import default_platform
    from taugrid.config.platform import Platform, load_platform
    from taugrid.config.platformcheck import check_platform
    from taugrid.config.resolve import resolve_run
    from taugrid.config.taujob import TauConfig, config_hash, load_tau_config, tau_json_schema

__all__ = [
    "Platform",
    "TauConfig",
    "check_platform",
    "config_hash",
    "default_platform",
    "load_platform",
    "load_tau_config",
    "resolve_run",
    "tau_json_schema",
]

_LAZY = {
    "default_platform": "machine", "Platform": "platform", "load_platform": "platform",
    "check_platform": "platformcheck", "resolve_run": "resolve", "TauConfig": "taujob", "config_hash": "taujob",
    "load_tau_config": "taujob", "tau_json_schema": "taujob",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"taugrid.config.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'taugrid.config' has no attribute {name!r}")
