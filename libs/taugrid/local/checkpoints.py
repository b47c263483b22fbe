"""The checkpoint step an elastic run's restarted workers resume from, read from its checkpoint directory.

A run reports its checkpoints by naming them: each entry directly in ``TAU_CHECKPOINT_DIR`` whose name carries a
step (``step-120``, ``step_000120.pt``, ``epoch=2-step=120.ckpt``, Hugging Face's ``checkpoint-500``, DeepSpeed's
``global_step100``, ``ckpt_40``) counts, and the highest step is the one the workers load when torchrun restarts
them (docs §9). Names starting with ``.`` or ending in ``.tmp``/``.partial`` are a checkpoint still being written
(write, then rename) and are skipped.

Invariant: a pure read of names; nothing is opened, and a directory that cannot be listed says None, never fails
the resize.
"""

from __future__ import annotations

import os
import re
from typing import Any

from taugrid.local.jobpods import main_container, template

CHECKPOINT_DIR_ENV = "TAU_CHECKPOINT_DIR"
_STEP = re.compile(r"(?:step|checkpoint|ckpt)[-_=]?(\d+)", re.IGNORECASE)
_UNFINISHED = (".tmp", ".partial")


def step_of(name: str) -> int | None:
    """The step a checkpoint's name carries (its last step-like number), None for any other name."""
    if name.startswith(".") or name.endswith(_UNFINISHED):
        return None
    found = _STEP.findall(name)
    return int(found[-1]) if found else None


def latest_step(directory: str) -> int | None:
    """The highest step among the checkpoints in ``directory``; None when it holds none or cannot be listed."""
    if not directory:
        return None
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    steps = [s for s in map(step_of, names) if s is not None]
    return max(steps) if steps else None


def checkpoint_dir(job: dict[str, Any]) -> str:
    """The run's checkpoint directory on this machine, as its Job's main container is given it ("" for none)."""
    c = main_container(template(job).get("spec") or {})
    return next((str(e["value"]) for e in c.get("env") or [] if e.get("name") == CHECKPOINT_DIR_ENV
                 and "value" in e), "")
