"""A local pool of declared nodes (the platform's ``local.nodes``): each pod lands on a node with its own GPUs, a
cordon keeps new work off one node only, a drain stops that node's running pods with a grace period, and a
retry's ``kubernetes.io/hostname NotIn`` affinity keeps it off the excluded node. Real processes, real bus."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus import Bus
from taugrid.bus.envelope import Event
from taugrid.config.platform import load_platform
from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.core.errors import ConfigError
from taugrid.health.wire import NodeCordon, NodeUncordon
from taugrid.local.controller import LocalCluster
from taugrid.local.runtime import Preparing
from taugrid.local.state import LocalWorkload
from taugrid.render.common import node_exclusion
from tests.local.pools import pool_cluster, settle
from tests.local.test_controller import job, main
from tests.platforms import CPU_MEMORY, lab_platform, workspace

POOL_PLATFORM = lab_platform(
    quota={**CPU_MEMORY, "nvidia.com/gpu": "4"}, workspaces=[workspace(output_root="/tmp")],
    local={"nodes": [{"name": "gpu-a", "gpus": 1, "gpu_memory": "16000Mi"},
                     {"name": "gpu-b", "gpus": 1, "gpu_memory": "16000Mi"}]})


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[tuple[Bus, LocalCluster]]:
    async with pool_cluster(tmp_path, POOL_PLATFORM, name="pool", drain_grace_s=5.0) as got:
        yield got


def gpu_job(name: str, command: list[str], *, exclude: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    container = main(command)
    container["resources"]["requests"]["nvidia.com/gpu"] = "1"
    extra = {"affinity": node_exclusion(exclude)} if exclude else {}
    return job(name, container, **extra)


def node_event(subject: str, payload: msgspec.Struct) -> Event:
    return Event(id=uuid.uuid4().hex, type=subject.rsplit(".", 1)[1], source="/svc/health-monitor",
                 subject=subject.split(".")[1], time="2026-11-30T00:00:00.000Z", data=msgspec.json.encode(payload),
                 nats_subject=subject)


async def test_pods_land_per_node_and_a_drain_stops_only_that_nodes_pods_with_grace(
        pool: tuple[Bus, LocalCluster]) -> None:
    _, c = pool
    trap = ["python3", "-c", "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('graceful stop', flush=True), sys.exit(143)))\n"
            "print('up', flush=True); time.sleep(60)"]
    for rid in ("one", "two"):
        await c.apply(BackendApply(run_id=rid, workspace="default", attempt=1, manifests=[gpu_job(f"{rid}-a1", trap)]))
    await settle(c, lambda: all(p.phase == "Running" for w in c.wls.values() for p in w.pods)
                 and all(w.pods for w in c.wls.values()))
    placed = {w.name: (w.pods[0].node, w.pods[0].gpus, w.pods[0].obj["spec"]["nodeName"]) for w in c.wls.values()}
    assert sorted(placed.values()) == [("gpu-a", [0], "gpu-a"), ("gpu-b", [0], "gpu-b")]
    on_a = next(n for n, (node, _, _) in placed.items() if node == "gpu-a")
    on_b = next(n for n in placed if n != on_a)
    drained = c.wls[on_a]
    await settle(c, lambda: [ln.text for ln in c.kubelet.read_log(f"{on_a}-pod", "main")[0]] == ["up"])
    await c.on_node(node_event("node.gpu-a.cordon", NodeCordon(node="gpu-a", reason="XID 79", drain=True)))
    assert c.admitter.cordoned == {"gpu-a": "XID 79"}
    await settle(c, lambda: on_a not in c.wls)
    status = drained.pods[0].obj["status"]
    [cs] = status["containerStatuses"]
    assert (status["phase"], cs["state"]["terminated"]["reason"], cs["state"]["terminated"]["exitCode"]) == (
        "Failed", "Evicted", 143)
    log = c.kubelet.read_log(f"{on_a}-pod", "main", final=True)[0]
    assert [ln.text for ln in log] == ["up", "graceful stop"]  # SIGTERM first: the grace period was given
    assert c.wls[on_b].pods[0].phase == "Running"  # the healthy node's pod runs on
    assert drained.job["status"]["conditions"][-1]["type"] == "Failed"
    await c.delete(BackendDelete(run_id=on_b[:-3], workspace="default", attempt=1, kind="Job", namespace="default",
                                 name=on_b, grace_s=1))


async def test_a_drain_fails_a_pod_still_preparing_there_so_it_never_starts_on_the_drained_node(
        pool: tuple[Bus, LocalCluster]) -> None:
    _, c = pool

    class Preparing_:
        def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing:
            return Preparing("building the environment")

        def forget(self, pod: str) -> None:
            return None

    c.podsync.runtime = Preparing_()
    await c.apply(BackendApply(run_id="slow", workspace="default", attempt=1, manifests=[gpu_job("slow-a1", ["true"])]))
    await settle(c, lambda: bool(c.wls["slow-a1"].pods) and c.wls["slow-a1"].pods[0].added)
    wl = c.wls["slow-a1"]
    assert [(p.node, p.phase) for p in wl.pods] == [("gpu-a", "Pending")]
    await c.on_node(node_event("node.gpu-a.cordon", NodeCordon(node="gpu-a", reason="ECC", drain=True)))
    await settle(c, lambda: "slow-a1" not in c.wls)
    [cs] = wl.pods[0].obj["status"]["containerStatuses"]
    assert (wl.pods[0].phase, cs["state"]["terminated"]["reason"]) == ("Failed", "Evicted")
    assert wl.job["status"]["conditions"][-1]["type"] == "Failed"
    assert c.kubelet.status("slow-a1-pod") is None  # never handed to the kubelet


async def test_a_retry_excluding_the_healthy_node_waits_for_the_cordoned_one_then_lands_there(
        pool: tuple[Bus, LocalCluster]) -> None:
    _, c = pool
    await c.on_node(node_event("node.gpu-a.cordon", NodeCordon(node="gpu-a", reason="XID 79")))
    await c.apply(BackendApply(run_id="retry", workspace="default", attempt=2,
                               manifests=[gpu_job("retry-a2", ["true"], exclude=["gpu-b"])]))
    for _ in range(5):
        await c.tick()
    wl = c.wls["retry-a2"]
    assert (wl.state, wl.excluded_nodes) == ("pending", ["gpu-b"])
    info = c.admitter.info("retry-a2")
    assert info is not None and "none of 0 eligible node(s)" in info.message and "gpu-a (XID 79)" in info.message
    await c.on_node(node_event("node.gpu-a.uncordon", NodeUncordon(node="gpu-a", reason="validated")))
    await settle(c, lambda: "retry-a2" not in c.wls)
    assert [(p.node, p.phase) for p in wl.pods] == [("gpu-a", "Succeeded")]


async def test_a_cordon_survives_a_restart_of_the_local_cluster(pool: tuple[Bus, LocalCluster], tmp_path: Path) -> None:
    bus, c = pool
    await c.on_node(node_event("node.gpu-b.cordon", NodeCordon(node="gpu-b", reason="ECC")))
    again = LocalCluster(bus, data_dir=tmp_path / "again", node="machine", capacity={"cpu": 4.0, "memory": 8e9},
                         gpu_count=0)
    await again.load()
    assert again.admitter.cordoned == {"gpu-b": "ECC"}
    await again.kubelet.close()


def test_a_pool_node_named_twice_is_refused_naming_the_field() -> None:
    text = POOL_PLATFORM.replace("name: gpu-b", "name: gpu-a")
    with pytest.raises(ConfigError) as err:
        load_platform(text)
    assert "local.nodes" in str(err.value) and "gpu-a" in str(err.value)
