"""A deterministic snapshot of the submitted project directory (tar.gz), stored in the object store.

Deterministic (sorted entries, zeroed times and owners) so the same tree gives the same digest, which names
the object: re-submitting unchanged code stores nothing new.

What goes in follows git's rules (``pathspec``'s gitignore semantics): built-in excludes (VCS and virtualenv
folders, caches, ``outputs/``, ``checkpoints/``), then every ``.gitignore`` from the root down (a deeper file
overrides a shallower one), then ``run.working_dir_excludes`` last, so the config has the final word
(``data/`` matches the directory, ``*.pt`` any file, ``!keep.pt`` brings one back). As in git, nothing below
an excluded directory can be brought back.

The size limit (``MAX_BYTES``) is enforced here, in the client, before anything is uploaded: it keeps the
object store (the NATS server's disk) for code, not data.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from taugrid.core.errors import PermanentError
from taugrid.core.limits import SNAPSHOT_MAX_BYTES

DEFAULT_EXCLUDES = [
    ".git/",
    ".venv/",
    "venv/",
    "__pycache__/",
    "node_modules/",
    ".tau/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    "outputs/",
    "checkpoints/",
]
MAX_BYTES = SNAPSHOT_MAX_BYTES
_MiB = 1 << 20


@dataclass
class _Rules:
    """gitignore levels, shallowest first: (directory relative to the root, its spec)."""

    levels: list[tuple[str, pathspec.GitIgnoreSpec]] = field(default_factory=list)
    last: pathspec.GitIgnoreSpec | None = None

    def excluded(self, rel: str, *, is_dir: bool) -> bool:
        verdict: bool | None = None
        probe = rel + "/" if is_dir else rel
        for base, spec in self.levels:
            if base and not rel.startswith(base + "/"):
                continue
            hit = spec.check_file(probe[len(base) + 1 :] if base else probe).include
            if hit is not None:
                verdict = hit
        if self.last is not None:
            hit = self.last.check_file(probe).include
            if hit is not None:
                verdict = hit
        return bool(verdict)


def project_files(root: Path, *, extra_excludes: list[str] | None = None) -> list[tuple[str, Path, int]]:
    """The files a snapshot of ``root`` holds: (path relative to root, path, size), sorted by relative path."""
    rules = _Rules(levels=[("", pathspec.GitIgnoreSpec.from_lines(DEFAULT_EXCLUDES))])
    if extra_excludes:
        rules.last = pathspec.GitIgnoreSpec.from_lines(extra_excludes)
    out: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        base = here.relative_to(root).as_posix()
        base = "" if base == "." else base
        ignore_file = here / ".gitignore"
        if ignore_file.is_file():
            lines = ignore_file.read_text(errors="replace").splitlines()
            rules.levels.append((base, pathspec.GitIgnoreSpec.from_lines(lines)))
        kept = []
        for d in sorted(dirnames):
            rel = f"{base}/{d}" if base else d
            if not (here / d).is_symlink() and not rules.excluded(rel, is_dir=True):
                kept.append(d)
        dirnames[:] = kept
        for fn in sorted(filenames):
            path = here / fn
            rel = f"{base}/{fn}" if base else fn
            if path.is_symlink() or not path.is_file() or rules.excluded(rel, is_dir=False):
                continue
            out.append((rel, path, path.stat().st_size))
    out.sort(key=lambda f: f[0])
    return out


def _too_big(root: Path, files: list[tuple[str, Path, int]], total: int) -> PermanentError:
    """The size error: how big, what is biggest (top-level entries, directories summed), and what to do."""
    by_entry: dict[str, int] = {}
    for rel, _, size in files:
        top, sep, _ = rel.partition("/")
        key = top + "/" if sep else top
        by_entry[key] = by_entry.get(key, 0) + size
    biggest = sorted(by_entry.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    listed = ", ".join(f"{name} ({size / _MiB:.1f} MiB)" for name, size in biggest)
    return PermanentError(
        f"the project snapshot of {root} is {total / _MiB:.0f} MiB (limit {MAX_BYTES // _MiB} MiB); biggest: "
        f"{listed}. Exclude large files with run.working_dir_excludes (gitignore patterns, e.g. \"data/\") "
        "or .gitignore, and read data from where it lives: an absolute path on this machine, "
        "storage.data_pvc (mounted at /data) on Kubernetes"
    )


def snapshot(root: Path, *, extra_excludes: list[str] | None = None) -> tuple[bytes, str]:
    """Returns (tar.gz bytes, ``sha256:<hex>``); raises ``PermanentError`` over ``MAX_BYTES``."""
    files = project_files(root, extra_excludes=extra_excludes)
    total = sum(size for _, _, size in files)
    if total > MAX_BYTES:
        raise _too_big(root, files, total)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for rel, path, _ in files:
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
    data = buf.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def source_object(digest: str) -> str:
    """The object store name of a snapshot: ``sources/<hex>.tar.gz`` (what the pods' source fetcher reads)."""
    return f"sources/{digest.removeprefix('sha256:')}.tar.gz"
