"""Issue 24's check on the embedded stack: a multi-node run on the local pool whose pods land in one rack when it
asks for one. The platform revision applied here turns the pool into four one-GPU nodes in two racks (labels),
declares a topology (rack, then hostname) and makes the flavor a TAS flavor; the session's platform is put back
afterwards, so the other e2e files see what they always see.

With ``e2e-a1`` (rack r1) held by a one-GPU run, a two-node torchrun run with ``policy.topology: <rack>``
(required) must take rack r2's two nodes; the same run without the request takes the first free ones, across
racks. Where each pod ran is read three ways: the run's admission event (Kueue's topologyAssignment), its status
(pods and their nodes), and what the pods print (``TAU_NODE_NAME``, ``TAU_RANK_NODES``, torchrun's node rank).

torch is not installed in the test's Python, so the project ships a stand-in ``torch.distributed.run`` module
(``python3 -m`` finds it in the project's folder first): it takes torchrun's flags, as the renderer wrote them
and the kubelet expanded them, and runs the script with the node rank it was given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import TEST_PLATFORM, Stack

RACK = "example.com/topology-rack"
HOST = "kubernetes.io/hostname"
NODES = (("e2e-a1", "r1"), ("e2e-a2", "r1"), ("e2e-b1", "r2"), ("e2e-b2", "r2"))
POOL = "".join(f"    - {{name: {name}, gpus: 1, gpu_memory: 16000Mi, labels: {{taugrid.io/pool: gpu, {RACK}: {r}}}}}\n"
               for name, r in NODES)
TORCHRUN_STAND_IN = (
    "import os, runpy, sys\n"
    "flags = dict(a[2:].split('=', 1) for a in sys.argv[1:] if a.startswith('--') and '=' in a)\n"
    "script = next(i for i, a in enumerate(sys.argv[1:], 1) if not a.startswith('--'))\n"
    "os.environ['NODE_RANK'], os.environ['NNODES'] = flags['node_rank'], flags['nnodes']\n"
    "sys.argv = sys.argv[script:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
SCRIPT = (
    "import json, os, sys, time\n"
    "print(json.dumps({k: os.environ.get(k) for k in ('NODE_RANK', 'NNODES', 'TAU_NODE_NAME', 'TAU_RANK_NODES',"
    " 'CUDA_VISIBLE_DEVICES')}), flush=True)\n"
    "if len(sys.argv) > 1:\n"  # hold until the test says so (robust to a slow, loaded machine)
    "    deadline = time.time() + 50\n"
    "    while not os.path.exists(sys.argv[1]) and time.time() < deadline:\n"
    "        time.sleep(0.1)\n"
)


def _platform(outputs: Path) -> str:
    text = TEST_PLATFORM.replace(
        "resource_flavors: [{name: default}]",
        f"topologies: [{{name: racks, levels: [{RACK}, {HOST}]}}]\n"
        "resource_flavors: [{name: default, topology_name: racks, node_labels: {taugrid.io/pool: gpu}}]")
    text = text.replace('{name: nvidia.com/gpu, nominal_quota: "2"}', '{name: nvidia.com/gpu, nominal_quota: "4"}')
    return text.replace("{outputs}", str(outputs)) + "local:\n  nodes:\n" + POOL


@pytest.fixture(scope="module")
def racks(stack: Stack) -> Iterator[Stack]:
    path = stack.data_dir / "platform-racks.yaml"
    path.write_text(_platform(stack.data_dir / "outputs"))
    stack.tau("platform", "apply", str(path), check=True)
    yield stack
    stack.tau("platform", "apply", str(stack.data_dir / "platform.yaml"), check=True)


def project(root: Path, name: str, config: str) -> Path:
    d = root / name
    (d / "torch" / "distributed").mkdir(parents=True)
    (d / "torch" / "__init__.py").write_text("")
    (d / "torch" / "distributed" / "__init__.py").write_text("")
    (d / "torch" / "distributed" / "run.py").write_text(TORCHRUN_STAND_IN)
    (d / "main.py").write_text(SCRIPT)
    (d / "tau.yaml").write_text(config)
    return d / "tau.yaml"


def two_nodes(name: str, *, rack: bool) -> str:
    policy = f"policy: {{topology: {RACK}}}\n" if rack else ""
    return (f"name: {name}\nentrypoint: main.py\nexecution: {{launcher: torchrun, nodes: 2}}\n"
            f"compute: {{gpus: 1}}\n{policy}")


def printed(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """What each pod printed, by node rank."""
    out = stack.tau("logs", run_id, check=True).stdout
    return sorted((json.loads(line[line.index("{"):]) for line in out.splitlines() if "{" in line),
                  key=lambda d: int(d["NODE_RANK"]))


def admitted_topology(stack: Stack, run_id: str) -> list[dict[str, Any]]:
    [admitted] = [e["data"] for e in stack.events(run_id) if e["short_type"] == "admission.admitted"]
    return admitted["topology"]  # type: ignore[no-any-return]


def wait_pods(stack: Stack, run_id: str, count: int, timeout: float = 30) -> dict[str, Any]:
    """The run's status once it shows ``count`` pods with their nodes (the pods' progress arrives after running)."""
    deadline = time.time() + timeout
    status: dict[str, Any] = {}
    while time.time() < deadline:
        status = stack.json("status", run_id)
        if len(status["pods"]) == count and all(p["node"] for p in status["pods"]):
            return status
        time.sleep(0.3)
    raise AssertionError(f"{run_id}: pods never all shown with their nodes: {status.get('pods')}")


def wait_nodes(stack: Stack, names: set[str], timeout: float = 30) -> list[dict[str, Any]]:
    """``tau nodes`` once every named node's agent has sampled (an agent per pool node, every few seconds)."""
    deadline = time.time() + timeout
    rows: list[dict[str, Any]] = []
    while time.time() < deadline:
        rows = stack.json("nodes")
        if names <= {r["node"] for r in rows}:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"tau nodes never listed {sorted(names)}: {[r['node'] for r in rows]}")


def test_a_two_node_run_asking_for_a_rack_lands_in_one_rack_and_one_without_may_span(
        racks: Stack, tmp_path: Path, exchange: Path) -> None:
    release = exchange / "release"
    busy = project(tmp_path, "busy", f"name: busy\nentrypoint: main.py\nargs: ['{release}']\ncompute: {{gpus: 1}}\n")
    holder = racks.tau("run", str(busy), check=True).stdout.strip()
    racks.wait_state(holder, {"running"})
    assert [p["node"] for p in wait_pods(racks, holder, 1)["pods"]] == ["e2e-a1"]  # BestFit: rack r1, first node

    ranked = racks.tau("run", str(project(tmp_path, "ranked", two_nodes("ranked", rack=True))), check=True)
    run = ranked.stdout.strip()
    assert racks.wait_state(run, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    # rack r1 has one free node: the run takes rack r2, rank 0 on e2e-b1 and rank 1 on e2e-b2
    assert admitted_topology(racks, run) == [{"pod_set": "main", "levels": [HOST], "domains": [
        {"values": ["e2e-b1"], "count": 1}, {"values": ["e2e-b2"], "count": 1}]}]
    assert sorted(p["node"] for p in racks.json("status", run)["pods"]) == ["e2e-b1", "e2e-b2"]
    assert printed(racks, run) == [
        {"NODE_RANK": "0", "NNODES": "2", "TAU_NODE_NAME": "e2e-b1", "TAU_RANK_NODES": "e2e-b1,e2e-b2",
         "CUDA_VISIBLE_DEVICES": "0"},
        {"NODE_RANK": "1", "NNODES": "2", "TAU_NODE_NAME": "e2e-b2", "TAU_RANK_NODES": "e2e-b1,e2e-b2",
         "CUDA_VISIBLE_DEVICES": "0"}]
    tree = racks.tau("status", run, check=True).stdout
    assert f"  topology (main): {HOST}\n    e2e-b1  rank 0\n    e2e-b2  rank 1" in tree

    spread = racks.tau("run", str(project(tmp_path, "spread", two_nodes("spread", rack=False))), check=True)
    run = spread.stdout.strip()
    assert racks.wait_state(run, {"succeeded", "failed"}, timeout=60)["state"] == "succeeded"
    # nothing asked: the first free nodes, e2e-a2 in rack r1 and e2e-b1 in r2
    assert [(d["NODE_RANK"], d["TAU_NODE_NAME"], d["TAU_RANK_NODES"]) for d in printed(racks, run)] == [
        ("0", "e2e-a2", "e2e-a2,e2e-b1"), ("1", "e2e-b1", "e2e-a2,e2e-b1")]
    # tau nodes (asked last: the new nodes' agents have sampled by now): each pool node with its rack (from the
    # platform's labels), the holder still on e2e-a1
    pool = {name for name, _ in NODES}
    assert {n["node"]: (n["domain"], n["runs"]) for n in wait_nodes(racks, pool) if n["node"] in pool} == {
        "e2e-a1": ({RACK: "r1"}, [holder]), "e2e-a2": ({RACK: "r1"}, []), "e2e-b1": ({RACK: "r2"}, []),
        "e2e-b2": ({RACK: "r2"}, [])}
    release.touch()
    assert racks.wait_state(holder, {"succeeded", "failed"}, timeout=40)["state"] == "succeeded"
