"""Preparing a pod's runtime off the control loop: which interpreter, environment builds in threads, images."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from taugrid.local.runtime import (
    ENGINES,
    Failed,
    PodRuntimes,
    Preparing,
    Ready,
    RuntimeRequest,
    choose_python,
)
from taugrid.settings import Settings
from tests.local.wheels import make_wheel

FALLBACK = sys.executable


def wait(runtimes: PodRuntimes, pod: str, timeout: float = 120) -> Ready | Failed:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = runtimes.poll(pod)
        if isinstance(got, Ready | Failed):
            return got
        assert isinstance(got, Preparing)
        time.sleep(0.05)
    raise AssertionError(f"{pod} still preparing: {runtimes.poll(pod)}")


def test_explicit_pins_beat_the_recorded_interpreter_and_a_missing_one_falls_back_with_a_warning() -> None:
    recorded = RuntimeRequest(python=sys.executable, python_source="VIRTUAL_ENV")
    pinned = RuntimeRequest(python="/opt/pinned/python", python_source="TAU_PYTHON")
    assert choose_python(pinned, machine_pin="/m/python", fallback=FALLBACK) == ("/opt/pinned/python", "TAU_PYTHON", "")
    assert choose_python(recorded, machine_pin="/m/python", fallback=FALLBACK) == ("/m/python", "TAU_LOCAL_PYTHON", "")
    assert choose_python(recorded, machine_pin="", fallback="/fb") == (sys.executable, "VIRTUAL_ENV", "")
    gone = RuntimeRequest(python="/nonexistent/bin/python", python_source="PATH")
    warning = "the submitting interpreter /nonexistent/bin/python is not on this machine; the run uses /fb"
    assert choose_python(gone, machine_pin="", fallback="/fb") == ("/fb", "local cluster", warning)
    assert choose_python(RuntimeRequest(), machine_pin="", fallback="/fb") == ("/fb", "local cluster", "")


def test_no_requirements_is_ready_with_the_interpreter_and_its_version(tmp_path: Path) -> None:
    runtimes = PodRuntimes(tmp_path, machine_pin="", fallback=FALLBACK)
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest(python=sys.executable, python_source="PATH"))
    got = wait(runtimes, "p")
    version = ".".join(str(n) for n in sys.version_info[:3])
    assert got == Ready(python=sys.executable, environment={"python": sys.executable, "python_version": version,
                                                            "source": "PATH"})


def test_requirements_build_once_and_the_next_pod_reuses_the_environment(tmp_path: Path) -> None:
    work = tmp_path / "work"
    make_wheel(work / "wheels")
    (work / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl\n")
    runtimes = PodRuntimes(tmp_path / "data", machine_pin="", fallback=FALLBACK)
    runtimes.begin("a", work=work, request=RuntimeRequest())
    first = wait(runtimes, "a")
    assert isinstance(first, Ready) and first.environment["env_cached"] == "false"
    assert first.python == str(tmp_path / "data" / "envs" / first.environment["env"] / "bin" / "python")
    runtimes.begin("b", work=work, request=RuntimeRequest())
    second = wait(runtimes, "b")
    assert isinstance(second, Ready) and second.environment["env_cached"] == "true"
    assert second.python == first.python
    runtimes.forget("a")
    assert runtimes.poll("a") is None


def test_a_bad_requirement_fails_the_pod_with_the_installers_words(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("./nowhere/missing-1.0-py3-none-any.whl\n")
    runtimes = PodRuntimes(tmp_path / "data", machine_pin="", fallback=FALLBACK)
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest())
    got = wait(runtimes, "p")
    assert isinstance(got, Failed) and got.reason == "EnvironmentFailed"
    assert got.message.startswith("uv pip install failed (exit code 1)") and "missing-1.0" in got.message


def test_an_image_without_a_container_engine_is_ignored_with_a_clear_warning(tmp_path: Path) -> None:
    runtimes = PodRuntimes(tmp_path, machine_pin="", fallback=FALLBACK, engines=("tau-no-such-engine",))
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest(image="pytorch/pytorch:2.4"))
    got = wait(runtimes, "p")
    expected = (f"runtime.image 'pytorch/pytorch:2.4' is ignored locally: no container engine answered "
                f"(`tau-no-such-engine info` failed); the run uses {FALLBACK}")
    assert isinstance(got, Ready) and got.warning == expected and got.engine == ""
    assert got.environment["warning"] == expected and got.python == FALLBACK


def test_an_image_goes_to_the_first_engine_whose_info_answers(tmp_path: Path) -> None:
    # the probe only (a stand-in whose `info` succeeds); real pods through podman: tests/local/test_containers.py
    engine = tmp_path / "engine"
    engine.write_text('#!/bin/sh\n[ "$1" = info ] && exit 0\nexit 1\n')
    engine.chmod(0o755)
    runtimes = PodRuntimes(tmp_path, machine_pin="", fallback=FALLBACK, engines=("tau-no-such-engine", str(engine)))
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest(image="python:3.12-slim"))
    assert wait(runtimes, "p") == Ready(python="python", engine=str(engine), image="python:3.12-slim",
                                        environment={"container": "python:3.12-slim", "engine": str(engine)})


def test_container_engines_are_docker_then_podman_unless_the_machine_says_otherwise(tmp_path: Path) -> None:
    def engines(env: dict[str, str]) -> tuple[str, ...]:
        return Settings.from_env(env).local.container_engines

    assert engines({}) == ENGINES == ("docker", "podman")
    assert engines({"TAU_CONTAINER_ENGINES": " podman , "}) == ("podman",)
    assert engines({"TAU_CONTAINER_ENGINES": ""}) == ()
    runtimes = PodRuntimes(tmp_path, machine_pin="", fallback=FALLBACK, engines=())
    runtimes.begin("p", work=tmp_path, request=RuntimeRequest(image="x:1"))
    got = wait(runtimes, "p")
    assert isinstance(got, Ready) and got.warning == (
        f"runtime.image 'x:1' is ignored locally: container engines are switched off (TAU_CONTAINER_ENGINES is "
        f"empty); the run uses {FALLBACK}")


def test_a_snapshot_prepared_once_is_ready_at_begin_for_its_next_pods(tmp_path: Path) -> None:
    """Once per source digest and machine: the second pod of a snapshot needs no thread, probe or file read."""
    work = tmp_path / "work"
    make_wheel(work / "wheels")
    (work / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl\n")
    runtimes = PodRuntimes(tmp_path / "data", machine_pin="", fallback=FALLBACK)
    source = "sources/" + "ab" * 32 + ".tar.gz"
    runtimes.begin("a", work=work, request=RuntimeRequest(), source=source)
    first = wait(runtimes, "a")
    assert isinstance(first, Ready) and first.environment["env_cached"] == "false"
    (work / "requirements.txt").unlink()  # not read again: the snapshot (its digest) decides what it asks for
    runtimes.begin("b", work=work, request=RuntimeRequest(), source=source)
    assert runtimes.poll("b") == Ready(python=first.python, environment={**first.environment, "env_cached": "true"})
    # another request, or no snapshot, is prepared afresh (from what the folder now holds: no requirements)
    runtimes.begin("c", work=work, request=RuntimeRequest(pip=("six",)), source="")
    assert isinstance(runtimes.poll("c"), Preparing)  # not ready at once (its thread may have said what it does)
    runtimes.begin("d", work=work, request=RuntimeRequest())
    plain = wait(runtimes, "d")
    assert isinstance(plain, Ready) and plain.python == FALLBACK


def test_a_remembered_interpreter_that_is_gone_is_prepared_again_in_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    class Counted(threading.Thread):  # which pods went through a preparing thread (its outcome may come at once)
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr("taugrid.local.runtime.threading.Thread", Counted)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    runtimes = PodRuntimes(tmp_path / "data", machine_pin=str(python), fallback=FALLBACK)
    runtimes.begin("a", work=tmp_path, request=RuntimeRequest(), source="sources/x.tar.gz")
    assert isinstance(first := wait(runtimes, "a"), Ready) and first.python == str(python)
    python.unlink()
    runtimes.begin("b", work=tmp_path, request=RuntimeRequest(), source="sources/x.tar.gz")
    assert started == ["runtime-a", "runtime-b"]  # through the thread again, not the remembered outcome
    assert wait(runtimes, "b") == first  # (the builder's own per-process version cache answers the same)
