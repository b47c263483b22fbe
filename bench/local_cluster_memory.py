"""The local cluster's resident memory through Kueue's large-scale shape, in-process (issue 27: no service above
80 MB after Kueue's large-scale configuration).

One ``LocalCluster`` with simulated pods, as the ``local-cluster`` service runs it (its admission loop woken by
applies and freed capacity, housekeeping every 0.2 s), against a private nats-server and the large-scale
platform (1,000 ClusterQueues, ``kueue_large_scenario.LARGE``), fed the renderer's Job for each run
(``render`` of a run as the policy resolves it, one template per class; each run's names written into its JSON and
decoded as the service decodes a ``backend.local.apply``). Runs are applied in Kueue's cadence order (every
queue's classes on their own clocks) at ``--rate`` runs a second (0: as fast as ``--in-flight`` concurrent
applies go, so a backlog waits in the cluster, as when submissions outran admission), and end after their
simulated durations. Prints, every ``--every`` seconds and once every run has ended: resident memory,
workloads held (waiting), pymalloc's arenas and the bytes in use in them (``sys._debugmallocstats``).
``--trace`` runs under tracemalloc (slower; pymalloc's statistics then read 0) and prints the largest allocation
sites at the peak and at the end, and where the objects that hold pymalloc's arenas at the end were allocated; with
``--burst``, also what the waiting backlog holds a run, by allocation site, before any is admitted (the JSON of a
Job and its Workload, over 512 bytes, is the C heap's; the rest pymalloc's). No limit is judged: the stack's
``kueue_large_scenario.py`` judges the service.

Usage: python bench/local_cluster_memory.py [--runs 20000] [--rate 0 | --burst] [--in-flight 64] [--trace]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import psutil
from kueue_large_scenario import LARGE  # bench/ is this script's directory, first on sys.path
from kueue_scenario import platform_yaml

from taugrid.bus import connect, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.core import heap
from taugrid.core.contracts import BackendApply, ResolvedRun, Resources
from taugrid.local.controller import LocalCluster
from taugrid.local.machine import inventory
from taugrid.render import TRACEPARENT_ANNOTATION, render, with_annotation
from taugrid.settings import Settings
from taugrid.stack import natsserver

RUN_HEX = "0123456789abcdef"  # a template run id's digest, replaced by each run's
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def template(cls: str) -> bytes:
    """A ``backend.local.apply`` for one run of ``cls`` on queue 0-0 as JSON, as the renderer sends it."""
    _, units, secs, prio, _ = LARGE.classes[cls]
    run = ResolvedRun(run_id=f"{cls}-{RUN_HEX}", submission_id="18f0c2a9b1d4e5f6a7b8", workspace="ws-0-0",
                      namespace="default", name=cls, local_queue="lq-0-0", cluster_queue="cq-0-0",
                      priority_class=prio, priority=int(prio[1:]), resources=Resources(cpu=units, memory=1 << 20),
                      env={"SIMULATED_DURATION": str(secs)}, config_hash="sha256:0c1d2e3f",
                      source_digest="sha256:a1b2c3d4", source_object="sources/ws-0-0/a1b2c3d4.tar.gz",
                      command=["python3", "sim.py"], entrypoint="sim.py")
    manifests = with_annotation(render(run, attempt=1), TRACEPARENT_ANNOTATION, f"00-{TRACE_ID}-b7ad6b7169203331-01")
    return msgspec.json.encode(BackendApply(run_id=run.run_id, workspace=run.workspace, attempt=1,
                                            manifests=manifests, source_object=run.source_object))


def arrivals(runs: int) -> list[tuple[str, int, int]]:
    """(class, cohort, queue) of ``runs`` runs in Kueue's cadence order: each class of each queue on its own clock,
    the whole scenario's counts cut to ``runs`` in that order."""
    timed = []
    for cls, (count, _, _, _, interval) in LARGE.classes.items():
        for c, q in LARGE.queues:
            timed += [(i * interval, cls, c, q) for i in range(count)]
    timed.sort()
    return [(cls, c, q) for _, cls, c, q in timed[:runs]]


def malloc_stats() -> dict[str, int]:
    """pymalloc's arenas and bytes from ``sys._debugmallocstats`` (it writes to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    keys = {"# arenas allocated current": "arenas", "# arenas highwater mark": "arenas_peak",
            "# bytes in allocated blocks": "in_use", "# bytes in available blocks": "free_blocks",
            "unused pools": "unused_pools"}
    got: dict[str, int] = {}
    for line in text.splitlines():
        for key, name in keys.items():
            if line.startswith(key) or (name == "unused_pools" and key in line):
                got[name] = int(line.rsplit("=", 1)[1].replace(",", "").strip().split()[0])
    return got


def probe(cluster: LocalCluster, label: str) -> dict[str, Any]:
    stats = malloc_stats()
    waiting = sum(1 for w in cluster.wls.values() if w.state == "pending")
    decoded = sum(1 for w in cluster.wls.values() if w.decoded)  # Job, Workload or a pod held as dicts
    row = {"rss": psutil.Process().memory_info().rss / 2**20, "held": len(cluster.wls), "waiting": waiting,
           "finished": len(cluster.finished), "decoded": decoded, **stats}
    print(f"{label:>12}  rss {row['rss']:6.1f} MB  held {row['held']:6d}  waiting {waiting:6d}  finished "
          f"{row['finished']:6d}  decoded {decoded:5d}  arenas {stats.get('arenas', 0):4d} "
          f"(peak {stats.get('arenas_peak', 0):4d})  in use {stats.get('in_use', 0) / 2**20:6.1f} MB", flush=True)
    return row


POOL = 16 * 1024  # pymalloc's pool (CPython 3.10+ on 64-bit: 16 KiB pools in 1 MiB arenas)


def _pool_of(addr: int) -> tuple[int, int, int] | None:
    """(arena index, blocks in use, block size) from the header of the pymalloc pool holding ``addr``: ``ref.count``
    at offset 0, ``arenaindex`` and ``szidx`` at 32 and 36 (``Objects/obmalloc.c``, ``struct pool_header``)."""
    pool = addr & ~(POOL - 1)
    count = ctypes.c_uint.from_address(pool).value
    arena, szidx = ctypes.c_uint.from_address(pool + 32).value, ctypes.c_uint.from_address(pool + 36).value
    if szidx >= 32 or not 0 < count <= POOL // ((szidx + 1) * 16) or arena > 1 << 16:
        return None
    return arena, count, (szidx + 1) * 16


def _site(tb: tracemalloc.Traceback | None) -> str:
    """The newest frames of an allocation's traceback that are not the event loop's."""
    if tb is None:
        return "?"
    frames = [f for f in reversed(list(tb)) if "/asyncio/" not in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[:4]) or "asyncio"


def survivors(top: int, *, referrers: bool = False) -> None:
    """Where the objects that keep pymalloc's arenas were allocated. Every live small object (gc-tracked ones and
    what they refer to) is located in its arena by its pool's header; an arena whose blocks in use fill less
    than a quarter of it is held for them alone: their types and allocation sites (tracemalloc) are printed."""
    gc.collect()
    seen: dict[int, Any] = {}
    for o in gc.get_objects():
        seen[id(o)] = o
        for r in gc.get_referents(o):
            seen.setdefault(id(r), r)
    arenas: dict[int, list[Any]] = {}
    pools: dict[int, tuple[int, int, int]] = {}
    for addr, o in seen.items():
        if sys.getsizeof(o) + 32 > 512:
            continue
        got = _pool_of(addr)
        if got is None:
            continue
        pools[addr & ~(POOL - 1)] = got
        arenas.setdefault(got[0], []).append(o)
    used: Counter[int] = Counter()
    for arena, count, size in pools.values():
        used[arena] += count * size
    sparse = [a for a in arenas if used[a] < 256 * 1024]
    print(f"live small objects found in {len(arenas)} arenas; {len(sparse)} arenas less than a quarter in use "
          f"({sum(used[a] for a in sparse) / 2**20:.1f} MB in use in them, {sum(len(arenas[a]) for a in sparse)} "
          f"objects found there)")
    sites: Counter[str] = Counter()
    types: Counter[str] = Counter()
    for a in sparse:
        for o in arenas[a]:
            types[type(o).__name__] += 1
            sites[_site(tracemalloc.get_object_traceback(o))] += 1
    print("  their types: " + ", ".join(f"{t} {n}" for t, n in types.most_common(12)))
    for site, n in sites.most_common(top):
        print(f"  {n:7d}  {site}")
    if referrers:  # what holds them (slow: a referrer search per object)
        held: Counter[str] = Counter()
        samples: dict[str, str] = {}
        for a in sparse:
            for o in arenas[a]:
                if type(o).__name__ in ("code", "function", "type", "module", "cell"):
                    continue
                refs = [r for r in gc.get_referrers(o)
                        if r is not arenas[a] and r is not seen and type(r).__name__ != "frame"]
                kind = ",".join(sorted({type(r).__name__ + (f"[{len(r)}]" if isinstance(r, dict | list | set) else "")
                                        for r in refs}))[:80]
                key = f"{type(o).__name__} <- {kind}"
                held[key] += 1
                samples.setdefault(key, repr(o)[:100])
        for key, n in held.most_common(top):
            print(f"  {n:7d}  {key}   e.g. {samples[key]}")


def top_sites(label: str, top: int) -> None:
    snap = tracemalloc.take_snapshot()
    stats = snap.statistics("lineno")
    print(f"{label}: traced {sum(s.size for s in stats) / 2**20:.1f} MB")
    for s in stats[:top]:
        print(f"  {s.size / 2**20:7.2f} MB {s.count:8d}  {s.traceback[0].filename.split('/taugrid/')[-1]}:"
              f"{s.traceback[0].lineno}")


def release(cluster: LocalCluster) -> None:
    """What holds the arenas at the end: drop what survives a run, one part after another, and count the arenas
    pymalloc then still holds (an arena goes back once every block in it is free)."""
    cluster.finished.clear()
    gc.collect()
    probe(cluster, "-finished")
    engine = cluster.admitter.engine
    assert engine is not None
    for q in engine.queues.values():
        q._popped, q.head_epochs, q.parked, q.parked_on_nodes = None, (0, 0), [], []
        q.memos, q.memo_epochs = {}, None
    del engine, q
    gc.collect()
    probe(cluster, "-q.churn")
    cluster.admitter.engine = None
    gc.collect()
    probe(cluster, "-engine")
    cluster.admitter.requests = {}
    cluster.platform = None
    cluster.platforms = None  # type: ignore[assignment]
    cluster.admitter.pool = []
    cluster.lq, cluster.priorities = {}, {}
    gc.collect()
    probe(cluster, "-platform")
    survivors(25, referrers=True)


async def drive(args: argparse.Namespace, url: str, data: Path) -> None:
    bus = await connect(url, name="bootstrap")
    await bootstrap(bus)
    await platformstore.put_text(bus, platform_yaml(LARGE))
    await bus.close()
    own = await connect(url, name="local-cluster")
    node, capacity, gpus, gpu_mem, gpu_resource = inventory()
    cluster = LocalCluster(own, data_dir=data, node=node, capacity=capacity, gpu_count=0,
                           given=Settings.from_env({"TAU_LOCAL_SIMULATE": "on", "TAU_DATA_DIR": str(data)}))
    await cluster.load()
    gc.collect()
    probe(cluster, "start")
    before = tracemalloc.take_snapshot() if args.trace else None
    stopping = asyncio.Event()

    async def ticks() -> None:
        while not stopping.is_set():
            await cluster.housekeep()
            await asyncio.sleep(0.2)

    tasks: list[asyncio.Task[None]] = []
    if not args.burst:
        tasks += [asyncio.create_task(cluster.admission_loop(stopping)), asyncio.create_task(ticks())]
    templates = {cls: template(cls) for cls in LARGE.classes}
    slots = asyncio.Semaphore(args.in_flight)
    peak: dict[str, Any] = {"held": -1}
    applied = 0

    async def apply(i: int, cls: str, c: int, q: int) -> None:
        nonlocal applied
        try:
            text = templates[cls].replace(RUN_HEX.encode(), f"{i:016x}".encode()).replace(
                b"-0-0", f"-{c}-{q}".encode()).replace(TRACE_ID.encode(), f"{i:032x}".encode())
            req = msgspec.json.decode(text, type=BackendApply)
            await cluster.apply(req, traceparent=f"00-{i:032x}-b7ad6b7169203331-01")
            applied += 1
        finally:
            slots.release()

    async def sample() -> None:
        t0 = time.monotonic()
        while not stopping.is_set():
            await asyncio.sleep(args.every)
            row = probe(cluster, f"{time.monotonic() - t0:.0f} s")
            if row["held"] > peak["held"]:
                peak.update(row)
                if args.trace and row["held"] > 500:
                    peak["snapshot"] = tracemalloc.take_snapshot()

    sampler = asyncio.create_task(sample())
    t0, cpu0 = time.monotonic(), time.process_time()
    pending = set()
    for i, (cls, c, q) in enumerate(arrivals(args.runs)):
        if args.rate:
            await asyncio.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
        await slots.acquire()
        task = asyncio.create_task(apply(i, cls, c, q))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if args.burst:  # every run waits applied; then the cluster admits, runs and ends them all at once
        while pending:
            await asyncio.sleep(0.05)
        probe(cluster, "applied")
        if before is not None:  # what the waiting backlog holds, by allocation site
            gc.collect()
            grown = tracemalloc.take_snapshot().compare_to(before, "lineno")
            print(f"waiting backlog: traced +{sum(s.size_diff for s in grown) / 2**20:.1f} MB, "
                  f"{sum(s.size_diff for s in grown) / max(1, args.runs):.0f} B a run")
            for s in grown[:args.top]:
                print(f"  {s.size_diff / max(1, args.runs):7.0f} B {s.count_diff / max(1, args.runs):6.2f}  "
                      f"{s.traceback[0].filename.split('/taugrid/')[-1]}:{s.traceback[0].lineno}")
            del grown, before
        tasks += [asyncio.create_task(cluster.admission_loop(stopping)), asyncio.create_task(ticks())]
        cluster.wake()
    while pending or cluster.wls:
        await asyncio.sleep(0.2)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    await asyncio.sleep(2.0)
    stopping.set()
    cluster.wake()
    sampler.cancel()
    await asyncio.gather(*tasks, sampler, return_exceptions=True)
    print(f"{applied} runs applied and finished in {wall:.1f} s; process CPU {cpu:.1f} s, "
          f"{1000 * cpu / max(1, applied):.2f} ms a run")
    if peak["held"] >= 0:  # sampled at least once
        print(f"peak: held {peak['held']}, waiting {peak.get('waiting')}, rss {peak.get('rss', 0):.1f} MB, arenas "
              f"{peak.get('arenas')}, in use {peak.get('in_use', 0) / 2**20:.1f} MB")
    gc.collect()
    probe(cluster, "end")
    if args.trim:
        heap.trim()
        probe(cluster, "trimmed")
    if args.release:
        release(cluster)
    if args.trace:
        if "snapshot" in peak:
            stats = peak.pop("snapshot").statistics("lineno")
            print(f"at the peak: traced {sum(s.size for s in stats) / 2**20:.1f} MB")
            for s in stats[:args.top]:
                print(f"  {s.size / 2**20:7.2f} MB {s.count:8d}  "
                      f"{s.traceback[0].filename.split('/taugrid/')[-1]}:{s.traceback[0].lineno}")
            del stats
        top_sites("at the end", args.top)
        survivors(args.top)
    await cluster.kubelet.close()
    await own.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20_000, help="runs applied (Kueue's large-scale has 50,000)")
    ap.add_argument("--rate", type=float, default=0.0, help="applies a second (0: as fast as --in-flight allow)")
    ap.add_argument("--burst", action="store_true", help="apply every run before the cluster admits any, then "
                    "let it admit, run and end them all: a backlog of --runs at once")
    ap.add_argument("--in-flight", type=int, default=64, help="applies under way at once, as the service's consumer")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--trace", action="store_true", help="tracemalloc: allocation sites and arena survivors")
    ap.add_argument("--frames", type=int, default=6, help="frames kept per traced allocation")
    ap.add_argument("--trim", action="store_true", help="at the end, give glibc's free pages back (malloc_trim)")
    ap.add_argument("--release", action="store_true", help="at the end, drop what survives part by part and "
                    "print the arenas still held after each")
    ap.add_argument("--top", type=int, default=25, help="sites printed")
    args = ap.parse_args()
    if args.trace:
        tracemalloc.start(args.frames)
    root = Path(tempfile.mkdtemp(prefix="tau-bench-lcmem-"))
    proc, port = natsserver.start(root / "nats", log_file=root / "nats.log")
    try:
        asyncio.run(drive(args, f"nats://127.0.0.1:{port}", root / "data"))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
