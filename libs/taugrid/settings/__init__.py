"""The one home of taugrid's settings: every ``TAU_*`` variable a process reads, parsed once, typed and frozen.

``current()`` is this process's :class:`Settings`, parsed from its environment on first use and kept; a service's
main reads it once (``taugrid.service``) and hands it, or the field it needs, down to what it builds. Code that
is given an environment of its own (a test, a child's ``env``) asks ``Settings.from_env(environ)``. The cache is
keyed by the ``TAU_*`` variables (and ``KUBECONFIG``) as they are: a process parses them once, and a test that
sets one (``monkeypatch.setenv``) gets a fresh parse, with no reset hook to forget. The variables are walked
again only when the environment changed at all (a copy of CPython's own dict of it is compared first), since
some callers ask once a message. A value that does not parse
is a ``SettingsError`` naming the variable and the fix. ``python -m taugrid.settings`` prints every variable
(docs/architecture.md §14 "Settings" holds that table; a test keeps them equal).

The data dir (``TAU_DATA_DIR``) holds the embedded stack (``stack.json``, its keys in ``creds/``, the bus's store,
pods, environments, outputs) and the CLI's own ``login.json``. Unset, it is:

- for root, ``/var/lib/taugrid``: the usual home of a service run by root, and one another OS user can pass
  through, so a root stack can run each workspace's runs as that workspace's own OS user
  (``taugrid.local.runas``; under root's 0700 home it could not). A root that already has a ``~/.tau`` from
  before this default keeps it (its stack, keys and runs) as long as ``/var/lib/taugrid`` does not exist;
- for anyone else, ``~/.tau``.

``tau up`` hands the resolved path to every service it starts (``TAU_DATA_DIR``), so a service, the CLI and
``make run``/``make down`` agree on it. :func:`stack_data_dir` is that handed-down path only: None off the
embedded stack (e.g. on Kubernetes, where nothing is kept on a local disk). :func:`data_dir` is the one place
the default is resolved (at each call: ``tau up`` may create ``/var/lib/taugrid`` meanwhile).

Pure lookups: nothing is created here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from taugrid.settings.model import (
    HANDED_DOWN,
    HANDED_DOWN_PREFIXES,
    AnchorSettings,
    BusSettings,
    HealthSettings,
    KubeSettings,
    LocalSettings,
    Settings,
    variables,
)
from taugrid.settings.parse import SettingsError

__all__ = ["HANDED_DOWN", "HANDED_DOWN_PREFIXES", "AnchorSettings", "BusSettings", "HealthSettings",
           "KubeSettings", "LocalSettings", "Settings", "SettingsError", "current", "data_dir", "is_set", "of",
           "stack_data_dir", "variables"]

DATA_DIR_ENV = "TAU_DATA_DIR"
SYSTEM_DATA_DIR = Path("/var/lib/taugrid")  # root's default
HOME_DATA_DIR = ".tau"  # everyone else's, under their home

_cached: tuple[tuple[tuple[str, str], ...], Settings] | None = None
# os.environ's own dict of bytes as it was when ``_cached`` was last found current (CPython keeps the variables
# there): comparing it is one C-level dict comparison (~0.5 µs), where walking ``os.environ.items()`` decodes
# every name and value (~36 µs a call here; the evidence asks 4 times a seal and the submitter and the policy
# once a request, 2-5 % of their CPU samples). None where os.environ is not CPython's (then every call walks).
_environ_seen: dict[bytes, bytes] | None = None


def _tau_items() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("TAU", "KUBECONFIG"))))


def current() -> Settings:
    """This process's settings (see the module's docstring); ``SettingsError`` when a value does not parse."""
    global _cached, _environ_seen
    data = getattr(os.environ, "_data", None)
    if _cached is not None and _environ_seen is not None and data == _environ_seen:
        return _cached[1]  # the environment is as it was: no variable changed
    seen = dict(data) if isinstance(data, dict) else None  # before the walk: a change after it is seen next call
    key = _tau_items()
    if _cached is None or _cached[0] != key:
        _cached = (key, Settings.from_env(os.environ))
    _environ_seen = seen
    return _cached[1]


def of(environ: Mapping[str, str] | None) -> Settings:
    """``environ``'s settings, or this process's when None (for functions that take an optional environment)."""
    return current() if environ is None else Settings.from_env(environ)


def is_set(env: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` is set to a non-blank value (blank counts as unset, as the settings read it): for the
    few lookups whose unset case falls back somewhere other than the field's default (the client's bus URL
    falls back to ``tau login``'s server, then the embedded stack's, before ``nats://127.0.0.1:4222``)."""
    return bool((os.environ if environ is None else environ).get(env, "").strip())


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``TAU_DATA_DIR``, else the default for this OS user (see the module's docstring)."""
    given = stack_data_dir(environ)
    if given is not None:
        return given
    home = Path.home() / HOME_DATA_DIR
    if os.geteuid() != 0:
        return home
    if not SYSTEM_DATA_DIR.exists() and home.is_dir():
        return home  # made before root's default moved; its stack and keys stay where they are
    return SYSTEM_DATA_DIR


def stack_data_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """``TAU_DATA_DIR`` as set (the supervisor sets it for every service of the embedded stack), else None."""
    return of(environ).data.dir
