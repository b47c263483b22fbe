"""The embedded stack for end-to-end tests: `tau up` in a temp data dir (its own nats-server on a free port),
driven through the real `tau` CLI as a user would.

The data dir is a 0711 folder under /tmp, outside pytest's own temp tree (0700 to every other user), so that a
stack started as root (as CI runs) runs each workspace's runs as that workspace's own OS user, as a root install
does by default (/var/lib/taugrid), rather than falling back to the stack's own. Runs then pin (TAU_PYTHON) the
first interpreter those users may run, since the one `tau run` would record here may sit under root's 0700 home
(each run would then say it fell back; tests/e2e/test_run_users.py submits one that way). The operator's folder
(the break-glass key, the pinned anchor key) is a temp folder too, never ~/.config/taugrid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.local import runas
from taugrid.local.ownenv import clean_pythons

TAU = [sys.executable, "-m", "taugrid.cli.main"]

TEST_PLATFORM = """
resource_flavors: [{name: default}]
cohorts: [{name: local}]
cluster_queues:
  - name: local
    cohort: local
    queueing_strategy: BestEffortFIFO
    preemption: {within_cluster_queue: LowerPriority}
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal_quota: "64"}
              - {name: memory, nominal_quota: 64Gi}
              - {name: nvidia.com/gpu, nominal_quota: "2"}
local_queues: [{name: default, namespace: default, cluster_queue: local}]
priority_classes:
  - {name: low, value: 50}
  - {name: normal, value: 100}
  - {name: high, value: 200}
compute_profiles:
  - {name: cpu-small, cpu: "100m", memory: 256Mi}
  - {name: gpu-half, gpu: 0, gpu_fraction: 0.5, cpu: "100m", memory: 256Mi}
workspaces:
  - name: default
    namespace: default
    local_queue: default
    default_priority: normal
    default_profile: cpu-small
    max_gpus_per_run: 2
    output_root: {outputs}
"""


class Stack:
    def __init__(self, data_dir: Path, operator_dir: Path) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, "TAU_DATA_DIR": str(data_dir), "TAU_OPERATOR_DIR": str(operator_dir),
                    "TAU_DECLARED_GPUS": "2x16000",
                    "TAU_NODE_NAME": "e2e-node",
                    "TAU_CONTAINER_ENGINES": "",  # runtime.image runs on the host, the same with or without docker
                    "TAU_ANCHOR_INTERVAL_S": "3"}  # anchors (tests/e2e/test_hardening.py) without a minute's wait
        self.env.pop("TAU_NATS_URL", None)
        if os.geteuid() == 0 and (python := runas.runnable(clean_pythons(), runas.OTHERS)[0]):
            self.env["TAU_PYTHON"] = python

    def tau(self, *args: str, check: bool = False, timeout: float = 120, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*TAU, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd)
        if check and proc.returncode != 0:
            raise AssertionError(f"tau {' '.join(args)} → {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.tau(*args, "--output", "json", check=True).stdout)

    def events(self, run_id: str) -> list[dict[str, Any]]:
        out = self.tau("events", "--run", run_id, "--output", "json", check=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def state(self) -> dict[str, Any]:
        return json.loads((self.data_dir / "stack.json").read_text())  # type: ignore[no-any-return]

    def wait_state(self, run_id: str, states: set[str], timeout: float = 60) -> dict[str, Any]:
        deadline = time.time() + timeout
        last: dict[str, Any] = {}
        while time.time() < deadline:
            proc = self.tau("status", run_id, "--output", "json")
            if proc.returncode == 0:
                last = json.loads(proc.stdout)
                if last["state"] in states:
                    return last
            time.sleep(0.3)
        raise AssertionError(f"{run_id} never reached {states}; last: {last.get('state')} {last.get('reason')}")

    def wait_sealed(self, run_id: str, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            evs = self.events(run_id)
            if any(e["short_type"] == "evidence.sealed" for e in evs):
                return evs
            time.sleep(0.3)
        raise AssertionError(f"{run_id}: evidence never sealed")


def write_project(root: Path, name: str, script: str, config: str) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.py").write_text(script)
    (d / "tau.yaml").write_text(config)
    return d / "tau.yaml"


def reachable_dir(prefix: str) -> Path:
    """A new folder other OS users may pass through (0711), as a stack's data dir must be for per-workspace run
    users; the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(d, 0o711)
    return d


@pytest.fixture
def exchange() -> Iterator[Path]:
    """A folder a test and its runs share (a file a run waits for, one it writes back): every OS user may write
    it, which pytest's own (0700) are not to a workspace's run user."""
    d = reachable_dir("tau-e2e-exchange-")
    os.chmod(d, 0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = reachable_dir("tau-e2e-")
    try:
        s = Stack(d, tmp_path_factory.mktemp("operator"))
        s.tau("up", "--scale", "renderer=2", check=True, timeout=90)
        platform = d / "platform.yaml"
        platform.write_text(TEST_PLATFORM.replace("{outputs}", str(d / "outputs")))
        s.tau("platform", "apply", str(platform), check=True)
        yield s
        s.tau("down", timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)
