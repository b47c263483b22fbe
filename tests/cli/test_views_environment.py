"""`tau status` says what a run's process ran with, and any warning about it."""

from __future__ import annotations

from taugrid.cli.views import environment_line, phase_tree
from taugrid.core.states import RunRecord


def test_the_interpreter_its_version_and_the_environment_are_one_line() -> None:
    built = {"python": "/d/envs/ab/bin/python", "python_version": "3.11.2", "env": "ab", "env_cached": "false",
             "source": "VIRTUAL_ENV"}
    assert environment_line(built) == "/d/envs/ab/bin/python (3.11.2, environment ab built, from VIRTUAL_ENV)"
    assert environment_line({**built, "env_cached": "true"}).endswith("environment ab reused, from VIRTUAL_ENV)")
    assert environment_line({"container": "python:3.12", "engine": "podman"}) == (
        "the image's, in container python:3.12 (podman)")


def test_status_shows_the_python_line_and_an_ignored_image_warning() -> None:
    warning = "runtime.image 'x:1' is ignored locally: no container engine; the run uses /usr/bin/python3"
    record = RunRecord(run_id="r", workspace="w", state="running", environment={
        "python": "/usr/bin/python3", "python_version": "3.11.2", "source": "PATH", "warning": warning})
    lines = phase_tree(record).splitlines()
    assert "  python: /usr/bin/python3 (3.11.2, from PATH)" in lines
    assert f"  warning: {warning}" in lines
    assert not any("environment" in line for line in lines)  # no build, no environment phase
