"""`tau up --ha`: the bus is a 3-server JetStream cluster, every stream, bucket and object store on all three.
SIGKILL of the server leading RUNS while runs are in flight: the services ride through the leader change and
every run reaches exactly the terminal state its script decides, once, sealed once (the supervisor restarts the
killed server). The 500-run version of this is `bench/bus_ha.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_PLATFORM, Stack, write_project
from tests.e2e.test_chaos import DECIDING_SCRIPT, assert_each_run_ends_as_its_script_decides, submit_runs

RUNS_LEADER = """
import asyncio, json
from taugrid.client import open_client

async def main():
    client = await open_client()
    try:
        info = await client.bus.js.stream_info("RUNS")
        print(json.dumps({"leader": info.cluster.leader, "replicas": info.config.num_replicas,
                          "peers": sorted(r.name for r in info.cluster.replicas or [])}))
    finally:
        await client.close()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def ha_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = tmp_path_factory.mktemp("ha-stack")
    s = Stack(d)
    s.tau("up", "--ha", "--timeout", "240", check=True, timeout=300)
    platform = d / "platform.yaml"
    platform.write_text(TEST_PLATFORM.replace("{outputs}", str(d / "outputs")))
    s.tau("platform", "apply", str(platform), check=True)
    yield s
    s.tau("down", timeout=60)


def runs_stream(stack: Stack) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", RUNS_LEADER], env=stack.env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_sigkill_of_the_runs_leader_mid_burst_every_run_ends_once(ha_stack: Stack, tmp_path: Path) -> None:
    state = ha_stack.state()
    assert state["ha"] is True and len(state["nats_pids"]) == 3
    stream = runs_stream(ha_stack)
    assert stream["replicas"] == 3 and len(stream["peers"]) == 2, stream
    cfg = write_project(tmp_path, "haloss", DECIDING_SCRIPT, "name: haloss\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    runs = submit_runs(ha_stack, cfg, 12)
    started = time.time()
    leader = int(str(stream["leader"]).removeprefix("tau-n"))
    victim = state["nats_pids"][leader]
    os.kill(victim, signal.SIGKILL)
    assert_each_run_ends_as_its_script_decides(ha_stack, runs, within=120)
    assert victim not in ha_stack.state()["nats_pids"]  # the supervisor started it again
    print(f"12 runs sealed {time.time() - started:.1f} s after the RUNS leader was killed")
