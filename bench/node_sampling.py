"""What node health sampling costs with no runs: the embedded stack on Kueue's TAS platform (640 simulated nodes,
``kueue_tas_scenario.platform_yaml``), idle, measured over a window after a warm-up.

Printed: NODES messages stored a second (the node agents' samples and heartbeats), and CPU a second of the node
agent, the health monitor and nats-server, the processes whose work here is only health sampling. The warm-up
(default 70 s) outlasts the default heartbeat interval, so every node's first sample and its first, phased,
heartbeat (``health.change``) are behind it and the window sees the steady state. A run of the TAS scenario
spends about this much a second on sampling for as long as it lasts (its wall), whatever its runs do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from kueue_tas_scenario import node_messages, platform_yaml  # bench/ is this script's directory, first on sys.path
from pipeline import cpu_seconds, simulated_stack, stack_up

WATCHED = ("node_agent", "health_monitor", "nats-server")


def share(cpu: dict[str, float], name: str) -> float:
    return sum(v for k, v in cpu.items() if k == name or k.startswith(f"{name}["))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=float, default=70.0, help="seconds before the window opens")
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs, the bus's store)")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-node-sampling-")
    creds = data / "creds" / "bootstrap.nk"
    with stack_up(data, env, tau, platform_yaml(), keep=args.keep) as url:
        time.sleep(args.warmup)
        cpu0, msgs0, t0 = cpu_seconds(data), asyncio.run(node_messages(url, Path(creds))), time.monotonic()
        time.sleep(args.window)
        cpu1, msgs1, t1 = cpu_seconds(data), asyncio.run(node_messages(url, Path(creds))), time.monotonic()
    span = t1 - t0
    cpu = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
    print(f"idle stack, 640 simulated nodes, {span:.1f} s window after {args.warmup:g} s")
    print(f"NODES: {msgs1 - msgs0} message(s) stored, {(msgs1 - msgs0) / span:.1f} a second")
    print("CPU, ms a second: " + ", ".join(f"{n} {1000 * share(cpu, n) / span:.1f}" for n in WATCHED)
          + f"; all processes {1000 * sum(cpu.values()) / span:.1f}")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
