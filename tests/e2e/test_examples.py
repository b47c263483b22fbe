"""The README's example tau.yaml and every example under examples/ run on a CPU-only machine as written."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taugrid.client.interpreter import submitting_python
from taugrid.local.ownenv import CLEAN_BASE
from tests.config.test_readme_example import readme_example
from tests.e2e.conftest import Stack

REPO = Path(__file__).resolve().parents[2]


def test_readme_example_validates_and_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    project = tmp_path / "readme"
    project.mkdir()
    shutil.copy(REPO / "examples" / "quickstart" / "train.py", project / "train.py")
    (project / "tau.yaml").write_text(readme_example())
    assert stack.tau("run", "validate", str(project / "tau.yaml"), check=True).returncode == 0
    proc = stack.tau("run", str(project), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    assert "done: final test accuracy" in stack.tau("logs", run_id, check=True).stdout


def test_sweep_submits_one_run_per_value_and_tabulates_them(stack: Stack) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "sweep" / "sweep.py"), "--lr", "0.05", "0.3", "--epochs", "3"],
        env=stack.env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("sweep-lr")]
    assert [(r[1], r[2]) for r in rows] == [("0.05", "succeeded"), ("0.3", "succeeded")]
    assert all(0.0 <= float(r[3]) <= 1.0 for r in rows)
    assert proc.stdout.splitlines()[-1].startswith("best: lr=")


def test_ray_example_runs_or_says_ray_is_missing(stack: Stack) -> None:
    proc = stack.tau("run", str(REPO / "examples" / "ray"), "--follow", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    logs = stack.tau("logs", run_id, check=True).stdout
    if importlib.util.find_spec("ray") is None:
        # the run uses the interpreter the client records for this project and environment (the test's own
        # environment decides which: TAU_PYTHON, VIRTUAL_ENV or the first python3 on PATH)
        python, source = submitting_python(REPO / "examples" / "ray", stack.env)
        assert "skipped: Ray is not installed in " in logs and "; pip install ray, then run this again" in logs
        environment = stack.json("status", run_id)["environment"]
        if source == CLEAN_BASE:  # taugrid's venv was active: a virtualenv of the run's own, on that interpreter
            assert (environment["source"], environment["python"].endswith("/bin/python")) == (source, True)
        else:
            assert (environment["source"], environment["python"]) == (source, python)
    else:
        assert "done: sum of squares 0..9 = 285" in logs


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed in the test's Python: pip install torch==2.13.0 (CPU wheel)")
def test_torchrun_example_trains_on_two_cpu_processes(stack: Stack) -> None:
    proc = stack.tau("run", str(REPO / "examples" / "torchrun"), "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logs = stack.tau("logs", proc.stdout.splitlines()[0].strip(), check=True).stdout
    assert "done: world 2, weights [2.0, -3.0]" in logs


def test_a_taugrid_managed_manifest_runs_its_script_beside_the_folder(stack: Stack, tmp_path: Path) -> None:
    """A managed workflow manifest (schema_version, no engine) whose entrypoint is a script beside its folder, as
    TauGrid's AKS CPU quickstart writes it: the client ships the folder holding both (inside the repository), the
    script runs from the config's folder with the manifest's env list, and the unknown key is only a warning."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "shared").mkdir()
    (repo / "shared" / "train.py").write_text(
        "import os, pathlib\nprint(os.environ['GREETING'], 'from', pathlib.Path.cwd().name)\n")
    (repo / "quickstart").mkdir()
    (repo / "quickstart" / "tau.yaml").write_text(
        "schema_version: 1\nname: managed-beside\nrun: {entrypoint: ../shared/train.py, workload_kind: job}\n"
        "resource_naming: {prefix: tau}\ncompute: {gpus: 0, cpus: 1, memory: 512Mi}\n"
        "runtime:\n  env:\n    - name: GREETING\n      value: hello\nscheduling: {node_selector: {a: b}}\n"
        "policy: {pod_priority_class: research-high}\n")
    proc = stack.tau("run", str(repo / "quickstart"), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unknown config key 'scheduling'" in proc.stderr and "did you mean 'policy'?" in proc.stderr
    # a Kubernetes-only key is said where it means nothing (the local backend)
    assert "policy.pod_priority_class has no effect on the local backend (Kubernetes only)" in proc.stdout
    logs = stack.tau("logs", proc.stdout.splitlines()[0].strip(), check=True).stdout
    assert "hello from quickstart" in logs
