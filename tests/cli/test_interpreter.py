"""Which interpreter a submission records: the researcher's, never the tau CLI's own."""

from __future__ import annotations

from pathlib import Path

from taugrid.client.interpreter import submitting_python


def fake_env(root: Path, name: str) -> Path:
    python = root / name / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_an_explicit_pin_wins(tmp_path: Path) -> None:
    venv = fake_env(tmp_path, "venv")
    assert submitting_python(tmp_path, {"TAU_PYTHON": "/opt/py/bin/python3", "VIRTUAL_ENV": str(venv.parent.parent)}
                             ) == ("/opt/py/bin/python3", "TAU_PYTHON")


def test_the_projects_own_venv_beats_an_activated_one(tmp_path: Path) -> None:
    own = fake_env(tmp_path / "project", ".venv")
    other = fake_env(tmp_path, "other")
    got = submitting_python(tmp_path / "project", {"VIRTUAL_ENV": str(other.parent.parent)})
    assert got == (str(own), "project .venv")


def test_then_the_active_virtualenv_then_conda_then_path(tmp_path: Path) -> None:
    venv, conda, onpath = fake_env(tmp_path, "venv"), fake_env(tmp_path, "conda"), fake_env(tmp_path, "usr")
    project = tmp_path / "project"
    project.mkdir()
    both = {"VIRTUAL_ENV": str(venv.parent.parent), "CONDA_PREFIX": str(conda.parent.parent)}
    assert submitting_python(project, both) == (str(venv), "VIRTUAL_ENV")
    assert submitting_python(project, {"CONDA_PREFIX": str(conda.parent.parent)}) == (str(conda), "CONDA_PREFIX")
    assert submitting_python(project, {"PATH": str(onpath.parent)}) == (str(onpath), "PATH")
    assert submitting_python(project, {"PATH": str(tmp_path / "nothing")}) == ("", "")
