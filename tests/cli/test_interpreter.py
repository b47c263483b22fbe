"""Which interpreter a submission records: the researcher's, never the tau CLI's own."""

from __future__ import annotations

from pathlib import Path

from taugrid.client.interpreter import BASE_SOURCE, own_environment_note, submitting_python
from taugrid.local.ownenv import CLEAN_BASE, base_python, owns


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
    assert submitting_python(project, {"PATH": str(tmp_path / "nothing")}, own="") == ("", "")


def test_taugrids_own_venv_is_passed_over_even_when_active_and_first_on_path(tmp_path: Path) -> None:
    """With taugrid's venv activated (as `make run` leaves it), a run must not import taugrid's packages."""
    own, usr = fake_env(tmp_path, "taugrid-venv"), fake_env(tmp_path, "usr")
    project = tmp_path / "project"
    project.mkdir()
    activated = {"VIRTUAL_ENV": str(own.parent.parent), "PATH": f"{own.parent}:{usr.parent}"}
    mine = str(own.parent.parent)
    assert submitting_python(project, activated, own=mine) == (str(usr), CLEAN_BASE)  # a base, made clean
    first = {"PATH": f"{own.parent}:{usr.parent}"}  # not activated, but its python3 comes first on PATH
    assert submitting_python(project, first, own=mine) == (str(usr), CLEAN_BASE)
    assert submitting_python(project, {"PATH": str(usr.parent)}, own=mine) == (str(usr), "PATH")  # theirs
    alone = {"VIRTUAL_ENV": str(own.parent.parent), "PATH": str(own.parent)}
    assert submitting_python(project, alone, own=mine) == (base_python(), BASE_SOURCE)  # the clean base beneath
    assert submitting_python(project, {"TAU_PYTHON": str(own)}, own=mine) == (str(own), "TAU_PYTHON")  # asked for


def test_the_projects_venv_wins_and_the_note_says_when_taugrids_was_passed_over(tmp_path: Path) -> None:
    own, usr = fake_env(tmp_path, "taugrid-venv"), fake_env(tmp_path, "usr")
    mine = str(own.parent.parent)
    project = tmp_path / "project"
    project.mkdir()
    activated = {"VIRTUAL_ENV": mine, "PATH": f"{own.parent}:{usr.parent}"}
    assert own_environment_note(project, activated, own=mine) == (
        f"the run's Python is a clean virtualenv on {usr}, not taugrid's own environment {mine}: it sees only what "
        "the project asks for (requirements.txt, pyproject.toml, runtime.pip); a project .venv next to tau.yaml or "
        "TAU_PYTHON chooses another")
    assert own_environment_note(project, {"PATH": str(usr.parent)}, own=mine) == ""  # nothing was passed over
    venv = fake_env(project, ".venv")
    assert submitting_python(project, activated, own=mine) == (str(venv), "project .venv")
    assert own_environment_note(project, activated, own=mine) == ""


def test_the_clean_base_is_outside_this_process_venv() -> None:
    assert base_python() and not owns(base_python())
