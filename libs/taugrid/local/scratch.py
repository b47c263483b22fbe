"""Files a local run wrote under its working directory, which is scratch: the pod's copy of the project
snapshot (``$TAU_DATA_DIR/pods/<pod>/work``), never collected, listed or kept as an output.

The shim takes an inventory before the process starts and compares after it ends; what is new or changed
(Python's own ``__pycache__`` aside) is reported in ``scratch.json`` in the pod directory and as one line at
the end of the run's log, pointing at ``$TAU_OUTPUT_DIR``. The evidence bundle carries ``scratch.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SCRATCH_FILE = "scratch.json"
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_LISTED = 20

Inventory = dict[str, tuple[int, int]]


def inventory(root: Path) -> Inventory:
    """Relative path → (size, mtime_ns) of every regular file under ``root``."""
    out: Inventory = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for fn in filenames:
            path = Path(dirpath) / fn
            try:
                st = path.lstat()  # the shim is root: a link the run made is listed, never followed
            except OSError:
                continue
            out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def written(before: Inventory, root: Path) -> list[str]:
    """Files under ``root`` that are new or changed since ``before``, sorted."""
    after = inventory(root)
    return sorted(rel for rel, stat in after.items() if before.get(rel) != stat)


def report(pod_dir: Path, work: Path, files: list[str], output_dir: str) -> str:
    """Write ``scratch.json`` and return the log line that warns about ``files`` (empty: nothing to say)."""
    if not files:
        return ""
    doc: dict[str, Any] = {"work_dir": str(work), "count": len(files), "files": files[:_LISTED]}
    (pod_dir / SCRATCH_FILE).write_text(json.dumps(doc))
    return warning(doc, output_dir)


def warning(doc: dict[str, Any], output_dir: str) -> str:
    names = ", ".join(doc["files"][:5]) + (", …" if doc["count"] > 5 else "")
    where = f" ({output_dir})" if output_dir else ""
    return (
        f"taugrid: wrote {doc['count']} file(s) under the run's working directory, which is scratch "
        f"({doc['work_dir']}): {names}; write to $TAU_OUTPUT_DIR{where} to keep them with the run"
    )


def read(pod_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((pod_dir / SCRATCH_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
