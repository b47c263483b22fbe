"""Fractional GPUs and preemption on the embedded stack (2 declared GPUs, quota 2)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.e2e.conftest import Stack, write_project

SCRIPT = (
    "import json, os, sys, time\n"
    "start = time.time()\n"
    "print(json.dumps({'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), 'fraction': os.environ.get('TAU_GPU_FRACTION'),"
    " 'mem': os.environ.get('TAU_GPU_MEMORY_MB'), 'reason': os.environ.get('TAU_RETRY_REASON', '')}), flush=True)\n"
    "arg = sys.argv[1]\n"
    "if arg.startswith('until:'):\n"  # hold until the test says so (robust to a slow, loaded machine)
    "    deadline = time.time() + 120\n"
    "    while not os.path.exists(arg[6:]) and time.time() < deadline:\n"
    "        time.sleep(0.1)\n"
    "else:\n"
    "    time.sleep(float(arg))\n"
    "print(json.dumps({'start': start, 'end': time.time()}), flush=True)\n"
)


def _facts(stack: Stack, run_id: str) -> list[dict[str, object]]:
    out = stack.tau("logs", run_id, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_two_half_gpu_runs_share_one_gpu_at_once(stack: Stack, tmp_path: Path, exchange: Path) -> None:
    # both hold their half until both run (with a fixed sleep, a loaded machine's second run started after the first
    # had ended)
    release = exchange / "release-halves"
    cfg = write_project(tmp_path, "half", SCRIPT,
                        f"name: half\nentrypoint: main.py\nargs: ['until:{release}']\ncompute: {{gpu_fraction: 0.5}}\n")
    runs = [stack.tau("run", str(cfg), check=True).stdout.strip() for _ in range(2)]
    for r in runs:
        stack.wait_state(r, {"running"}, timeout=90)
    release.touch()
    for r in runs:
        assert stack.wait_state(r, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    a, b = (_facts(stack, r) for r in runs)
    assert a[0]["gpus"] == b[0]["gpus"] and a[0]["gpus"] in ("0", "1")  # binpack: the same physical GPU
    assert a[0]["fraction"] == "0.5" and a[0]["mem"] == "8000"
    assert a[1]["start"] < b[1]["end"] and b[1]["start"] < a[1]["end"], "the two runs did not overlap"


def test_a_gpu_memory_request_gets_that_share_of_one_gpu(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "mem", SCRIPT,
                        "name: mem\nentrypoint: main.py\nargs: ['0']\ncompute: {gpu_memory: 4000Mi}\n")
    run = stack.tau("run", str(cfg), check=True).stdout.strip()
    assert stack.wait_state(run, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    facts = _facts(stack, run)[0]
    assert (facts["fraction"], facts["mem"]) == ("0.25", "4000")  # of a declared 16000 MiB GPU
    assert facts["gpus"] in ("0", "1")


def test_higher_priority_preempts_lower_only_where_policy_allows(stack: Stack, tmp_path: Path, exchange: Path) -> None:
    release = exchange / "release-low"
    low = write_project(tmp_path, "low", SCRIPT, f"name: low\nentrypoint: main.py\nargs: ['until:{release}']\n"
                        "compute: {gpus: 2}\npolicy: {workload_priority_class: low}\n")
    peer = write_project(tmp_path, "peer", SCRIPT, "name: peer\nentrypoint: main.py\nargs: ['1']\n"
                         "compute: {gpus: 1}\npolicy: {workload_priority_class: low}\n")
    high = write_project(tmp_path, "high", SCRIPT, "name: high\nentrypoint: main.py\nargs: ['1']\n"
                         "compute: {gpus: 1}\npolicy: {workload_priority_class: high}\n")
    low_run = stack.tau("run", str(low), check=True).stdout.strip()
    stack.wait_state(low_run, {"running"})
    peer_run = stack.tau("run", str(peer), check=True).stdout.strip()
    stack.wait_state(peer_run, {"queued"})
    time.sleep(1.0)
    status = stack.json("status", peer_run)
    assert stack.json("status", low_run)["state"] == "running"  # equal priority never preempts
    assert "insufficient unused quota for nvidia.com/gpu" in json.dumps(status["phases"])
    assert "needs 1 more nvidia.com/gpu in flavor default" in json.dumps(status["phases"])  # the hint
    time.sleep(2.5)  # the local cluster refreshes its queue snapshot every 2 s
    queues = {q["cluster_queue"]: q for q in stack.json("queue")["queues"]}
    assert queues["local"]["used"]["nvidia.com/gpu"] == 2.0
    assert peer_run in [p["run_id"] for p in queues["local"]["pending"]]

    high_run = stack.tau("run", str(high), check=True).stdout.strip()
    assert stack.wait_state(high_run, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    low_events = [e["short_type"] for e in stack.events(low_run)]
    assert "admission.preempted" in low_events
    release.touch()
    assert stack.wait_state(low_run, {"succeeded", "failed"}, timeout=120)["state"] == "succeeded"
    assert stack.wait_state(peer_run, {"succeeded", "failed"}, timeout=120)["state"] == "succeeded"
    facts = _facts(stack, low_run)
    assert any(f.get("reason") == "Preempted" for f in facts)  # the restarted process knows why
    assert "admission.preempted" not in [e["short_type"] for e in stack.events(peer_run)]


def test_a_cordoned_node_admits_nothing_until_uncordoned(stack: Stack, tmp_path: Path) -> None:
    import asyncio

    from taugrid.client import open_client
    from taugrid.health.wire import NodeCordon, NodeUncordon

    async def decide(subject: str, payload: object, msg_id: str) -> None:
        # Stands in for the health monitor, with its credentials: only it may publish cordon decisions.
        state = stack.state()
        client = await open_client(state["nats_url"], creds=stack.data_dir / "creds" / "svc-health_monitor.nk")
        client.bus.source = "health-monitor"
        try:
            await client.bus.publish(subject, payload, event_type=subject.rsplit(".", 1)[-1],  # type: ignore[arg-type]
                                     ce_subject="e2e-node", msg_id=msg_id, family="node")
        finally:
            await client.close()

    asyncio.run(decide("node.e2e-node.cordon", NodeCordon(node="e2e-node", reason="GpuXidError: XID 79"),
                       f"cordon-{time.time()}"))
    time.sleep(0.5)
    cfg = write_project(tmp_path, "wait", "print('ran')\n", "name: wait\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    stack.wait_state(run_id, {"queued"})
    time.sleep(1.0)
    status = stack.json("status", run_id)
    assert status["state"] == "queued"
    assert "cordoned (GpuXidError: XID 79)" in json.dumps(status["phases"])
    asyncio.run(decide("node.e2e-node.uncordon", NodeUncordon(node="e2e-node", reason="validated"),
                       f"uncordon-{time.time()}"))
    assert stack.wait_state(run_id, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"


def test_spread_placement_puts_shared_runs_on_different_gpus(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "spread", SCRIPT, "name: spread\nentrypoint: main.py\nargs: ['5']\n"
                        "compute: {gpu_fraction: 0.5, placement: spread}\n")
    runs = [stack.tau("run", str(cfg), check=True).stdout.strip() for _ in range(2)]
    for r in runs:
        assert stack.wait_state(r, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    assert {_facts(stack, r)[0]["gpus"] for r in runs} == {"0", "1"}


def test_tau_nodes_shows_this_node_its_gpus_health_and_the_runs_on_it(stack: Stack, tmp_path: Path,
                                                                      exchange: Path) -> None:
    release = exchange / "release-nodes"
    cfg = write_project(tmp_path, "onnode", SCRIPT, f"name: onnode\nentrypoint: main.py\nargs: ['until:{release}']\n"
                        "compute: {gpus: 1}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    stack.wait_state(run_id, {"running"})
    deadline = time.time() + 30
    while True:  # the node agent samples every few seconds
        rows = {r["node"]: r for r in stack.json("nodes")}
        if "e2e-node" in rows or time.time() > deadline:
            break
        time.sleep(1)
    node = rows["e2e-node"]
    release.touch()
    assert (node["gpus"], node["verdict"], node["cordoned"], node["conditions"]) == (2, "healthy", False, {})
    assert run_id in node["runs"]
    human = stack.tau("nodes", check=True).stdout
    assert human.splitlines()[0].split() == ["NODE", "GPUS", "VENDOR/MODEL", "HEALTH", "SCHEDULING", "RUNS",
                                                 "FAILING", "CONDITIONS"]
    assert stack.wait_state(run_id, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"


def test_usage_counts_a_half_gpu_run_by_its_fraction(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "metered", SCRIPT,
                        "name: metered\nentrypoint: main.py\nargs: ['2']\ncompute: {gpu_fraction: 0.5}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    assert stack.wait_state(run_id, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    rows = {r["run"]: r for r in stack.json("usage", "--by", "run", "--since", "1h")}
    row = rows[run_id]
    assert row["runs"] == 1 and 2.0 <= row["running_s"] < 60 and row["queued_s"] < 60
    assert row["gpu_seconds"] == round(0.5 * row["running_s"], 3) and row["cost"] == 0.0  # no price set
    by_workspace = {r["workspace"]: r for r in stack.json("usage", "--by", "workspace")}
    assert by_workspace["default"]["runs"] >= 1 and by_workspace["default"]["gpu_seconds"] >= row["gpu_seconds"]
