"""Issue 25 item 3, a Ray worker group between min and max on the local pool, with real Ray: an elastic Ray run
(``engine: ray``, ``policy.mode: elastic``, 2..3 workers of one GPU each) starts at 3 workers, is shrunk to 2 when a
higher-priority run takes a GPU of its quota (the highest-index worker pod stopped, the head and its entrypoint kept),
and grows back to 3 when that run ends; the Ray program sees the cluster's worker count change (it polls
``ray.nodes()``, records each count it sees and runs a task on the workers at each) and ends succeeded, with both
resizes in ``tau events`` and the evidence.

A slow test (``-m slow``): ``make test-slow`` builds ``.venv-ray`` (plain ``ray`` from PyPI, no dashboard) and runs
it with that interpreter (``TAU_PYTHON``). The local cluster runs the elastic RayJob as a Ray cluster of a head pod
(``ray start --head``, then the entrypoint) and worker pods that join it (``local/raycluster.py``). Ray is kept small
(object store of 100 MB per node, a CPU per worker, no dashboard): the machine has 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.local import runas
from tests.e2e.conftest import TAU, TEST_PLATFORM, Stack, reachable_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
RAY_PYTHON = os.environ.get("TAU_TEST_RAY_PYTHON") or str(REPO / ".venv-ray" / "bin" / "python")

# The workers are the nodes with CPUs (the head has none: it runs the driver, no tasks). Each count seen is said
# once, with the node a task ran on then (a task needs a CPU: it can only run on a worker).
PROGRAM = """\
import json, os, sys, time
import ray

exchange = sys.argv[1]


def say(**what):
    with open(os.path.join(exchange, "progress.jsonl"), "a") as f:
        f.write(json.dumps(what) + "\\n")


@ray.remote(num_cpus=1)
def where():
    return ray.get_runtime_context().get_node_id()


ray.init()
workers = {n["NodeID"] for n in ray.nodes() if n["Resources"].get("CPU")}
say(event="connected", head=ray.get_runtime_context().get_node_id() not in workers)
last = None
deadline = time.time() + 900
while time.time() < deadline:
    alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    if len(alive) != last:
        last = len(alive)
        say(event="workers", count=last, task_on=ray.get(where.remote(), timeout=120) in alive)
    if os.path.exists(os.path.join(exchange, "done")):
        break
    time.sleep(0.5)
say(event="done", count=last)
"""

HOLD = """\
import os, sys, time
deadline = time.time() + 600
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
"""

POOL = "local:\n  nodes:\n    - {name: e2e-ray, gpus: 3, gpu_memory: 16000Mi}\n"

ELASTIC = """\
name: elastic
engine: ray
entrypoint: main.py
args: ['{exchange}']
compute: {{workers: 3, gpus_per_worker: 1, worker_cpu_request: '1', worker_memory_request: 2Gi,
           head_cpu_request: '1', head_memory_request: 3Gi}}
policy:
  priority: low
  mode: elastic
  elastic: {{min: 2, max: 3, step: 1, cooldown: 0}}
"""


def _platform(outputs: Path) -> str:
    text = TEST_PLATFORM.replace('nvidia.com/gpu, nominal_quota: "2"', 'nvidia.com/gpu, nominal_quota: "3"')
    text = text.replace("max_gpus_per_run: 2", "max_gpus_per_run: 3")
    return text.replace("{outputs}", str(outputs)) + POOL


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own with the 3-GPU pool (as ``test_elastic_torch``'s, run as the stack's user where the
    workspace's OS user cannot run ``.venv-ray``'s interpreter)."""
    assert Path(RAY_PYTHON).exists(), f"{RAY_PYTHON} is missing: `make test-slow` builds it (pip install ray)"
    d = reachable_dir("tau-e2e-elastic-ray-")
    try:
        stack = Stack(d, tmp_path_factory.mktemp("operator"))
        if os.geteuid() == 0 and not runas.runnable([RAY_PYTHON], runas.OTHERS)[0]:
            stack.env["TAU_RUN_AS"] = "stack"
        stack.tau("up", check=True, timeout=90)
        path = d / "platform.yaml"
        path.write_text(_platform(d / "outputs"))
        stack.tau("platform", "apply", str(path), check=True)
        yield stack
        stack.tau("down", timeout=60)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def submit(stack: Stack, root: Path, name: str, config: str, script: str) -> str:
    d = root / name
    d.mkdir()
    (d / "main.py").write_text(script)
    (d / "tau.yaml").write_text(config)
    proc = subprocess.run([*TAU, "run", str(d / "tau.yaml")], env={**stack.env, "TAU_PYTHON": RAY_PYTHON},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"tau run {name} → {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


def progress(exchange: Path) -> list[dict[str, Any]]:
    path = exchange / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def counts(exchange: Path) -> list[int]:
    """The worker counts the program saw, in order, from the first time it saw all 3 (they join one by one)."""
    seen = [p["count"] for p in progress(exchange) if p["event"] == "workers" and p["task_on"]]
    return seen[seen.index(3):] if 3 in seen else []


def wait_counts(stack: Stack, run_id: str, exchange: Path, want: list[int], timeout: float = 240) -> None:
    """Until the counts the program saw are ``want``; a run that ended first fails at once, with its state and
    its log."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if counts(exchange) == want:
            return
        state = stack.json("status", run_id)
        if state["state"] in ("failed", "succeeded", "cancelled"):
            logs = stack.tau("logs", run_id, timeout=60).stdout[-4000:]
            raise AssertionError(f"{run_id} ended {state['state']} before {want}: {state.get('reason')}\n{logs}")
        time.sleep(1)
    logs = stack.tau("logs", run_id, timeout=60).stdout[-4000:]
    raise AssertionError(f"the program never saw {want}: {progress(exchange)}\n{logs}")


def test_an_elastic_ray_runs_workers_shrink_for_a_preemptor_and_grow_back(
        pool: Stack, tmp_path: Path, exchange: Path) -> None:
    ray_dirs = set(Path("/tmp").glob("tau-ray-*"))  # Ray's session files, which the cluster removes at the end
    elastic = submit(pool, tmp_path, "elastic", ELASTIC.format(exchange=exchange), PROGRAM)
    try:
        check(pool, tmp_path, exchange, elastic)
    finally:  # whatever failed: the programs end, so no Ray node outlives the test (pods outlive `tau down`)
        for gate in ("release", "done"):
            (exchange / gate).touch()
        pool.wait_state(elastic, {"succeeded", "failed", "cancelled"}, timeout=120)
    deadline = time.time() + 30
    while set(Path("/tmp").glob("tau-ray-*")) - ray_dirs and time.time() < deadline:
        time.sleep(0.5)
    assert set(Path("/tmp").glob("tau-ray-*")) - ray_dirs == set()  # the head's and every worker's temp dir


def check(pool: Stack, tmp_path: Path, exchange: Path, elastic: str) -> None:
    wait_counts(pool, elastic, exchange, [3], timeout=420)
    hi = submit(pool, tmp_path, "hi", f"name: hi\nentrypoint: main.py\nargs: ['{exchange / 'release'}']\n"
                                      "compute: {gpus: 1}\npolicy: {priority: high}\n", HOLD)
    pool.wait_state(hi, {"running"}, timeout=180)
    wait_counts(pool, elastic, exchange, [3, 2])
    (exchange / "release").touch()  # the higher-priority run ends: its GPU comes back
    assert pool.wait_state(hi, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    wait_counts(pool, elastic, exchange, [3, 2, 3], timeout=300)
    (exchange / "done").touch()
    status = pool.wait_state(elastic, {"succeeded", "failed"}, timeout=180)
    assert status["state"] == "succeeded", status
    # worker 2 given up at the shrink, a new worker 2 at the growth: the head and the three workers that ran to the end
    assert sorted(p["name"].split("-a1-")[1].split("-")[0] for p in status["pods"]) == ["0", "1", "2", "head"], (
        status["pods"])

    said = progress(exchange)
    assert said[0] == {"event": "connected", "head": True}  # the driver runs on the head, which takes no tasks
    joined = [p["count"] for p in said if p["event"] == "workers"]
    # the workers join one by one at the start (0, 1, 2, 3 or fewer steps); then exactly 3 → 2 → 3, each count
    # with a task run on one of the workers then
    assert joined[-3:] == [3, 2, 3] and joined[:-2] == sorted(joined[:-2]), said
    assert all(p["task_on"] for p in said if p["event"] == "workers" and p["count"]), said
    assert said[-1] == {"event": "done", "count": 3}

    resized = [e["data"] for e in pool.events(elastic) if e["short_type"] == "exec.resized"]
    assert [(r["old_count"], r["new_count"], r["cause"], r["preemptor"], r["pod_set"]) for r in resized] == [
        (3, 2, "ShrunkForPreemptor", hi, "workers"), (2, 3, "Grown", "", "workers")]
    assert "size: 3 pods (last resize: 2 -> 3 pods, quota freed (Grown)" in pool.tau("status", elastic,
                                                                                      check=True).stdout
    pool.wait_sealed(elastic)
    [attempt] = pool.json("evidence", elastic)["attempts"]
    assert [(r["old_count"], r["new_count"], r["cause"]) for r in attempt["resizes"]] == [
        (3, 2, "ShrunkForPreemptor"), (2, 3, "Grown")]
    assert [e["short_type"] for e in pool.events(elastic)].count("admission.preempted") == 0  # shrunk, not evicted
