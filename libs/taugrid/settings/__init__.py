"""Settings every layer resolves the same way, read here and nowhere else: where the embedded stack keeps its data.

The data dir (``TAU_DATA_DIR``) holds the embedded stack (``stack.json``, its keys in ``creds/``, the bus's store,
pods, environments, outputs) and the CLI's own ``login.json``. Unset, it is:

- for root, ``/var/lib/taugrid``: the usual home of a service run by root, and one another OS user can pass
  through, so a root stack can run each workspace's runs as that workspace's own OS user
  (``taugrid.local.runas``; under root's 0700 home it could not). A root that already has a ``~/.tau`` from
  before this default keeps it (its stack, keys and runs) as long as ``/var/lib/taugrid`` does not exist;
- for anyone else, ``~/.tau``.

``tau up`` hands the resolved path to every service it starts (``TAU_DATA_DIR``), so a service, the CLI and
``make run``/``make down`` agree on it. :func:`stack_data_dir` is that handed-down path only: None off the
embedded stack (e.g. on Kubernetes, where nothing is kept on a local disk).

Pure lookups: nothing is created here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DATA_DIR_ENV = "TAU_DATA_DIR"
SYSTEM_DATA_DIR = Path("/var/lib/taugrid")  # root's default
HOME_DATA_DIR = ".tau"  # everyone else's, under their home


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
    env = os.environ if environ is None else environ
    given = env.get(DATA_DIR_ENV, "").strip()
    return Path(given).expanduser() if given else None
