"""The health chain end to end on the local backend, one run: a fault injected at one node's agent (XID 79 and an
uncorrectable ECC error through the NVML stand-in, plus the kernel-log XID line) → node condition → cordon →
drain (``health.degraded`` for the run, its pod stopped with a grace period) → recovery calls it a platform
fault → retry excluding that node → the run finishes on the healthy node → repair (the stand-in's reboot) →
active re-validation → uncordon.

The real services run in-process on a private nats-server (tests/inprocess.py), each under its own name; the
pods are real processes. The test is the node agents' clock: it ticks them, so the order of what follows a
sample is the system's, and the moments samples are taken are the test's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus import Bus, platformstore
from taugrid.bus.envelope import from_message
from taugrid.bus.replay import replay
from taugrid.client.client import Client
from taugrid.core.contracts import LogChunk
from taugrid.core.errors import NotFound
from taugrid.health.agent import NodeAgent
from taugrid.health.kmsg import KmsgReader
from taugrid.health.monitor import HealthMonitor
from taugrid.health.nvml import NvmlProbe
from taugrid.health.probe import DeclaredProbe, HealthProbe
from taugrid.health.rules import Policy
from taugrid.health.wire import NodeCordon, NodeRepair, NodeValidation
from taugrid.kube.apply import KubeBackend
from taugrid.kube.backend import KubernetesBackend
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.nodes import NodeActuator
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid.local.backend import LocalBackend
from taugrid.local.controller import LocalCluster
from taugrid.render.source import RenderSettings
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from taugrid_services.health_monitor.__main__ import actuate
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.policy.handlers import Policy as PolicyService
from taugrid_services.recovery.handlers import Recovery
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.submitter.handlers import Submitter
from tests.health.test_probe import fake_nvml
from tests.inprocess import PipelineLoops, private_server, sign_as_local_user
from tests.kube.cluster import EmulatedCluster
from tests.kube.conftest import FakeKube, emulated_api
from tests.kube.test_nodes import add_node
from tests.local.test_pool import POOL_PLATFORM

SCRIPT = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM: stopping', flush=True), sys.exit(143)))\n"
    "print('attempt', os.environ['TAU_RETRY_ATTEMPT'], flush=True)\n"
    "time.sleep(120 if os.environ['TAU_RETRY_ATTEMPT'] == '1' else 0.5)\n"
)


def tau_yaml(backoff: str) -> str:
    return (f"name: chain\nentrypoint: python3\nargs: ['-c', {json.dumps(SCRIPT)}]\ncompute: {{gpus: 1}}\n"
            f"resilience: {{max_retries: 2, backoff_initial: {backoff}, backoff_max: {backoff}}}\n")


class StandInGpu:
    """One GPU behind the NVML stand-in, with what a fault and a reboot do to it."""

    def __init__(self, kmsg_path: Path) -> None:
        self.nvml = fake_nvml(count=1)
        self.events: list[tuple[int, int]] = []
        self.volatile_ecc = 0
        self.kmsg_path = kmsg_path
        nvml = self.nvml
        nvml.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: self.volatile_ecc if counter == 0 else 3

        def wait(es: Any, timeout: int) -> Any:
            if not self.events:
                raise nvml.NVMLError_Timeout("Timeout")
            dev, xid = self.events.pop(0)
            return types.SimpleNamespace(device=dev, eventType=8, eventData=xid)

        nvml.nvmlEventSetWait_v2 = wait
        self.burns: list[list[int]] = []

    def fault(self) -> None:
        self.events.append((0, 79))
        self.volatile_ecc = 2
        with self.kmsg_path.open("a") as f:  # what the driver writes to /dev/kmsg
            f.write(f"3,9001,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, "
                    "name=python3, GPU has fallen off the bus.\n")

    def reboot(self) -> tuple[bool, str]:
        self.volatile_ecc = 0
        return True, "stand-in node rebooted: volatile ECC cleared"

    def burn(self, indices: list[int]) -> tuple[bool | None, str]:
        self.burns.append(indices)
        return True, f"stand-in burn and memory check passed on GPU(s) {indices}"


@pytest.fixture
async def chain(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with running_chain(tmp_path, "local") as c:
        yield c


@pytest.fixture
async def kube_chain(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with running_chain(tmp_path, "kubernetes") as c:
        yield c


@contextlib.asynccontextmanager
async def running_chain(tmp_path: Path, backend: str, *, platform: str = POOL_PLATFORM,
                        probes: dict[str, HealthProbe] | None = None) -> AsyncIterator[dict[str, Any]]:
    """The services of the chain on a private server, with the local pool or the emulated cluster of two Nodes.
    ``platform`` and ``probes`` (node → its agent's probe) replace the two NVIDIA nodes (gpu-a's NVML stand-in,
    gpu-b's declared GPU); the local backend only."""
    async with private_server(tmp_path, name=f"chain-{backend}") as (url, bus):
        await platformstore.put_text(bus, platform.replace("output_root: /tmp", f"output_root: {tmp_path}/out"))
        await sign_as_local_user(bus)
        p = PipelineLoops(url, fetch_timeout=0.2)
        await p.connect("submitter", "run-record", "policy", "renderer", "admission-watcher", "recovery",
                        "local-cluster",
                        "health-monitor", "node-agent", "kube-bridge")
        svc = p.svc
        sub = Submitter(svc["submitter"])
        p.consume("RUNS", "submitter", sub.on_requested, "submitter")
        p.record()
        p.consume("RUNS", "policy", PolicyService(svc["policy"]).on_accepted, "policy")
        p.consume("K8S", "admission-watcher", AdmissionWatcher(svc["admission-watcher"]).on_event,
                  "admission-watcher")
        p.consume("RUNS", "recovery", Recovery(svc["recovery"], settle_s=10).on_event, "recovery")
        monitor = HealthMonitor(svc["health-monitor"], policy=Policy(clean_samples_to_release=2, repair_retry_s=30))
        health = p.consume("NODES", "health-monitor", monitor.handle, "health-monitor")
        kmsg_path = tmp_path / "kmsg"
        kmsg_path.touch()
        gpu = StandInGpu(kmsg_path)
        kmsg = KmsgReader(os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK))
        probe_a = NvmlProbe(nvml=gpu.nvml, kmsg=kmsg, burn=gpu.burn, reboot=gpu.reboot)
        agents = {name: NodeAgent(svc["node-agent"], probe, name) for name, probe in (
            probes or {"gpu-a": probe_a, "gpu-b": DeclaredProbe(1, 16000)}).items()}

        async def tick(node: str) -> None:
            """One sample of ``node``, handled by the health monitor before it returns."""
            before = health.handled
            await agents[node].tick()
            deadline = time.monotonic() + 10
            while health.handled == before and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        async with contextlib.AsyncExitStack() as stack:
            # On Kubernetes the retry deletes the failed attempt's Job (its pod goes with it) while the actuator
            # drains the node: a backoff longer than the actuator's lag makes the eviction the one that stops it.
            out: dict[str, Any] = {"bus": bus, "client": Client(bus), "gpu": gpu, "tick": tick, "agents": agents,
                                   "backoff": "100ms" if backend == "local" else "3s"}
            if backend == "local":
                cluster = LocalCluster(svc["local-cluster"], data_dir=tmp_path, node="machine",
                                       capacity={"cpu": 4.0, "memory": float(8 << 30)}, gpu_count=0, drain_grace_s=5)
                await cluster.load()
                stack.push_async_callback(cluster.kubelet.close)
                p.consume("RUNS", "renderer", Renderer(svc["renderer"], LocalBackend(svc["renderer"])).on_event,
                          "renderer")
                p.consume("BACKEND", "local-cluster", cluster.on_backend, "local-cluster")
                p.consume("NODES", "local-cluster-nodes", cluster.on_node, "local-cluster")
                p.every(0.1, cluster.tick)

                async def lines(run_id: str, attempt: int) -> list[str]:
                    return await _log_lines(bus, run_id, attempt)
            else:
                fake = FakeKube()
                api_url, api_client = await stack.enter_async_context(emulated_api(fake))
                for name in ("gpu-a", "gpu-b"):
                    add_node(fake, name)
                p.consume("RUNS", "renderer", Renderer(svc["renderer"], KubernetesBackend(KubeBackend(api_client),
                                                                                          "kc"),
                                                       settings=RenderSettings(nats_url=url)).on_event, "renderer")
                actuator = NodeActuator(KubeApi(api_client, retry_cap_s=0.01))
                p.consume("NODES", "health-actuator", actuate(svc["health-monitor"], actuator, grace_s=5),
                          "health-monitor")
                bridge = Bridge(svc["kube-bridge"], KubeApi(api_client), cluster="kc", holder="chain",
                                resources=[(resource_for("Workload"), None), (resource_for("Job"), MANAGED_SELECTOR),
                                           (resource_for("Pod"), MANAGED_SELECTOR)],
                                lease_ttl_s=3.0, checkpoint_every_s=0.2, backoff_max_s=0.3)
                p.tasks.append(asyncio.create_task(bridge.run(p.stopping)))
                emulated = EmulatedCluster(fake, api_url, tmp_path / "cluster", bus=bus, nodes=["gpu-a", "gpu-b"])
                await emulated.start()
                stack.push_async_callback(emulated.stop)
                out["fake"] = fake

                async def lines(run_id: str, attempt: int) -> list[str]:
                    """The pod's own log file on the emulated node (a deleted pod's stream is not shipped)."""
                    got: list[str] = []
                    for name in sorted(emulated.kubelet.handles):
                        if name.startswith(f"{run_id}-a{attempt}-"):
                            got += [ln.text for ln in emulated.kubelet.read_log(name, "main", final=True)[0]]
                    return got

            async def printed(run_id: str, attempt: int, text: str) -> bool:
                return text in await lines(run_id, attempt)

            out["lines"], out["printed"] = lines, printed
            try:
                yield out
            finally:
                await p.stop()
        await p.close()


async def wait_for(check: Callable[[], Any], what: str, timeout: float = 40) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def history(bus: Bus, run_id: str, node: str) -> list[tuple[float, str, dict[str, Any], int]]:
    """The run's events (as HISTORY and AUDIT keep them: RUNS lets them go once read, and AUDIT alone keeps the
    request, the end and the seal) and the node's decisions, in the order the streams stored them."""
    out = []
    for stream, subject in (("HISTORY", f"h.*.{run_id}"), ("AUDIT", f"a.*.{run_id}"), ("NODES", f"node.{node}.>")):
        for m in await replay(bus, stream=stream, subject=subject):
            ev = from_message(m.subject, m.headers, m.data)  # a HISTORY or AUDIT copy reads with its RUNS subject
            kind = ev.nats_subject.split(".", 3)[3] if stream != "NODES" else "node." + m.subject.split(".", 2)[2]
            if kind == "node.sample":
                continue
            out.append((m.metadata.timestamp.timestamp(), kind, msgspec.json.decode(m.data), ev.attempt))
    return sorted(out, key=lambda e: e[0])


async def test_a_gpu_fault_moves_the_run_to_a_healthy_node_and_the_node_back_after_repair(
        chain: dict[str, Any]) -> None:
    await the_chain(chain)


async def test_the_same_chain_on_the_emulated_kubernetes_cluster(kube_chain: dict[str, Any]) -> None:
    """Cordon, taint and drain by eviction through the health-actuator on Node objects over HTTP; the emulated
    scheduler keeps new pods off the cordoned node; the evicted pod stops within the eviction's grace period."""
    await the_chain(kube_chain)
    fake = kube_chain["fake"]
    assert [e["name"].split("-a1-")[0] for e in fake.evictions] == [kube_chain["run_id"]]

    async def uncordoned() -> bool:  # the actuator acts on the uncordon decision the chain ended with
        spec = fake.objects[(("", "v1", "nodes"), None, "gpu-a")]["spec"]
        return not spec.get("unschedulable") and not any(t["key"] == "taugrid.io/unhealthy" for t in spec["taints"])

    await wait_for(uncordoned, "the actuator to uncordon Node gpu-a", timeout=20)


async def recorded_node(client: Client, run_id: str) -> str:
    """The node a running run's record names ("" before): what the monitor reads to tell a run on a faulty node
    ``health.degraded``. Written up to run_record's ``LINGER_S`` after ``exec.running``, so a test that faults the
    node on seeing the event alone could overtake the record."""
    try:
        rec = await client.status(run_id)
    except NotFound:  # no record yet
        return ""
    return rec.node or "" if rec.state == "running" else ""


async def the_chain(chain: dict[str, Any]) -> None:
    bus, client, gpu, tick = chain["bus"], chain["client"], chain["gpu"], chain["tick"]
    await tick("gpu-a")
    await tick("gpu-b")
    run_id = await client.submit_text(tau_yaml(chain["backoff"]), name="chain")
    chain["run_id"] = run_id

    async def running_on_a() -> bool:
        return await recorded_node(client, run_id) == "gpu-a"

    await wait_for(running_on_a, "attempt 1 running on gpu-a")
    await wait_for(lambda: chain["printed"](run_id, 1, "attempt 1"), "attempt 1 printing")
    gpu.fault()
    await tick("gpu-a")  # XID 79 (NVML event and kernel log) + uncorrectable ECC in one sample

    async def finished() -> str:
        rec = await client.settled(run_id)
        return rec.state if rec.state in ("succeeded", "failed") else ""

    assert await wait_for(finished, "the run to finish") == "succeeded"
    for _ in range(8):  # the node's agent samples again: repair, clean samples, re-validation, uncordon
        await tick("gpu-a")
        if any(k == "node.uncordon" for _, k, _, _ in await history(bus, run_id, "gpu-a")):
            break
    events = await history(bus, run_id, "gpu-a")
    kinds = [k for _, k, _, _ in events]

    def first(kind: str, pred: Callable[[dict[str, Any], int], bool] = lambda d, a: True) -> int:
        found = [i for i, (_, k, d, a) in enumerate(events) if k == kind and pred(d, a)]
        assert found, f"no {kind} in the history: {[(k, a) for _, k, _, a in events]}"
        return found[0]

    fault = first("node.condition.GpuXidError", lambda d, a: d["status"] == "True")
    ecc = first("node.condition.GpuEccUncorrectable", lambda d, a: d["status"] == "True")
    cordon = first("node.cordon")
    drained = first("health.degraded", lambda d, a: a == 1)  # the drain tells the run; its pod is being stopped
    retry = first("recovery.retrying")
    rerun = first("exec.running", lambda d, a: a == 2)
    success = first("exec.succeeded")
    repaired = first("node.repair")
    validated = first("node.validation")
    uncordon = first("node.uncordon")
    assert first("exec.running", lambda d, a: a == 1) < fault < cordon < drained < retry < rerun < success, kinds
    assert success < repaired < validated < uncordon, kinds
    assert ecc < cordon
    xid = events[fault][2]
    assert (xid["reason"], xid["gpu"]) == ("Xid79", 0)
    cordoned = msgspec.convert(events[cordon][2], NodeCordon)
    assert cordoned.drain and cordoned.conditions == ["GpuEccUncorrectable", "GpuXidError"]
    assert events[drained][2]["node"] == "gpu-a"
    retrying = events[retry][2]
    assert (retrying["classification"], retrying["exclude_nodes"], retrying["attempt"]) == ("gpu_fault", ["gpu-a"], 2)
    assert events[rerun][2]["node"] == "gpu-b"
    assert kinds.count("recovery.retrying") == 1 and "recovery.gave_up" not in kinds
    repair = msgspec.convert(events[repaired][2], NodeRepair)
    assert (repair.step, repair.ok) == ("node-reboot", True)
    validation = msgspec.convert(events[validated][2], NodeValidation)
    assert validation.ok and "active check: stand-in burn and memory check passed on GPU(s) [0]" in validation.detail
    assert gpu.burns == [[0]]
    assert await chain["lines"](run_id, 1) == ["attempt 1", "SIGTERM: stopping"]  # it had its grace period
    assert await chain["lines"](run_id, 2) == ["attempt 2"]


async def _log_lines(bus: Bus, run_id: str, attempt: int) -> list[str]:
    lines: list[str] = []
    for m in await replay(bus, stream="LOGS", subject=f"log.*.{run_id}.{attempt}"):
        lines += msgspec.json.decode(m.data, type=LogChunk).lines
    return lines


