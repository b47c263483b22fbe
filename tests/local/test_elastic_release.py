"""The local cluster, real bus, real processes: an elastic Job shrunk for a higher-priority Job keeps the removed
pod's quota and GPU until that pod's process has exited, so the newcomer never starts on capacity still in use
(Kueue #15661: quota freed before the pods stopped). The removed pod takes 2 s to stop after its SIGTERM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster
from tests.local.test_elastic_pool import PLATFORM, job, running, until


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with pool_cluster(tmp_path, PLATFORM, name="elastic-release") as (_bus, cluster):
        yield cluster


def up(c: LocalCluster, pod: str) -> bool:
    try:
        return [ln.text for ln in c.kubelet.read_log(pod, "main")[0]] == ["up"]
    except FileNotFoundError:
        return False


def real(manifest: dict[str, Any], script: str) -> dict[str, Any]:
    [container] = manifest["spec"]["template"]["spec"]["containers"]
    container["command"] = ["python3", "-c", script]
    container["env"] = [e for e in container["env"] if e["name"] != "SIMULATED_DURATION"]
    return manifest


async def test_a_shrunk_pods_quota_is_freed_only_once_its_process_has_exited(pool: LocalCluster,
                                                                             tmp_path: Path) -> None:
    c = pool
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    slow_stop = ("import os, signal, sys, time\n"
                 f"d = {str(stamps)!r}; i = os.environ.get('JOB_COMPLETION_INDEX', '?')\n"
                 "def stop(*_):\n"
                 "    time.sleep(2.0)\n"
                 "    open(f'{d}/el-{i}.exited', 'w').write(repr(time.time()))\n"
                 "    sys.exit(143)\n"
                 "signal.signal(signal.SIGTERM, stop)\n"
                 "print('up', flush=True); time.sleep(600)\n")
    stamp_start = ("import os, time\n"
                   f"d = {str(stamps)!r}; i = os.environ.get('JOB_COMPLETION_INDEX', '?')\n"
                   "open(f'{d}/hi-{i}.started', 'w').write(repr(time.time()))\n")
    await c.apply(BackendApply(run_id="el", workspace="default", attempt=1, manifests=[
        real(job("el-a1", pods=2, priority="low", seconds=0, elastic="1:3:1:0"), slow_stop)]))
    try:
        await shrunk_for_a_newcomer(c, stamps, stamp_start)
    finally:  # the kept pods sleep for minutes: stopped here, not left running past the test
        await c.delete(BackendDelete(run_id="el", workspace="default", attempt=1, kind="Job", namespace="default",
                                     name="el-a1", grace_s=10))
        await until(c, lambda: {p.name for p in stamps.glob("el-*.exited")} >= {"el-0.exited", "el-1.exited"},
                    timeout=30)


async def shrunk_for_a_newcomer(c: LocalCluster, stamps: Path, stamp_start: str) -> None:
    await until(c, lambda: running(c, "el-a1") == [0, 1, 2], timeout=60)  # grown to 3 of the 4 GPUs
    await until(c, lambda: all(up(c, p.name) for p in c.wls["el-a1"].pods), timeout=60)  # their processes run
    await c.apply(BackendApply(run_id="hi", workspace="default", attempt=1, manifests=[
        real(job("hi-a1", pods=2, priority="high", seconds=0), stamp_start)]))
    await until(c, lambda: running(c, "el-a1") == [0, 1], timeout=60)  # pod 2 told to stop: the run shrank
    await until(c, lambda: len(list(stamps.glob("hi-*.started"))) == 2, timeout=60)
    exited = float((stamps / "el-2.exited").read_text())  # written just before the removed pod's exit
    started = sorted(float(p.read_text()) for p in stamps.glob("hi-*.started"))
    assert started[0] > exited, (started, exited)  # the newcomer's pods ran only after the removed one was gone
    assert c.wls["el-a1"].state == "running" and c.wls["el-a1"].requeues == 0  # shrunk, never evicted
    assert not c.releases  # the held quota was released
