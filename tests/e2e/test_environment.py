"""The researcher's environment, end to end through the CLI: a project whose requirements the taugrid venv lacks
runs in a per-run environment built with uv, the next run reuses it, and a bad requirement fails with the
installer's words."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import Stack, write_project
from tests.local.wheels import make_wheel

SCRIPT = "import tauprobe\nprint('tauprobe says', tauprobe.VALUE)\n"
CONFIG = "name: needs-deps\nentrypoint: main.py\ncompute: {gpus: 0}\n"


def test_requirements_build_an_environment_once_and_the_next_run_reuses_it(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "needs-deps", SCRIPT, CONFIG)
    make_wheel(cfg.parent / "wheels", value="7")
    (cfg.parent / "requirements.txt").write_text("./wheels/tauprobe-1.0-py3-none-any.whl\n")

    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0].strip()
    assert "exec.preparing" in proc.stdout  # the build's progress is part of the run's story
    status = stack.json("status", first)
    assert status["state"] == "succeeded"
    phases = {p["name"]: p for p in status["phases"]}
    assert phases["environment"]["status"] == "done"
    env = status["environment"]
    assert env["env_cached"] == "false" and len(env["env"]) == 20
    own = "tau-ws-default" if stack.state()["run_as"]["mode"] == "workspace" else ""  # the run user's envs/
    assert env["python"] == str(stack.data_dir / "envs" / own / env["env"] / "bin" / "python")
    assert env["python_version"].count(".") == 2 and env["source"]
    assert "tauprobe says 7" in stack.tau("logs", first, check=True).stdout
    human = stack.tau("status", first, check=True).stdout
    assert f"python: {env['python']} ({env['python_version']}, environment {env['env']} built" in human

    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = proc.stdout.splitlines()[0].strip()
    again = stack.json("status", second)["environment"]
    assert again["env"] == env["env"] and again["env_cached"] == "true" and again["python"] == env["python"]
    types = [e["short_type"] for e in stack.wait_sealed(second)]
    assert "exec.preparing" not in types  # nothing was rebuilt
    assert "tauprobe says 7" in stack.tau("logs", second, check=True).stdout
    bundle = stack.json("evidence", second)
    assert bundle["attempts"][0]["running"]["environment"]["env"] == env["env"]


def test_a_bad_requirement_fails_the_run_with_the_installers_reason(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "bad-deps", SCRIPT, CONFIG.replace("needs-deps", "bad-deps"))
    (cfg.parent / "requirements.txt").write_text("./wheels/nosuchpkg-1.0-py3-none-any.whl\n")
    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    status = stack.json("status", run_id)
    assert status["state"] == "failed" and status["attempt"] == 1
    assert status["reason"].startswith("EnvironmentFailed")
    human = stack.tau("status", run_id, check=True).stdout
    assert "uv pip install failed" in human and "nosuchpkg-1.0-py3-none-any.whl" in human
    assert "hint: fix the requirement named above" in human
    phases: dict[str, str] = {}
    for _ in range(50):  # the record is projected apart from the stream `--follow` read (the run-record service)
        phases = {p["name"]: p["status"] for p in stack.json("status", run_id)["phases"]}
        if "environment" in phases:
            break
        time.sleep(0.2)
    assert phases.get("environment") == "failed", phases


def test_runtime_pip_builds_the_environment_of_a_ray_run(stack: Stack, tmp_path: Path) -> None:
    """runtime.pip makes a Ray run; locally its entrypoint runs on the host with the packages installed."""
    project = tmp_path / "pipper"
    make_wheel(project / "wheels", value="9")
    cfg = write_project(tmp_path, "pipper", SCRIPT,
                        'name: pipper\nentrypoint: main.py\n'
                        'runtime: {pip: ["./wheels/tauprobe-1.0-py3-none-any.whl"]}\n')
    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    status = stack.json("status", run_id)
    assert status["object_kind"] == "RayJob" and status["environment"]["env_cached"] == "false"
    assert "tauprobe says 9" in stack.tau("logs", run_id, check=True).stdout
    assert "environment" in [p["name"] for p in status["phases"]]


def test_an_image_without_a_container_engine_is_ignored_with_one_clear_warning(stack: Stack, tmp_path: Path
                                                                               ) -> None:
    cfg = write_project(tmp_path, "imaged", "print('ran on the host')\n",
                        "name: imaged\nentrypoint: main.py\ncompute: {gpus: 0}\nruntime: {image: python:3.12-slim}\n")
    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    warning = "runtime.image 'python:3.12-slim' is ignored locally: container engines are switched off"
    assert warning in proc.stdout
    said = [e["data"]["message"] for e in stack.wait_sealed(run_id) if e["short_type"] == "exec.preparing"]
    assert len(said) == 1 and said[0].startswith(warning)  # once
    status = stack.json("status", run_id)
    assert status["environment"]["warning"].startswith(warning)
    assert f"  warning: {warning}" in stack.tau("status", run_id, check=True).stdout
    assert "ran on the host" in stack.tau("logs", run_id, check=True).stdout
