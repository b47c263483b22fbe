"""Checks of a ``tau.yaml`` against the project folder it sits in, before anything is submitted.

``check_project`` returns issues (the run cannot work as written: a missing entrypoint file); ``advice``
returns warnings (the run works, but probably not as meant: retries that will never happen for a crash).
Neither raises; the caller decides.
"""

from __future__ import annotations

import os
from pathlib import Path

from taugrid.config.source import make_issue, raise_issues, suggest
from taugrid.config.taujob import TauConfig
from taugrid.core.classify import CRASH_HINT, covers

# where an entrypoint may be written, most specific first (the aliases TauConfig folds together)
_ENTRYPOINT_KEYS: tuple[tuple[str, ...], ...] = (
    ("entrypoint",), ("script",), ("run", "entrypoint"), ("run", "script"), ("run", "main_script"),
)
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".tau"}
_MAX_FILES = 5000


def _names_a_file(entrypoint: str) -> bool:
    """A script path (``train.py``, ``scripts/run.sh``), as opposed to a command on PATH or a shell line."""
    if any(ch.isspace() for ch in entrypoint):
        return False
    return entrypoint.endswith((".py", ".sh")) or "/" in entrypoint


def _project_files(root: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fn in sorted(filenames):
            found.append(str((Path(dirpath) / fn).relative_to(root)))
            if len(found) >= _MAX_FILES:
                return found
    return found


def check_project(cfg: TauConfig, project_dir: Path) -> list[dict[str, object]]:
    """Issues with ``cfg`` that only the project folder reveals: the entrypoint file must exist in it."""
    ep = cfg.entrypoint or ""
    if not ep or not _names_a_file(ep) or Path(ep).is_absolute() or (project_dir / ep).is_file():
        return []
    key = next((k for k in _ENTRYPOINT_KEYS if cfg.written(*k)), ("entrypoint",))
    guess = suggest(ep, _project_files(project_dir))
    message = f"{ep!r} does not exist in the project folder {project_dir}"
    fix = (
        f"did you mean '{guess}'?" if guess
        else "name a file in the project folder (paths are relative to the folder holding tau.yaml)"
    )
    issue = make_issue(".".join(key), message, fix, file=cfg.source_path, lines={})
    issue["line"] = cfg.line(*key)
    return [issue]


def project_root(cfg: TauConfig, config_dir: Path) -> tuple[Path, str]:
    """The folder shipped as the project, and the config's folder inside it (posix, "" when the same).

    The config's folder, unless a managed manifest's entrypoint names a script beside it
    (``../shared/train.py``): then the folder holding both, which must lie inside the same git work tree (a
    snapshot never climbs out of the repository). Raises ``ConfigError`` naming the entrypoint otherwise."""
    from taugrid.config.taurules import entrypoint_escape

    config_dir = config_dir.resolve()
    depth = entrypoint_escape(cfg)
    if depth <= 0 or not cfg.managed:
        return config_dir, ""
    root = config_dir.parents[depth - 1] if depth <= len(config_dir.parents) else None
    repo = next((d for d in [config_dir, *config_dir.parents] if (d / ".git").exists()), None)
    if root is None or repo is None or not (root == repo or repo in root.parents):
        key = next((k for k in _ENTRYPOINT_KEYS if cfg.written(*k)), ("entrypoint",))
        issue = make_issue(".".join(key), f"{cfg.entrypoint!r} leaves {config_dir} beyond its git repository",
                           "keep the script inside the repository that holds tau.yaml", file=cfg.source_path,
                           lines={})
        issue["line"] = cfg.line(*key)
        raise_issues([issue])
        raise AssertionError("unreachable")
    return root, config_dir.relative_to(root).as_posix()


def advice(cfg: TauConfig) -> list[str]:
    """Warnings about a valid config that probably does not do what its author meant."""
    res = cfg.resilience
    if res.max_retries > 0 and not covers(res.retry_on, "app_error"):
        listed = ", ".join(res.retry_on) or "nothing"
        return [
            f"resilience.max_retries is {res.max_retries} but resilience.retry_on ({listed}) does not cover "
            f"Error, so a crash is not retried: {CRASH_HINT}"
        ]
    return []
