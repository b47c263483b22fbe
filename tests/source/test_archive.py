"""The project snapshot follows .gitignore (nested too) and gitignore-style working_dir_excludes."""

from __future__ import annotations

import importlib
import io
import tarfile
from pathlib import Path

import pytest

from taugrid.core.errors import PermanentError

snap = importlib.import_module("taugrid.sources.archive")


def _names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def _tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def test_gitignore_and_nested_gitignore_are_honoured(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            ".gitignore": "*.pt\nlogs/\n!keep.pt\n",
            "train.py": "print(1)\n",
            "model.pt": "weights",
            "keep.pt": "small",
            "logs/run.log": "x",
            "pkg/.gitignore": "local.json\n!model.pt\n",
            "pkg/local.json": "{}",
            "pkg/model.pt": "re-included by the deeper file",
            "pkg/mod.py": "",
            ".venv/lib/x.py": "",
            "outputs/a.txt": "",
        },
    )
    data, digest = snap.snapshot(root)
    assert _names(data) == [".gitignore", "keep.pt", "pkg/.gitignore", "pkg/mod.py", "pkg/model.pt", "train.py"]
    assert digest.startswith("sha256:")
    assert snap.snapshot(root) == (data, digest)  # deterministic


def test_working_dir_excludes_are_gitignore_patterns(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"train.py": "", "data/x.csv": "1", "sub/data/y.csv": "2", "a.ckpt": "", "datafile.txt": ""},
    )
    data, _ = snap.snapshot(root, extra_excludes=["data/", "*.ckpt"])
    assert _names(data) == ["datafile.txt", "train.py"]
    # the bare name (the old spelling) still matches the directory
    data, _ = snap.snapshot(root, extra_excludes=["data"])
    assert _names(data) == ["a.ckpt", "datafile.txt", "train.py"]
    # anchored: only the top-level data/
    data, _ = snap.snapshot(root, extra_excludes=["/data/"])
    assert _names(data) == ["a.ckpt", "datafile.txt", "sub/data/y.csv", "train.py"]


def test_working_dir_excludes_have_the_last_word(tmp_path: Path) -> None:
    root = _tree(tmp_path, {".gitignore": "*.json\n", "config.json": "{}", "other.json": "{}", "t.py": ""})
    data, _ = snap.snapshot(root, extra_excludes=["!config.json"])
    assert _names(data) == [".gitignore", "config.json", "t.py"]


def test_too_big_names_the_biggest_paths_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snap, "MAX_BYTES", 3 << 20)
    root = _tree(
        tmp_path,
        {"train.py": "", "data/a.bin": b"\0" * (3 << 20), "data/b.bin": b"\0" * (1 << 20), "w.pt": b"\0" * (1 << 20)},
    )
    with pytest.raises(PermanentError) as err:
        snap.snapshot(root)
    assert str(err.value) == (
        f"the project snapshot of {root} is 5 MiB (limit 3 MiB); biggest: data/ (4.0 MiB), w.pt (1.0 MiB), "
        'train.py (0.0 MiB). Exclude large files with run.working_dir_excludes (gitignore patterns, e.g. "data/") '
        "or .gitignore, and read data from where it lives: an absolute path on this machine, "
        "storage.data_pvc (mounted at /data) on Kubernetes"
    )
    data, _ = snap.snapshot(root, extra_excludes=["data/"])
    assert _names(data) == ["train.py", "w.pt"]
