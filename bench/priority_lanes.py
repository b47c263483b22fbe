"""Priority lanes before the admitter: is a high-priority run stuck behind a low-priority sweep?

Time to admission counts from submission, so a high-priority run submitted just after a sweep must not wait
for the sweep to be accepted (submitter), approved (policy) and rendered (renderer) first. On the embedded stack
(simulated pods, one ClusterQueue with room for every run) this submits ``--low`` runs of priority class
``low`` at once, then one run of class ``high``, and reports the high run's submit → admission.admitted beside
the low runs' p50 and p99. Exits 1 when the high run misses ``--target`` (default 1 s) or any run does not
finish (an unadmitted run counts with its wait until the bench gave up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from pipeline import Watch, one_queue_platform, pct, simulated_stack, stack_up  # bench/ is on sys.path

from taugrid.client import open_client
from taugrid.core.ids import new_submission_id

PLATFORM = one_queue_platform(
    "bench", priority_classes="[{name: low, value: 50}, {name: normal, value: 100}, {name: high, value: 200}]")
RUN = ("name: {name}\nentrypoint: sim.py\ncompute: {{gpus: 0, cpu_request: '1', memory_request: 1Mi}}\n"
       "policy: {{workload_priority_class: {priority}}}\nruntime: {{env: {{SIMULATED_DURATION: '0.05'}}}}\n")


async def scenario(url: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    client = await open_client(url, creds=state["user_creds"])
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    watch = Watch()
    await watch.start(admin.bus.nc)
    submitted: dict[str, float] = {}

    async def submit(name: str, priority: str) -> str:
        at = time.time()
        run_id = await client.submit_text(RUN.format(name=name, priority=priority), workspace="bench",
                                          submission_id=new_submission_id(), name=name)
        submitted[run_id] = at
        return run_id

    warm = await submit("warmup", "normal")  # services still importing on a busy machine
    await watch.until(lambda: warm in watch.ended, timeout=300)
    await asyncio.sleep(1.0)
    t0 = time.time()
    low = await asyncio.gather(*(submit("sweep", "low") for _ in range(args.low)))
    low_submitted_s = time.time() - t0
    high = await submit("urgent", "high")
    everything = [*low, high]
    await watch.until(lambda: all(r in watch.ended for r in everything), timeout=args.timeout)
    gave_up = time.time()

    def wait(run_id: str) -> float:
        return watch.admitted.get(run_id, gave_up) - submitted[run_id]

    low_waits = [wait(r) for r in low]
    out = {"low": len(low), "low_submit_s": low_submitted_s, "high_s": wait(high),
           "high_admitted": high in watch.admitted,
           "low_p50_s": pct(low_waits, 50), "low_p99_s": pct(low_waits, 99),
           "low_admitted_before_high": sum(1 for r in low if watch.admitted.get(r, gave_up)
                                           < watch.admitted.get(high, gave_up)),
           "finished": sum(1 for r in everything if r in watch.ended), "runs": len(everything)}
    await client.close()
    await admin.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--low", type=int, default=2000, help="low-priority runs submitted at once before the high one")
    ap.add_argument("--target", type=float, default=1.0, help="seconds the high run may take to be admitted")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for every run to finish")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs) afterwards")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-lanes-")
    with stack_up(data, env, tau, PLATFORM, keep=args.keep) as url:
        result = asyncio.run(scenario(url, data, args))
    ok = result["high_admitted"] and result["high_s"] <= args.target and result["finished"] == result["runs"]
    print(f"\npriority lanes: {result['low']} low-priority runs submitted at once (in {result['low_submit_s']:.1f} s), "
          f"then 1 high-priority run; simulated pods; {result['finished']}/{result['runs']} finished")
    print(f"  high run submit → admitted    {result['high_s']:8.2f} s   target ≤ {args.target:g} s  "
          f"{'ok' if ok else 'MISSED'}")
    print(f"  low runs submit → admitted    {result['low_p50_s']:8.2f} s p50, {result['low_p99_s']:.2f} s p99")
    print(f"  low runs admitted before the high one: {result['low_admitted_before_high']}/{result['low']}")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
