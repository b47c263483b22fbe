"""Human-edited configuration: ``tau.yaml`` (a run) and ``platform.yaml`` (policy), and their resolution.

pydantic lives here and only here (the human edge); everything downstream receives msgspec ``ResolvedRun``s.
"""

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
