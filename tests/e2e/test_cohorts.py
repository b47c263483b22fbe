"""Two ClusterQueues in one cohort on the embedded stack (2 declared GPUs): a team borrows its peer's idle GPU,
and the peer reclaims it by preemption, with real processes; the same for KAI's department → project queues.

The platform revision applied here adds cohort ``lab`` with ClusterQueues ``team-a`` and ``team-b`` (1 GPU of
nominal quota each, ``reclaimWithinCohort: Any``), department ``research`` with projects ``vision`` and
``language`` (1 deserved GPU each) and their workspaces to the session's platform, and puts the session's
platform back afterwards, so the other e2e files see what they always see.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_PLATFORM, Stack, write_project

TEAMS = """
  - name: team-{t}
    cohort: lab
    preemption: {{reclaim_within_cohort: Any}}
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: default
            resources:
              - {{name: cpu, nominal_quota: "8"}}
              - {{name: memory, nominal_quota: 16Gi}}
              - {{name: nvidia.com/gpu, nominal_quota: "1"}}
"""
WORKSPACE = """
  - {{name: team-{t}, namespace: team-{t}, local_queue: q, default_priority: normal, default_profile: cpu-small,
     max_gpus_per_run: 2, output_root: {outputs}}}
"""
DEPARTMENT = """
departments:
  - name: research
    deserved: {nvidia.com/gpu: 2}
    projects:
      - {name: vision, deserved: {nvidia.com/gpu: 1}}
      - {name: language, deserved: {nvidia.com/gpu: 1}}
"""
SCRIPT = (
    "import json, os, sys, time\n"
    "print(json.dumps({'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'),"
    " 'reason': os.environ.get('TAU_RETRY_REASON', '')}), flush=True)\n"
    "arg = sys.argv[1]\n"
    "if arg.startswith('until:'):\n"  # hold until the test says so (robust to a slow, loaded machine)
    "    deadline = time.time() + 50\n"
    "    while not os.path.exists(arg[6:]) and time.time() < deadline:\n"
    "        time.sleep(0.1)\n"
    "else:\n"
    "    time.sleep(float(arg))\n"
)


def _platform(outputs: Path) -> str:
    text = TEST_PLATFORM.replace("cohorts: [{name: local}]", "cohorts: [{name: local}, {name: lab}]")
    text = text.replace("local_queues: [{name: default, namespace: default, cluster_queue: local}]",
                        "".join(TEAMS.format(t=t) for t in "ab").rstrip("\n") + "\n"
                        "local_queues:\n  - {name: default, namespace: default, cluster_queue: local}\n"
                        "  - {name: q, namespace: team-a, cluster_queue: team-a}\n"
                        "  - {name: q, namespace: team-b, cluster_queue: team-b}\n"
                        "  - {name: q, namespace: team-vision, cluster_queue: vision}\n"
                        "  - {name: q, namespace: team-language, cluster_queue: language}")
    text += "".join(WORKSPACE.format(t=t, outputs="{outputs}").lstrip("\n") for t in ("a", "b", "vision", "language"))
    text += DEPARTMENT
    return text.replace("{outputs}", str(outputs))


@pytest.fixture(scope="module")
def lab(stack: Stack) -> Iterator[Stack]:
    path = stack.data_dir / "platform-lab.yaml"
    path.write_text(_platform(stack.data_dir / "outputs"))
    stack.tau("platform", "apply", str(path), check=True)
    yield stack
    # --prune: the lab's workspaces go again, though runs were made in them
    stack.tau("platform", "apply", str(stack.data_dir / "platform.yaml"), "--prune", check=True)


def _wait_borrowing(stack: Stack, timeout: float = 15) -> dict[str, dict[str, object]]:
    """The queue snapshot is rewritten every 2 s: wait until it shows team-a borrowing one GPU."""
    deadline = time.time() + timeout
    queues: dict[str, dict[str, object]] = {}
    while time.time() < deadline:
        queues = {q["cluster_queue"]: q for q in stack.json("queue")["queues"]}
        if queues.get("team-a", {}).get("borrowed"):  # a snapshot from before the lab's queues lacks team-a
            return queues
        time.sleep(0.5)
    raise AssertionError(f"team-a never showed borrowing; last snapshot: {queues}")


def _facts(stack: Stack, run_id: str) -> list[dict[str, object]]:
    out = stack.tau("logs", run_id, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_queue_borrows_its_cohort_peers_idle_gpu(lab: Stack, tmp_path: Path, exchange: Path) -> None:
    release = exchange / "release"
    cfg = write_project(tmp_path, "wide", SCRIPT, f"name: wide\nentrypoint: main.py\nargs: ['until:{release}']\n"
                        "compute: {gpus: 2}\n")
    run = lab.tau("run", str(cfg), "-w", "team-a", check=True).stdout.strip()
    lab.wait_state(run, {"running"})
    queues = _wait_borrowing(lab)
    a, b = queues["team-a"], queues["team-b"]
    assert (a["cohort"], a["borrowed"]) == ("lab", {"nvidia.com/gpu": 1.0})
    assert a["used"]["nvidia.com/gpu"] == 2.0  # type: ignore[index]
    assert b["lent"] == {"nvidia.com/gpu": 1.0} and not b["used"].get("nvidia.com/gpu")  # type: ignore[attr-defined]
    release.touch()
    assert lab.wait_state(run, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
    assert sorted(str(_facts(lab, run)[0]["gpus"]).split(",")) == ["0", "1"]  # one of them team-b's


def test_the_lender_reclaims_its_gpu_by_preempting_the_borrower(lab: Stack, tmp_path: Path, exchange: Path) -> None:
    release = exchange / "release"
    wide = write_project(tmp_path, "wide", SCRIPT, f"name: wide\nentrypoint: main.py\nargs: ['until:{release}']\n"
                         "compute: {gpus: 2}\n")
    own = write_project(tmp_path, "own", SCRIPT, "name: own\nentrypoint: main.py\nargs: ['1']\ncompute: {gpus: 1}\n")
    borrower = lab.tau("run", str(wide), "-w", "team-a", check=True).stdout.strip()
    lab.wait_state(borrower, {"running"})
    lender = lab.tau("run", str(own), "-w", "team-b", check=True).stdout.strip()
    # team-b is within its nominal quota, so it reclaims what team-a borrowed: team-a's process is stopped
    assert lab.wait_state(lender, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
    preempted = [e["data"] for e in lab.events(borrower) if e["short_type"] == "admission.preempted"]
    assert len(preempted) == 1 and preempted[0]["reason"] == "Preempted", preempted
    assert preempted[0]["message"].startswith("InCohortReclamation: Preempted to accommodate a workload"), preempted
    # once the lender is done, the borrower is admitted again and runs to the end
    release.touch()
    assert lab.wait_state(borrower, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
    assert any(f["reason"] == "Preempted" for f in _facts(lab, borrower))  # the restarted process knows why


def test_a_kai_project_reclaims_its_deserved_gpu_from_an_over_quota_sibling(lab: Stack, tmp_path: Path,
                                                                             exchange: Path) -> None:
    release = exchange / "release"
    hold = write_project(tmp_path, "hold", SCRIPT, f"name: hold\nentrypoint: main.py\nargs: ['until:{release}']\n"
                         "compute: {gpus: 1}\n")
    own = write_project(tmp_path, "own", SCRIPT, "name: own\nentrypoint: main.py\nargs: ['1']\ncompute: {gpus: 1}\n")
    older = lab.tau("run", str(hold), "-w", "team-vision", check=True).stdout.strip()
    newer = lab.tau("run", str(hold), "-w", "team-vision", check=True).stdout.strip()
    lab.wait_state(newer, {"running"})  # alone in the department, vision uses both GPUs (1 deserved + 1 idle)
    claim = lab.tau("run", str(own), "-w", "team-language", check=True).stdout.strip()
    assert lab.wait_state(claim, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
    preempted = [e["data"] for e in lab.events(newer) if e["short_type"] == "admission.preempted"]
    assert len(preempted) == 1 and preempted[0]["message"].startswith(
        "InCohortReclamation: Preempted to accommodate a workload"), preempted
    release.touch()
    for run in (older, newer):
        assert lab.wait_state(run, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
    assert "admission.preempted" not in [e["short_type"] for e in lab.events(older)]  # the newest went first
