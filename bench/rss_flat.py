"""Resident memory per service over repeated bursts: does it stay flat (issue 11, "bounded memory")?

One embedded stack (simulated pods, the platform of bench/pipeline.py); ``--rounds`` bursts of ``--burst`` runs
one after the other, each waited for until every run ended and its evidence settled; the resident memory of each
service process is printed after each round. The first round warms every code path up (imports on first use,
the allocator's high-water mark); what a long run adds is the growth from the first round to the last.

Exits 1 when a service is above ``--limit`` MB (80, issue 11's target) after any round, when it grew by more
than ``--growth`` MB from the first round to the last, or when a run did not end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
from pipeline import (  # bench/ is this script's directory, first on sys.path
    PLATFORM,
    RUN,
    Watch,
    rss,
    simulated_stack,
    stack_up,
)

from taugrid.client import open_client
from taugrid.core.ids import new_submission_id


async def rounds(url: str, data: Path, args: argparse.Namespace) -> tuple[list[dict[str, float]], int, int]:
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    client = await open_client(url, creds=state["user_creds"])
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    watch = Watch()
    await watch.start(admin.bus.nc)
    text = RUN.format(name="flat")
    seen: list[dict[str, float]] = [rss(data)]
    started = ended = 0
    for _ in range(args.rounds):
        runs = await asyncio.gather(*(client.submit_text(text, workspace="bench", submission_id=new_submission_id(),
                                                         name="flat") for _ in range(args.burst)))
        started += len(runs)
        await watch.until(lambda rs=runs: all(r in watch.ended for r in rs), timeout=args.timeout)
        ended += sum(1 for r in runs if r in watch.ended)
        await asyncio.sleep(3.0)  # evidence sealing and projections settle
        seen.append(rss(data))
    await client.close()
    await admin.close()
    return seen, started, ended


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--burst", type=int, default=500, help="runs per round, submitted at once")
    ap.add_argument("--rounds", type=int, default=4, help="bursts one after the other")
    ap.add_argument("--limit", type=float, default=80.0, help="MB no service may exceed")
    ap.add_argument("--growth", type=float, default=5.0, help="MB a service may grow from the first round to the last")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for one round to end")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-rss-")
    with stack_up(data, env, tau, PLATFORM, keep=False) as url:
        seen, started, ended = asyncio.run(rounds(url, data, args))

    print(f"\nresident memory (MB) at start and after each of {args.rounds} rounds of {args.burst} runs "
          f"({ended}/{started} runs ended); simulated pods")
    ok = ended == started
    for name in sorted(seen[-1]):
        if name == "nats-server":
            continue
        row: list[Any] = [seen[i].get(name, float("nan")) for i in range(len(seen))]
        grew = row[-1] - row[1]
        bad = max(row) > args.limit or grew > args.growth
        ok &= not bad
        print(f"  {name:<24}" + " ".join(f"{v:7.1f}" for v in row) + f"   +{grew:5.1f} since round 1"
              + ("  MISSED" if bad else ""))
    if "nats-server" in seen[-1]:
        print(f"  {'nats-server':<24}" + " ".join(f"{s.get('nats-server', float('nan')):7.1f}" for s in seen)
              + "   (not a taugrid service)")
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} on {os.cpu_count()} cores")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
