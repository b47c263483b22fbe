"""A run without an interpreter of its own runs on the interpreter taugrid's venv was made from, never in the venv:
it cannot import taugrid's packages (msgspec, nats, aiohttp) without asking for them. With taugrid's venv active
the submission records a clean base (``ownenv.CLEAN_BASE``), and the run gets a virtualenv of its own on it:
not even the packages installed into that interpreter itself (pydantic in a pyenv build) are importable unasked."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from taugrid.local.ownenv import CLEAN_BASE, base_python, own_prefix, owns
from taugrid.local.runtime import PodRuntimes, Ready, RuntimeRequest
from tests.local.wheels import make_wheel


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


def _ready(runtimes: PodRuntimes, pod: str) -> Ready:
    deadline = time.monotonic() + 120
    while not isinstance(got := runtimes.poll(pod), Ready):
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    return got


TAUGRIDS = ("pydantic", "msgspec", "nats", "aiohttp")  # all in taugrid's venv, pydantic in many a base Python too
PROBE = f"import importlib.util as u, sys; print([m for m in {TAUGRIDS!r} + ('tauprobe',) if u.find_spec(m)])"


def test_a_clean_base_gets_a_virtualenv_of_its_own_without_the_bases_packages(tmp_path: Path) -> None:
    """Issue 23 item 3: the base here is this test's own interpreter, which has pydantic & co. installed: the run
    does not see them, with no requirements (an empty virtualenv) or with some (only what they name)."""
    runtimes = PodRuntimes(tmp_path / "data", machine_pin="", fallback=sys.executable)
    clean = RuntimeRequest(python=sys.executable, python_source=CLEAN_BASE)
    assert subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True).stdout == f"{list(TAUGRIDS)!r}\n"  # the base has them all
    bare = tmp_path / "bare"
    bare.mkdir()
    runtimes.begin("bare", work=bare, request=clean)
    got = _ready(runtimes, "bare")
    env = got.environment["env"]
    assert got.python == str(tmp_path / "data" / "envs" / env / "bin" / "python")
    assert (got.environment["source"], got.environment["env_cached"]) == (CLEAN_BASE, "false")
    assert subprocess.run([got.python, "-c", PROBE], capture_output=True, text=True, check=True).stdout == "[]\n"
    runtimes.begin("again", work=bare, request=clean)
    assert _ready(runtimes, "again").environment["env"] == env  # built once, reused
    # a base recorded on another machine: the fallback is made clean the same way, with nothing to warn about
    runtimes.begin("elsewhere", work=bare, request=RuntimeRequest(python="/nowhere/python3", python_source=CLEAN_BASE))
    got = _ready(runtimes, "elsewhere")
    assert (got.environment["env"], got.environment["source"], got.warning) == (env, CLEAN_BASE, "")

    asks = tmp_path / "asks"
    make_wheel(asks / "wheels")
    (asks / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl\n")
    runtimes.begin("asks", work=asks, request=clean)
    got = _ready(runtimes, "asks")
    assert got.environment["env"] != env
    assert subprocess.run([got.python, "-c", PROBE], capture_output=True, text=True,
                          check=True).stdout == "['tauprobe']\n"


def test_an_interpreter_the_researcher_chose_is_run_as_it_is(tmp_path: Path) -> None:
    """The same interpreter recorded as the researcher's own (python3 on PATH) is run directly, its packages
    and all: only an interpreter nobody chose is made clean."""
    runtimes = PodRuntimes(tmp_path / "data", machine_pin="")
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest(python=sys.executable, python_source="PATH"))
    got = _ready(runtimes, "p")
    assert (got.python, got.environment["source"], "env" in got.environment) == (sys.executable, "PATH", False)
