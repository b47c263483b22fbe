"""taugrid's own Python environment, which a run must never run in, and the clean interpreter beneath it.

The ``tau`` CLI and the local cluster run in taugrid's virtualenv (the repository's ``.venv``, or one made by
``uv tool install`` / ``pipx``), full of taugrid's dependencies (pydantic, nats, aiohttp, …). A run built on it
imports them without asking for them, so a missing requirement stays hidden until the run goes elsewhere.
``own_prefix`` names that environment ("" when taugrid runs in no virtualenv: there is nothing cleaner beneath
it), ``owns`` tells whether an interpreter or a directory lies in it, and ``base_python`` is the interpreter it was
created from: the same Python without any of taugrid's packages. ``clean_pythons`` adds the system's own
interpreters after it, for a run whose OS user cannot reach that base (e.g. a pyenv build under root's 0700 home
while runs run as per-workspace users). Pure lookups; nothing is executed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SYSTEM_PYTHONS = ("/usr/local/bin/python3", "/usr/bin/python3")  # as PATH orders them on most Linux systems
# The python_source of a submission whose interpreter was chosen because taugrid's own environment was passed over
# (it was active, or first on PATH): not the researcher's choice, so the run gets a virtualenv of its own on that
# interpreter, holding only what the project asks for. A base interpreter is not clean by itself: packages
# installed into its own site-packages (a pyenv build's `pip install pydantic`, Debian's python3-yaml) would
# otherwise be imported without being asked for.
CLEAN_BASE = "a clean base, taugrid's own environment passed over"


def own_prefix() -> str:
    """This process's virtualenv, or "" when it runs in none."""
    return sys.prefix if sys.prefix != sys.base_prefix else ""


def owns(path: str, prefix: str | None = None) -> bool:
    """Whether ``path`` (an interpreter or an environment's directory) lies in ``prefix`` (default: this process's
    virtualenv). An interpreter is judged by the directory it is in, never by where its link points: a
    virtualenv's ``bin/python`` is a link to the base interpreter."""
    root = own_prefix() if prefix is None else prefix
    if not root or not path:
        return False
    p = Path(path).absolute()
    where = p if p.is_dir() else p.parent
    try:
        return where.resolve().is_relative_to(Path(root).resolve())
    except OSError:
        return False


def base_python() -> str:
    """The interpreter this process's virtualenv was created from; this process's own outside a virtualenv."""
    if not own_prefix():
        return sys.executable
    base = getattr(sys, "_base_executable", "")
    if base and os.access(base, os.X_OK) and not owns(base):
        return str(base)
    v = sys.version_info
    for name in (f"python{v.major}.{v.minor}", "python3", "python"):
        candidate = Path(sys.base_prefix) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return sys.executable


def clean_pythons() -> tuple[str, ...]:
    """Interpreters a run may fall back to, best first: :func:`base_python`, then the system's
    (``SYSTEM_PYTHONS``) that exist, none of them in taugrid's own virtualenv."""
    found = [base_python()]
    found += [p for p in SYSTEM_PYTHONS if os.path.isfile(p) and os.access(p, os.X_OK) and not owns(p)]
    return tuple(dict.fromkeys(found))
