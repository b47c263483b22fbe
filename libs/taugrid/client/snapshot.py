"""A deterministic snapshot of the submitted project directory (tar.gz), stored in the object store.

Deterministic (sorted entries, zeroed times and owners) so the same tree gives the same digest, which names
the object: re-submitting unchanged code stores nothing new.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

from taugrid.core.errors import PermanentError

EXCLUDED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    ".tau",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "outputs",
    "checkpoints",
}
MAX_BYTES = 64 << 20


def snapshot(root: Path, *, extra_excludes: list[str] | None = None) -> tuple[bytes, str]:
    """Returns (tar.gz bytes, ``sha256:<hex>``)."""
    excludes = EXCLUDED_DIRS | set(extra_excludes or [])
    buf = io.BytesIO()
    total = 0
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in excludes)
            for fn in sorted(filenames):
                path = Path(dirpath) / fn
                if not path.is_file() or path.is_symlink():
                    continue
                total += path.stat().st_size
                if total > MAX_BYTES:
                    raise PermanentError(
                        f"project directory {root} is larger than {MAX_BYTES >> 20} MiB; keep data out of it "
                        "(use storage.data_pvc) or add the directory to run.working_dir_excludes"
                    )
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    data = buf.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()
