"""Issue 25 item 4 through the whole health chain on the local pool: an elastic run with a pod on each of two nodes
(both behind the NVML stand-in); a GPU fault on the node of its highest-index pod → node conditions → cordon and
drain → the monitor does not send ``health.degraded`` (the run has a pod elsewhere) → the local pool shrinks the run
off the node (``exec.resized`` 2 → 1, ``Shrunk``, naming the node) instead of failing it → repair, re-validation,
uncordon → the engine grows the run back onto the healthy node (1 → 2) → it finishes in its first attempt, never
retried.

The run is torchrun's elastic mode as rendered; torch is not installed in the test's Python, so the project ships a
stand-in ``torch.distributed.run`` (as ``tests/e2e/test_topology.py`` does) that runs the script."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.health.kmsg import KmsgReader
from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import HealthProbe
from tests.health.test_chain import StandInGpu, history, running_chain, wait_for

TORCHRUN_STAND_IN = (
    "import runpy, sys\n"
    "script = next(i for i, a in enumerate(sys.argv[1:], 1) if not a.startswith('--'))\n"
    "sys.argv = sys.argv[script:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
SCRIPT = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM: stopping', flush=True), sys.exit(143)))\n"
    "print('pod', os.environ['JOB_COMPLETION_INDEX'], 'on', os.environ['TAU_NODE_NAME'], flush=True)\n"
    "deadline = time.time() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.time() < deadline:\n"
    "    time.sleep(0.1)\n"
)


@pytest.fixture
async def chain(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    gpus: dict[str, StandInGpu] = {}
    probes: dict[str, HealthProbe] = {}
    for node in ("gpu-a", "gpu-b"):
        kmsg_path = tmp_path / f"kmsg-{node}"
        kmsg_path.touch()
        gpu = gpus[node] = StandInGpu(kmsg_path)
        probes[node] = NvmlProbe(nvml=gpu.nvml, kmsg=KmsgReader(os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK)),
                                 burn=gpu.burn, reboot=gpu.reboot)
    async with running_chain(tmp_path, "local", probes=probes) as c:
        yield {**c, "gpus": gpus}


def project(root: Path, release: Path) -> Path:
    d = root / "project"
    (d / "torch" / "distributed").mkdir(parents=True)
    (d / "torch" / "__init__.py").write_text("")
    (d / "torch" / "distributed" / "__init__.py").write_text("")
    (d / "torch" / "distributed" / "run.py").write_text(TORCHRUN_STAND_IN)
    (d / "main.py").write_text(SCRIPT)
    (d / "tau.yaml").write_text(
        f"name: elastic-chain\nentrypoint: main.py\nargs: ['{release}']\n"
        "execution: {launcher: torchrun, nodes: 2}\ncompute: {gpus: 1}\n"
        "policy: {mode: elastic, elastic: {min: 1, max: 2, step: 1, cooldown: 0}}\n")
    return d / "tau.yaml"


async def test_a_gpu_fault_under_an_elastic_run_shrinks_it_off_the_node_and_it_grows_back_after_repair(
        chain: dict[str, Any], tmp_path: Path) -> None:
    client, tick = chain["client"], chain["tick"]
    await tick("gpu-a")
    await tick("gpu-b")
    release = tmp_path / "release"
    run_id = await client.submit(project(tmp_path, release))

    async def placed() -> dict[int, str]:
        """Pod index → node, once both pods printed where they run."""
        said = [ln.split() for ln in await chain["lines"](run_id, 1) if ln.startswith("pod ")]
        return {int(w[1]): w[3] for w in said} if len(said) >= 2 else {}

    nodes = await wait_for(placed, "both pods running")
    assert sorted(nodes.values()) == ["gpu-a", "gpu-b"]
    faulty, healthy = nodes[1], nodes[0]  # the highest index's node: a shrink there keeps pod 0, the rendezvous
    chain["gpus"][faulty].fault()
    await tick(faulty)

    async def resized() -> list[dict[str, Any]]:
        return [e.as_dict() for e in [e async for e in client.events(run_id=run_id)] if e.type == "exec.resized"]

    [shrunk] = await wait_for(resized, "the shrink off the faulty node")
    assert (shrunk["old_count"], shrunk["new_count"], shrunk["cause"]) == (2, 1, "Shrunk")
    assert shrunk["message"].startswith(f"node {faulty} drained: ")
    for _ in range(8):  # the node's agent samples again: repair, clean samples, re-validation, uncordon
        await tick(faulty)
        if any(k == "node.uncordon" for _, k, _, _ in await history(chain["bus"], run_id, faulty)):
            break

    async def grown() -> list[dict[str, Any]]:
        got = await resized()
        return got if len(got) == 2 else []

    back = (await wait_for(grown, "the growth back after the uncordon"))[1]
    assert (back["old_count"], back["new_count"], back["cause"]) == (1, 2, "Grown")
    await wait_for(lambda: _said(chain, run_id, f"pod 1 on {faulty}", times=2), "pod 1 back on the repaired node")
    release.touch()

    async def finished() -> str:
        rec = await client.settled(run_id)
        return rec.state if rec.state in ("succeeded", "failed") else ""

    assert await wait_for(finished, "the run to finish") == "succeeded"
    events = await history(chain["bus"], run_id, faulty)
    kinds = [k for _, k, _, _ in events]
    assert "node.cordon" in kinds and "node.uncordon" in kinds
    assert kinds.index("node.cordon") < kinds.index("exec.resized") < kinds.index("node.uncordon"), kinds
    assert "health.degraded" not in kinds and "recovery.retrying" not in kinds and "exec.failed" not in kinds, kinds
    assert {a for _, k, _, a in events if k.startswith("exec.")} == {1}  # one attempt throughout
    # pod 0 ran on untouched; pod 1 ran on the faulty node, was stopped, and ran there again once it was repaired
    # (what a stopped pod prints after its SIGTERM is not shipped: the shrink ships its log before stopping it)
    assert sorted(await chain["lines"](run_id, 1)) == sorted([f"pod 0 on {healthy}"] + [f"pod 1 on {faulty}"] * 2)


async def _said(chain: dict[str, Any], run_id: str, text: str, *, times: int) -> bool:
    return (await chain["lines"](run_id, 1)).count(text) >= times
