"""What a local run writes under its scratch working directory is found and reported, not lost silently."""

from __future__ import annotations

import json
from pathlib import Path

from taugrid.local import scratch


def test_new_and_changed_files_are_reported_with_the_fix(tmp_path: Path) -> None:
    work = tmp_path / "pod" / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("print(1)\n")
    (work / "pkg" / "util.py").write_text("")
    before = scratch.inventory(work)
    (work / "model.pt").write_text("w")
    (work / "pkg" / "util.py").write_text("changed")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "train.cpython-311.pyc").write_text("")
    files = scratch.written(before, work)
    assert files == ["model.pt", "pkg/util.py"]
    line = scratch.report(tmp_path / "pod", work, files, "/out/ws/run")
    assert line == (
        f"taugrid: wrote 2 file(s) under the run's working directory, which is scratch ({work}): model.pt, "
        "pkg/util.py; write to $TAU_OUTPUT_DIR (/out/ws/run) to keep them with the run"
    )
    assert scratch.read(tmp_path / "pod") == {"work_dir": str(work), "count": 2, "files": ["model.pt", "pkg/util.py"]}
    assert json.loads((tmp_path / "pod" / "scratch.json").read_text())["count"] == 2


def test_nothing_written_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    before = scratch.inventory(tmp_path / "work")
    assert scratch.report(tmp_path, tmp_path / "work", scratch.written(before, tmp_path / "work"), "") == ""
    assert scratch.read(tmp_path) is None
