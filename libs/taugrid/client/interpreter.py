"""Which Python the researcher means: the interpreter recorded with a submission.

The ``tau`` CLI runs in taugrid's own virtualenv, so ``sys.executable`` is never the answer, and neither is any
interpreter in that environment (``local.ownenv``): with taugrid's venv activated, as ``make run`` leaves it, a
run would otherwise import taugrid's packages without asking for them. In order: ``TAU_PYTHON`` (an explicit pin,
per run, honoured wherever it points), the project's own ``.venv`` next to ``tau.yaml``, the active virtualenv
(``VIRTUAL_ENV``), the active conda environment (``CONDA_PREFIX``), the first ``python3`` on ``PATH``. When
taugrid's own environment is active or first on ``PATH``, the researcher named no interpreter of theirs: the run
gets the first ``python3`` on ``PATH`` after taugrid's (else the interpreter taugrid's venv was made from) as a
clean base (``ownenv.CLEAN_BASE``), on which the local cluster makes a virtualenv holding only the project's
requirements, so neither taugrid's packages nor those installed into that interpreter are importable unasked.
``own_environment_note`` says so. Pure lookups on the local filesystem; nothing is executed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from taugrid import settings
from taugrid.local.ownenv import CLEAN_BASE, base_python, own_prefix, owns

BASE_SOURCE = CLEAN_BASE  # the python_source when taugrid's own environment was passed over


def _in_env(prefix: str) -> str:
    for rel in ("bin/python3", "bin/python", "Scripts/python.exe"):
        candidate = Path(prefix) / rel
        if candidate.is_file():
            return str(candidate)
    return ""


def _path_without(path: str | None, own: str) -> str | None:
    """``PATH`` without the directories of taugrid's own environment."""
    if path is None or not own:
        return path
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not owns(d, own))


def submitting_python(project: Path, environ: Mapping[str, str] | None = None, *,
                      own: str | None = None) -> tuple[str, str]:
    """(interpreter path, where it came from); ("", "") when none is found. ``own``: taugrid's environment
    (default: this process's virtualenv, ``local.ownenv.own_prefix``)."""
    env = os.environ if environ is None else environ
    mine = own_prefix() if own is None else own
    pinned = settings.of(environ).client.python
    if pinned:
        found = pinned if os.sep in pinned else shutil.which(pinned, path=env.get("PATH")) or pinned
        return str(Path(found).absolute()), "TAU_PYTHON"
    project_env = _in_env(str(project / ".venv"))
    if project_env and not owns(project_env, mine):
        return str(Path(project_env).absolute()), "project .venv"
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if env.get(var) and not owns(env[var], mine) and (found := _in_env(env[var])):
            return found, var
    passed_over = _own_is_chosen(env, mine)
    on_path = shutil.which("python3", path=_path_without(env.get("PATH"), mine))
    if on_path:
        return on_path, CLEAN_BASE if passed_over else "PATH"
    if mine:
        return base_python(), CLEAN_BASE
    return "", ""


def _own_is_chosen(env: Mapping[str, str], mine: str) -> bool:
    """Whether taugrid's own environment is what the researcher's shell would run: active, or first on PATH."""
    if not mine:
        return False
    first = shutil.which("python3", path=env.get("PATH")) or ""
    return owns(env.get("VIRTUAL_ENV", ""), mine) or owns(first, mine)


def own_environment_note(project: Path, environ: Mapping[str, str] | None = None, *, own: str | None = None) -> str:
    """What to tell the researcher when taugrid's own environment would have been their run's Python (it is
    active, or first on ``PATH``) and was passed over; "" otherwise."""
    env = os.environ if environ is None else environ
    mine = own_prefix() if own is None else own
    python, source = submitting_python(project, environ, own=mine)
    if source != CLEAN_BASE or not _own_is_chosen(env, mine):
        return ""
    return (f"the run's Python is a clean virtualenv on {python}, not taugrid's own environment {mine}: it sees "
            "only what the project asks for (requirements.txt, pyproject.toml, runtime.pip); a project .venv next "
            "to tau.yaml or TAU_PYTHON chooses another")
