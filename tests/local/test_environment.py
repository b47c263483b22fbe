"""The per-run environment builder on its own: requirements found, built with uv, cached, atomic, failures told."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from taugrid.local import environment
from taugrid.local.environment import (
    EnvironmentBuilder,
    EnvironmentFailed,
    Prepared,
    Requirements,
    requirements,
)
from tests.local.wheels import make_wheel

BASE = sys.executable


def project_with_wheel(tmp_path: Path, *, value: str = "42") -> Path:
    project = tmp_path / "project"
    make_wheel(project / "wheels", value=value)
    (project / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl\n")
    return project


def probe(python: str) -> str:
    return subprocess.run([python, "-c", "import tauprobe; print(tauprobe.VALUE)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_requirements_read_runtime_pip_requirements_txt_and_pyproject(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("six==1.17.0\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["attrs>=23"]\n')
    reqs = requirements(tmp_path, ["tomli"])
    assert reqs == Requirements(pip=("tomli",), requirements_txt="six==1.17.0\n", pyproject=("attrs>=23",))
    assert reqs.describe() == "runtime.pip (1) + requirements.txt + pyproject.toml (1)"
    assert requirements(tmp_path / "missing").empty


def test_malformed_pyproject_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project\n")
    with pytest.raises(EnvironmentFailed, match="pyproject.toml is not valid TOML"):
        requirements(tmp_path)


def test_no_requirements_runs_the_base_interpreter_as_is(tmp_path: Path) -> None:
    builder = EnvironmentBuilder(tmp_path / "envs")
    got = builder.prepare(base=BASE, reqs=Requirements(), project=tmp_path)
    assert got.python == BASE and got.env_hash == "" and not got.cached
    assert got.version == ".".join(str(n) for n in sys.version_info[:3])
    assert got.describe() == {"python": BASE, "python_version": got.version}
    assert list((tmp_path / "envs").iterdir()) == []


def test_builds_once_then_reuses_the_cached_environment_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    project = project_with_wheel(tmp_path)
    builder = EnvironmentBuilder(tmp_path / "envs")
    said: list[str] = []
    first = builder.prepare(base=BASE, reqs=requirements(project), project=project, progress=said.append)
    assert not first.cached and first.python == str(tmp_path / "envs" / first.env_hash / "bin" / "python")
    assert probe(first.python) == "42"
    assert said[0].startswith("creating a virtualenv on Python") and said[-1] == "environment ready"
    assert any("tauprobe==1.0" in line for line in said), said  # uv's own lines are the progress
    # Offline and with the wheel gone: only a cache hit can succeed, and no installer runs.
    monkeypatch.setenv("UV_OFFLINE", "1")
    (project / "wheels" / "tauprobe-1.0-py3-none-any.whl").unlink()
    again: list[str] = []
    second = EnvironmentBuilder(tmp_path / "envs").prepare(base=BASE, reqs=requirements(project),
                                                          project=project, progress=again.append)
    assert second.cached and second.python == first.python and again == []
    assert sorted(p.name for p in (tmp_path / "envs").iterdir() if not p.name.startswith(".")) == [first.env_hash]


def test_different_requirements_get_a_different_environment(tmp_path: Path) -> None:
    project = project_with_wheel(tmp_path)
    builder = EnvironmentBuilder(tmp_path / "envs")
    one = builder.prepare(base=BASE, reqs=requirements(project), project=project)
    (project / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl  # changed\n")
    two = builder.prepare(base=BASE, reqs=requirements(project), project=project)
    assert one.env_hash != two.env_hash and not two.cached


def test_concurrent_builds_of_one_hash_build_once_and_agree(tmp_path: Path) -> None:
    project = project_with_wheel(tmp_path)
    reqs = requirements(project)
    results: list[Prepared] = []

    def build() -> None:
        results.append(EnvironmentBuilder(tmp_path / "envs").prepare(base=BASE, reqs=reqs, project=project))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3, "a builder thread raised"
    pythons = {r.python for r in results}
    assert len(pythons) == 1, results
    assert sorted(r.cached for r in results) == [False, True, True]
    envs = tmp_path / "envs"
    assert [p.name for p in envs.iterdir() if p.is_dir()] == [results[0].env_hash]
    assert probe(pythons.pop()) == "42"


def test_a_bad_requirement_fails_with_the_installers_last_lines_and_leaves_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text("./wheels/nonexistent-9.9-py3-none-any.whl\n")
    builder = EnvironmentBuilder(tmp_path / "envs")
    with pytest.raises(EnvironmentFailed) as info:
        builder.prepare(base=BASE, reqs=requirements(project), project=project)
    err = info.value
    assert str(err) == "uv pip install failed (exit code 1)"
    assert any("nonexistent-9.9-py3-none-any.whl" in line for line in err.tail), err.tail
    assert err.message.startswith("uv pip install failed (exit code 1)\n  ")
    assert err.message.splitlines()[-1].startswith("hint: fix the requirement named above")
    assert [p for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_an_interpreter_that_does_not_exist_is_named(tmp_path: Path) -> None:
    builder = EnvironmentBuilder(tmp_path / "envs")
    with pytest.raises(EnvironmentFailed, match="interpreter /nonexistent/python does not run"):
        builder.prepare(base="/nonexistent/python", reqs=Requirements(), project=tmp_path)


def test_an_interpreter_slow_to_answer_once_is_asked_again_and_one_that_never_answers_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine made a pyenv shim take longer than the probe's limit once: that is not a broken
    interpreter. The first answer here takes 3 s (over the 0.5 s limit), the second is at once."""
    monkeypatch.setattr(environment, "VERSION_TIMEOUTS_S", (0.5, 10.0))
    slow_once = tmp_path / "python-slow-once"
    slow_once.write_text(f"#!/bin/sh\nif [ ! -e {tmp_path}/answered-late ]; then touch {tmp_path}/answered-late; "
                         f"exec sleep 3; fi\nexec {BASE} \"$@\"\n")
    slow_once.chmod(0o755)
    version = EnvironmentBuilder(tmp_path / "envs").version(str(slow_once))
    assert version == ".".join(str(n) for n in sys.version_info[:3])
    assert (tmp_path / "answered-late").exists()
    monkeypatch.setattr(environment, "VERSION_TIMEOUTS_S", (0.3, 0.6))
    never = tmp_path / "python-never"
    never.write_text("#!/bin/sh\nexec sleep 30\n")
    never.chmod(0o755)
    with pytest.raises(EnvironmentFailed, match=f"interpreter {never} did not answer within 1 s"):
        EnvironmentBuilder(tmp_path / "envs").version(str(never))


def test_the_environment_survives_its_rename_scripts_included(tmp_path: Path) -> None:
    """Built in a temp dir and renamed: console scripts must not point at the temp dir."""
    project = tmp_path / "project"
    project.mkdir()
    builder = EnvironmentBuilder(tmp_path / "envs")
    wheel = make_wheel(project / "wheels")
    (project / "requirements.txt").write_text(f"{wheel}\n")
    got = builder.prepare(base=BASE, reqs=requirements(project), project=project)
    env = Path(got.python).parent.parent
    assert (env / "tau-env.json").is_file()
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "envs").iterdir())
    activate = (env / "bin" / "activate").read_text()
    assert ".tmp-" not in activate
    assert os.path.realpath(got.python) == os.path.realpath(
        subprocess.run([got.python, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                       check=True).stdout.strip())


def test_requirements_layer_over_the_interpreters_own_virtualenv(tmp_path: Path) -> None:
    """A researcher's venv keeps its packages; the requirements come on top of them."""
    builder = EnvironmentBuilder(tmp_path / "envs")
    theirs = tmp_path / "theirs"
    subprocess.run([builder.uv, "venv", "-q", "--python", BASE, str(theirs)], check=True)
    make_wheel(tmp_path / "w", name="theirpkg")
    subprocess.run([builder.uv, "pip", "install", "-q", "--python", str(theirs / "bin" / "python"),
                    str(tmp_path / "w" / "theirpkg-1.0-py3-none-any.whl")], check=True)
    project = project_with_wheel(tmp_path)
    got = builder.prepare(base=str(theirs / "bin" / "python"), reqs=requirements(project), project=project)
    out = subprocess.run([got.python, "-c", "import theirpkg, tauprobe; print(theirpkg.VALUE, tauprobe.VALUE)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "42 42"
