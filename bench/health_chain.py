"""Time from a fault sample to the cordon taking effect: a node agent publishes a sample carrying XID 79, the health
monitor folds it in and cordons, and the local cluster marks that node unschedulable (no new admissions there).

Runs the real handlers in-process on a private nats-server (one connection per service, as in production): the
health monitor's consumer, the local cluster's node consumer over a declared pool of ``--nodes`` nodes, and one
node agent per node. Each trial faults a fresh node (so no uncordon cycle is in between) and measures
``sample.time`` → the moment the local cluster applied the cordon, and → the cordon's storage in NODES.

Usage: python bench/health_chain.py [--nodes 40]. Prints one JSON line; exits 1 when the p99 exceeds 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from taugrid.bus import connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.replay import replay
from taugrid.health.agent import NodeAgent, publish_sample
from taugrid.health.monitor import HealthMonitor
from taugrid.health.probe import DeclaredProbe
from taugrid.health.rules import Policy
from taugrid.local.controller import LocalCluster
from taugrid.stack import natsserver

TARGET_S = 1.0
PLATFORM = """
resource_flavors: [{name: default}]
cluster_queues:
  - name: lab
    resource_groups:
      - covered_resources: [cpu, memory, nvidia.com/gpu]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal_quota: "64"}
              - {name: memory, nominal_quota: 64Gi}
              - {name: nvidia.com/gpu, nominal_quota: "1000"}
local_queues: [{name: default, namespace: default, cluster_queue: lab}]
local:
  nodes:
NODES"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def bench(nodes: int, root: Path) -> dict[str, object]:
    proc, port = natsserver.start(root / "nats", log_file=root / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    try:
        admin = await connect(url, name="bootstrap")
        await bootstrap(admin)
        names = [f"n{i:03d}" for i in range(nodes)]
        await platformstore.put_text(admin, PLATFORM.replace(
            "NODES", "".join(f"    - {{name: {n}, gpus: 1}}\n" for n in names)))
        monitor_bus = await connect(url, name="health-monitor")
        cluster_bus = await connect(url, name="local-cluster")
        agent_bus = await connect(url, name="node-agent")
        cluster = LocalCluster(cluster_bus, data_dir=root / "data", node="machine",
                               capacity={"cpu": 4.0, "memory": float(8 << 30)}, gpu_count=0)
        await cluster.load()
        applied: dict[str, float] = {}

        async def on_node(ev: Event) -> None:
            await cluster.on_node(ev)
            node = str(ev.as_dict().get("node"))
            if node in cluster.admitter.cordoned:
                applied.setdefault(node, time.time())

        monitor = HealthMonitor(monitor_bus, policy=Policy(max_cordoned=10_000, max_cordoned_fraction=1.0))
        loops = [ConsumerLoop(monitor_bus, stream="NODES", durable="health-monitor", handler=monitor.handle,
                              fetch_timeout=0.5),
                 ConsumerLoop(cluster_bus, stream="NODES", durable="local-cluster-nodes", handler=on_node,
                              fetch_timeout=0.5)]
        tasks = [asyncio.create_task(loop.run()) for loop in loops]
        probes = {n: DeclaredProbe(1) for n in names}
        agents = {n: NodeAgent(agent_bus, probes[n], n) for n in names}
        for n in names:  # a healthy first sample each, so the monitor knows the node and its GPU
            await agents[n].tick()
        await asyncio.sleep(1.0)
        to_applied: list[float] = []
        for n in names:
            probes[n].inject_xid(0, 79)
            sample = await agents[n].sample()
            assert sample is not None
            await publish_sample(agent_bus, sample)
            deadline = time.monotonic() + 10
            while n not in applied and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
            if n not in applied:
                raise SystemExit(f"node {n}: no cordon within 10 s")
            to_applied.append(applied[n] - sample.time)
        stored = {m.subject.split(".")[1]: m.metadata.timestamp.timestamp()
                  for m in await replay(admin, stream="NODES", subject="node.*.cordon")}
        samples = {m.subject.split(".")[1]: json.loads(m.data)["time"]
                   for m in await replay(admin, stream="NODES", subject="node.*.sample")}
        to_stored = [stored[n] - samples[n] for n in names if n in stored]
        for loop in loops:
            loop.stopping.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cluster.kubelet.close()
        for b in (admin, monitor_bus, cluster_bus, agent_bus):
            await b.close()
        return {"nodes": nodes,
                "sample_to_cordon_applied_ms": {"p50": round(pct(to_applied, 0.5) * 1000, 1),
                                                "p99": round(pct(to_applied, 0.99) * 1000, 1),
                                                "mean": round(statistics.fmean(to_applied) * 1000, 1)},
                "sample_to_cordon_stored_ms": {"p50": round(pct(to_stored, 0.5) * 1000, 1),
                                               "p99": round(pct(to_stored, 0.99) * 1000, 1)},
                "target_p99_ms": TARGET_S * 1000}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=40, help="declared nodes, one fault trial each (default 40)")
    args = ap.parse_args()
    logging.getLogger("taugrid").setLevel(logging.ERROR)  # every trial cordons a node: warnings by design
    with tempfile.TemporaryDirectory(prefix="tau-health-bench-") as tmp:
        report = asyncio.run(bench(args.nodes, Path(tmp)))
    print(json.dumps(report))
    p99 = report["sample_to_cordon_applied_ms"]["p99"]  # type: ignore[index]
    if p99 > TARGET_S * 1000:
        print(f"MISS: fault sample → cordon p99 {p99} ms > {TARGET_S * 1000:.0f} ms", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
