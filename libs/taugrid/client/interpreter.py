"""Which Python the researcher means: the interpreter recorded with a submission.

The ``tau`` CLI runs in taugrid's own virtualenv, so ``sys.executable`` is never the answer. In order:
``TAU_PYTHON`` (an explicit pin, per run), the project's own ``.venv`` next to ``tau.yaml``, the active
virtualenv (``VIRTUAL_ENV``), the active conda environment (``CONDA_PREFIX``), then the first ``python3`` on
``PATH``. Pure lookups on the local filesystem; nothing is executed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path


def _in_env(prefix: str) -> str:
    for rel in ("bin/python3", "bin/python", "Scripts/python.exe"):
        candidate = Path(prefix) / rel
        if candidate.is_file():
            return str(candidate)
    return ""


def submitting_python(project: Path, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(interpreter path, where it came from); ("", "") when none is found."""
    env = os.environ if environ is None else environ
    pinned = env.get("TAU_PYTHON", "")
    if pinned:
        found = pinned if os.sep in pinned else shutil.which(pinned, path=env.get("PATH")) or pinned
        return str(Path(found).absolute()), "TAU_PYTHON"
    own = _in_env(str(project / ".venv"))
    if own:
        return str(Path(own).absolute()), "project .venv"
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if env.get(var) and (found := _in_env(env[var])):
            return found, var
    on_path = shutil.which("python3", path=env.get("PATH"))
    return (on_path, "PATH") if on_path else ("", "")
