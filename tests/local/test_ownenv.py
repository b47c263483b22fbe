"""A run without an interpreter of its own runs on the interpreter taugrid's venv was made from, never in the venv:
it cannot import taugrid's packages (msgspec, nats, aiohttp) without asking for them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from taugrid.local.ownenv import base_python, own_prefix, owns
from taugrid.local.runtime import PodRuntimes, Ready, RuntimeRequest


def test_owns_judges_an_interpreter_by_its_directory_not_its_link(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(sys.executable)  # as a virtualenv's python: a link to its base
    assert owns(str(venv / "bin" / "python3"), str(venv)) and owns(str(venv), str(venv))
    assert not owns(sys.executable, str(venv)) and not owns("", str(venv)) and not owns(str(venv), "")


def test_a_run_with_no_interpreter_runs_on_the_clean_base(tmp_path: Path) -> None:
    runtimes = PodRuntimes(tmp_path, machine_pin="")
    assert runtimes.fallback == base_python()
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest())
    deadline = time.monotonic() + 60
    while not isinstance(got := runtimes.poll("p"), Ready):
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    assert (got.python, got.environment["source"]) == (base_python(), "local cluster")
    if own_prefix():  # under taugrid's venv, as the local cluster runs: its packages stay out of the run
        probe = "import importlib.util as u; print([m for m in ('msgspec', 'nats', 'aiohttp') if u.find_spec(m)])"
        out = subprocess.run([got.python, "-c", probe], capture_output=True, text=True, check=True).stdout
        assert out == "[]\n"
