"""Issue 25 item 5, with real PyTorch on the CPU (gloo): an elastic torchrun run on the local pool starts at 3
workers, is shrunk to 2 when a higher-priority run takes a GPU of its quota, goes on from its checkpoint at world
size 2, grows back to 3 when that run ends, and finishes with exactly the weights a fixed-size 3-worker run gets.

A slow test (``-m slow``): ``make test`` leaves it out, ``make test-slow`` (which ``.ci/run`` runs after ``make
test``) builds ``.venv-torch`` with PyTorch's CPU build and runs it. The runs use that interpreter (``TAU_PYTHON``),
not taugrid's. The test starts a stack of its own whose platform makes the pool one node of three GPUs with three
GPUs of quota; PyTorch's CPU build ignores the GPU indices it is given.

The script trains a linear model on a global batch of 12 samples per step, each worker taking every world-size-th
sample. Each worker all-gathers the per-sample gradients and sums them in sample order, so every world size computes
bitwise the same update: the weights can be compared exactly. Rank 0 writes ``step-N.pt`` into
``TAU_CHECKPOINT_DIR`` every 5 steps (written, then renamed), and each start says its step and world size in a
progress file. At steps 20 and 40 the workers wait (a broadcast from rank 0 every 0.2 s, so a lost peer fails them
at once) until the test opens that gate: the shrink comes while they wait at 20 and the growth while they wait at
40, so the step each resize resumes from is known, whatever the machine's load.
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
TORCH_PYTHON = os.environ.get("TAU_TEST_TORCH_PYTHON") or str(REPO / ".venv-torch" / "bin" / "python")

TRAIN = """\
import json, os, sys, time
import torch
import torch.distributed as dist

exchange, name = sys.argv[1], sys.argv[2]
GATES = {20: "shrunk", 40: "grown"}
TOTAL, BATCH, LR = 60, 12, 0.05
TRUE = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)


def say(**what):
    with open(os.path.join(exchange, f"progress-{name}.jsonl"), "a") as f:
        f.write(json.dumps(what) + "\\n")


def steps(ckdir):
    return sorted(int(n[5:-3]) for n in os.listdir(ckdir) if n.startswith("step-") and n.endswith(".pt"))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckdir = os.environ["TAU_CHECKPOINT_DIR"]
found = steps(ckdir)
step = found[-1] if found else 0
w = torch.load(os.path.join(ckdir, f"step-{step}.pt"))["w"] if found else torch.zeros(4, dtype=torch.float64)
if rank == 0:
    say(event="start", step=step, world=world)
held = -1
while step < TOTAL:
    if step in GATES:
        flag = torch.tensor([int(os.path.exists(os.path.join(exchange, GATES[step])))])
        dist.broadcast(flag, 0)
        if not flag.item():
            if rank == 0 and held != step:
                say(event="hold", step=step, world=world)
                held = step
            time.sleep(0.2)
            continue
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 4, generator=g, dtype=torch.float64)
    y = x @ TRUE + 0.01 * torch.randn(BATCH, generator=g, dtype=torch.float64)
    mine = torch.arange(rank, BATCH, world)
    per_sample = 2 * (x[mine] @ w - y[mine]).unsqueeze(1) * x[mine]  # one gradient row per sample of mine
    rows = [torch.empty_like(per_sample) for _ in range(world)]
    dist.all_gather(rows, per_sample)
    grad = torch.zeros(4, dtype=torch.float64)
    for i in range(BATCH):  # in sample order: the same sum at any world size
        grad = grad + rows[i % world][i // world]
    w = w - LR * grad / BATCH
    step += 1
    if rank == 0 and step % 5 == 0:
        tmp = os.path.join(ckdir, f".step-{step}.pt")
        torch.save({"w": w, "step": step}, tmp)
        os.replace(tmp, os.path.join(ckdir, f"step-{step}.pt"))
    time.sleep(0.05)
if rank == 0:
    say(event="done", step=step, world=world, w=w.tolist())
dist.destroy_process_group()
"""

HOLD = """\
import os, sys, time
deadline = time.time() + 600
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
"""


POOL = "local:\n  nodes:\n    - {name: e2e-el, gpus: 3, gpu_memory: 16000Mi}\n"


def _platform(outputs: Path) -> str:
    text = TEST_PLATFORM.replace('nvidia.com/gpu, nominal_quota: "2"', 'nvidia.com/gpu, nominal_quota: "3"')
    text = text.replace("max_gpus_per_run: 2", "max_gpus_per_run: 3")
    return text.replace("{outputs}", str(outputs)) + POOL


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own with the 3-GPU pool. As root, runs run as each workspace's OS user, which must be able
    to run ``.venv-torch``'s interpreter: where the checkout lies under a folder closed to other users, the runs
    run as the stack's user instead (``TAU_RUN_AS=stack``), which changes nothing this test looks at."""
    assert Path(TORCH_PYTHON).exists(), f"{TORCH_PYTHON} is missing: `make test-slow` builds it (PyTorch's CPU build)"
    d = reachable_dir("tau-e2e-elastic-")
    try:
        stack = Stack(d, tmp_path_factory.mktemp("operator"))
        if os.geteuid() == 0 and not runas.runnable([TORCH_PYTHON], runas.OTHERS)[0]:
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
    proc = subprocess.run([*TAU, "run", str(d / "tau.yaml")], env={**stack.env, "TAU_PYTHON": TORCH_PYTHON},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"tau run {name} → {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip()


def torchrun(name: str, exchange: Path, *, elastic: bool) -> str:
    policy = ("policy:\n  priority: low\n  mode: elastic\n  elastic: {min: 2, max: 3, step: 1, cooldown: 0}\n"
              if elastic else "")
    return (f"name: {name}\nentrypoint: main.py\nargs: ['{exchange}', '{name}']\n"
            f"execution: {{launcher: torchrun, nodes: 3}}\ncompute: {{gpus: 1}}\n{policy}")


def progress(exchange: Path, name: str) -> list[dict[str, Any]]:
    path = exchange / f"progress-{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_progress(stack: Stack, run_id: str, exchange: Path, name: str, want: dict[str, Any],
                  timeout: float = 180) -> None:
    """Until the run's progress file says ``want``; a run that ended first fails at once, with its state."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if want in [{k: p.get(k) for k in want} for p in progress(exchange, name)]:
            return
        state = stack.json("status", run_id)
        assert state["state"] not in ("failed", "succeeded", "cancelled"), (state["state"], state.get("reason"))
        time.sleep(1)
    raise AssertionError(f"{name} never said {want}: {progress(exchange, name)}")


def test_an_elastic_torchrun_run_shrinks_for_a_preemptor_grows_back_and_ends_as_a_fixed_size_run(
        pool: Stack, tmp_path: Path, exchange: Path) -> None:
    fixed_gates = exchange / "fixed"  # the fixed-size run passes its gates at once
    fixed_gates.mkdir()
    fixed_gates.chmod(0o777)  # its run user writes its progress there
    for gate in ("shrunk", "grown"):
        (fixed_gates / gate).touch()
    fixed = submit(pool, tmp_path, "fixed", torchrun("fixed", fixed_gates, elastic=False), TRAIN)
    assert pool.wait_state(fixed, {"succeeded", "failed"}, timeout=240)["state"] == "succeeded"
    [done_fixed] = [p for p in progress(fixed_gates, "fixed") if p["event"] == "done"]

    elastic = submit(pool, tmp_path, "elastic", torchrun("elastic", exchange, elastic=True), TRAIN)
    wait_progress(pool, elastic, exchange, "elastic", {"event": "hold", "step": 20, "world": 3})
    hi = submit(pool, tmp_path, "hi", f"name: hi\nentrypoint: main.py\nargs: ['{exchange / 'release'}']\n"
                                      "compute: {gpus: 1}\npolicy: {priority: high}\n", HOLD)
    pool.wait_state(hi, {"running"}, timeout=120)
    wait_progress(pool, elastic, exchange, "elastic", {"event": "start", "step": 20, "world": 2})  # from its checkpoint
    (exchange / "shrunk").touch()
    wait_progress(pool, elastic, exchange, "elastic", {"event": "hold", "step": 40, "world": 2})
    (exchange / "release").touch()  # the higher-priority run ends: its GPU comes back
    assert pool.wait_state(hi, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    wait_progress(pool, elastic, exchange, "elastic", {"event": "start", "step": 40, "world": 3})
    (exchange / "grown").touch()
    status = pool.wait_state(elastic, {"succeeded", "failed"}, timeout=180)
    assert status["state"] == "succeeded", status
    # pod 2 given up at the shrink, a new pod 2 at the growth: the status lists the three that ran to the end
    assert sorted(p["name"].split("-a1-")[1].split("-")[0] for p in status["pods"]) == ["0", "1", "2"], status["pods"]

    said = progress(exchange, "elastic")
    assert [(p["event"], p["step"], p["world"]) for p in said if p["event"] != "hold"] == [
        ("start", 0, 3), ("start", 20, 2), ("start", 40, 3), ("done", 60, 3)]
    assert said[-1]["w"] == done_fixed["w"]  # bitwise: every world size sums the same gradients in the same order

    resized = [e["data"] for e in pool.events(elastic) if e["short_type"] == "exec.resized"]
    assert [(r["old_count"], r["new_count"], r["cause"], r["preemptor"], r["checkpoint_step"]) for r in resized] == [
        (3, 2, "ShrunkForPreemptor", hi, 20), (2, 3, "Grown", "", 40)]
    assert "size: 3 pods (last resize: 2 -> 3 pods, quota freed (Grown), from checkpoint step 40)" in pool.tau(
        "status", elastic, check=True).stdout
    pool.wait_sealed(elastic)
    bundle = pool.json("evidence", elastic)
    [attempt] = bundle["attempts"]
    assert [(r["old_count"], r["new_count"], r["cause"], r["checkpoint_step"]) for r in attempt["resizes"]] == [
        (3, 2, "ShrunkForPreemptor", 20), (2, 3, "Grown", 40)]
    assert [e["short_type"] for e in pool.events(elastic)].count("admission.preempted") == 0  # shrunk, not evicted
