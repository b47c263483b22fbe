"""Replay at the bus's speed (issue 30, item 3): events a second read back from RUNS by the client and by
`tau events --output json`.

A private nats-server (no authentication, a temporary store, as the tests' fixture) gets ``--events`` run events
(exec.running, admission.queued and cancel.requested payloads in turn, with the headers every service writes:
the CloudEvents attributes, ``traceparent``-less, ``ce-tauuser``), published through ``Bus.emit``. Then, ``--rounds``
times each, alternating:

- *client*: ``Client.events()`` (the client's replay stream, one Event at a time, as any script reads it) over
  the whole history, in this process;
- *cli*: ``tau events --output json`` as a subprocess (its interpreter start and connection included), its
  standard output counted line by line.

Each prints events/s on the wall clock, per CPU second of the reading process (the steadier figure on a shared
machine) and per CPU second nats-server spent serving it (the bus's own speed, from /proc), beside the 50k/s
target, with the load average. Exits 1 when the best round of either misses the
target on the wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from taugrid.bus import Bus, connect
from taugrid.bus.bootstrap import bootstrap
from taugrid.client import open_client
from taugrid.core.contracts import AdmissionQueued, CancelRequested, ExecRunning
from taugrid.stack import natsserver

TARGET = 50_000.0  # events a second (issue 30)
KINDS = [
    ("exec.running", ExecRunning(node="local", pod="bench-0", pid=4242, environment={"python": "3.12"})),
    ("admission.queued", AdmissionQueued(reason="QuotaReserved", message="waiting for quota", cluster_queue="cq")),
    ("cancel.requested", CancelRequested(reason="bench")),
]


async def store(bus: Bus, count: int) -> None:
    for start in range(0, count, 1000):
        await asyncio.gather(*(
            bus.emit(workspace="bench", run_id=f"replay-{i // len(KINDS)}", attempt=1,
                     event_type=KINDS[i % len(KINDS)][0], payload=KINDS[i % len(KINDS)][1], user="alice")
            for i in range(start, min(count, start + 1000))))


async def client_round(url: str) -> tuple[int, float, float]:
    client = await open_client(url)
    try:
        wall, cpu, count = time.perf_counter(), time.process_time(), 0
        async for _ in client.events():
            count += 1
        return count, time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await client.close()


def cli_round(url: str) -> tuple[int, float, float]:
    tau = shutil.which("tau", path=str(Path(sys.executable).parent)) or "tau"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    proc = subprocess.Popen([tau, "events", "--output", "json"], stdout=subprocess.PIPE,
                            env={**os.environ, "TAU_NATS_URL": url})
    assert proc.stdout is not None
    count = sum(chunk.count(b"\n") for chunk in iter(lambda: proc.stdout.read(1 << 20), b""))  # type: ignore[union-attr]
    if proc.wait() != 0:
        raise SystemExit(f"tau events exited {proc.returncode}")
    spent = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return count, spent, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def server_cpu(pid: int) -> float:
    """CPU seconds nats-server has used so far (Linux's /proc; 0 elsewhere): what serving a replay costs the bus."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(label: str, count: int, wall: float, cpu: float, served: float) -> float:
    rate = count / wall
    bus = f", {count / served:>9,.0f}/s per CPU second of nats-server" if served > 0 else ""
    print(f"  {label:6} {count:>8,} events in {wall:6.2f} s: {rate:>9,.0f}/s wall (target {TARGET:,.0f}: "
          f"{'met' if rate >= TARGET else 'missed'}), {count / cpu:>9,.0f}/s per CPU second of the reader{bus}",
          flush=True)
    return rate


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000, help="run events stored, then replayed")
    ap.add_argument("--rounds", type=int, default=3, help="replays of each kind, alternating")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tau-replay-bench-"))
    proc, port = natsserver.start(root / "nats", log_file=root / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    try:
        bus = await connect(url, name="bench-replay")
        await bootstrap(bus)
        began = time.perf_counter()
        await store(bus, args.events)
        await bus.close()
        print(f"stored {args.events:,} run events in {time.perf_counter() - began:.1f} s; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
        best = {"client": 0.0, "cli": 0.0}
        for n in range(args.rounds):
            print(f"round {n + 1} (load {os.getloadavg()[0]:.2f})")
            for label in ("client", "cli"):
                served = server_cpu(proc.pid)
                count, wall, cpu = await client_round(url) if label == "client" else \
                    await asyncio.to_thread(cli_round, url)
                if count != args.events:
                    print(f"  {label}: read {count} events of {args.events} stored")
                    return 1
                best[label] = max(best[label], report(label, count, wall, cpu, server_cpu(proc.pid) - served))
        print(f"best: client {best['client']:,.0f}/s, tau events --output json {best['cli']:,.0f}/s "
              f"(target {TARGET:,.0f}/s); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0 if min(best.values()) >= TARGET else 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
