"""Dispatch across many clusters over real leaf links, one site cut mid-run (issue 28, a first step of item 5).

A hub (bootstrapped, the dispatcher's bus) and ``--sites`` leaf nodes (default 10), each with its own JetStream
domain, ``SITE_IN``/``SITE_OUT`` and the hub's ``SITE_<CLUSTER>`` (``taugrid.bus.sites``). The dispatcher
(``services/dispatcher``, in-process, Incremental with step 3 unless ``--mode AllAtOnce``) reads the renderer's
requests from BACKEND and each site's reports from its hub stream. Each site is simulated: on a reservation it
reports its Workload's quota reserved after a random 0-50 ms while it holds fewer than ``--capacity`` runs; on an
apply it *starts* the run (counted) and ends it ``--duration`` seconds later, freeing the slot; on a delete it
drops the reservation. ``--runs`` requests (default 300) are published as fast as one client can; once half of the
runs are chosen, the nats-server of ``site-1`` (one of the preferred sites, so it holds runs) is stopped (its link
and its reports cut), and restarted on its port and store ``--cut-s`` seconds later.

Exits 0 only when every run was chosen exactly once (one ``dispatch.chosen``, one apply on the hub), started at
exactly one site and exactly once (the cut site included, after it catches up), with the dispatch ratio per site
and the times from request to choice printed; 1 otherwise, naming the first few faults.

Simulated sites stand in for the local cluster, whose reservations, preemption grants and reopened choices are
tested on real sites in tests/dispatcher (the whole pipeline's bench is bench/multicluster_stack.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from nats.js.api import AckPolicy, ConsumerConfig

from taugrid.bus import connect, kv, sites
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.connection import Bus
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.config.platform import Platform, load_platform
from taugrid.core.contracts import BackendApply, WatchEvent
from taugrid.ports import free_port
from taugrid.stack import natsserver
from taugrid.stack.natsserver import Leaf
from taugrid_services.dispatcher.handlers import Dispatcher
from taugrid_services.dispatcher.record import BUCKET, DispatchRecord

PLATFORM = """\
resource_flavors: [{{name: default}}]
cluster_queues:
  - name: lab
    resource_groups:
      - covered_resources: [cpu]
        flavors: [{{name: default, resources: [{{name: cpu, nominal_quota: 100000}}]}}]
local_queues: [{{name: default, namespace: default, cluster_queue: lab}}]
clusters:
{clusters}
dispatch: {dispatch}
"""


def request(run: str) -> BackendApply:
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": f"{run}-a1", "namespace": "default",
                        "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": run}}}
    return BackendApply(run_id=run, workspace="bench", attempt=1, manifests=[job])


def reserved(cluster: str, run: str) -> WatchEvent:
    return WatchEvent(type="MODIFIED", cluster=cluster, object={
        "kind": "Workload", "metadata": {"name": f"job-{run}-a1", "namespace": "default",
                                          "labels": {"taugrid.io/run-id": run, "taugrid.io/attempt": "1"}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}})


class Site:
    """A simulated cluster behind its own leaf node: reserves while it has room, starts only what it is told to."""

    def __init__(self, name: str, root: Path, hub_leaf_port: int, *, capacity: int, duration: float) -> None:
        self.name, self.root, self.hub_leaf_port = name, root, hub_leaf_port
        self.capacity, self.duration = capacity, duration
        self.port = free_port()
        self.proc = None  # type: ignore[var-annotated]
        self.bus: Bus | None = None
        self.loop: ConsumerLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.holding: set[str] = set()  # reserved or running here
        self.queue: list[str] = []  # reservations waiting for room, in arrival order
        self.started: Counter[str] = Counter()

    def leaf(self) -> Leaf:
        return Leaf(self.name, hub_url=f"nats-leaf://127.0.0.1:{self.hub_leaf_port}",
                    deny_exports=sites.SITE_DENY_EXPORTS, deny_imports=sites.SITE_DENY_IMPORTS)

    async def start(self, *, first: bool) -> None:
        """Start the site's server (on its port and store again after a cut) and its consumer; after a cut the
        waiting reservations are reported."""
        self.proc, _ = natsserver.start(self.root, port=self.port, log_file=self.root.parent / f"{self.name}.log",
                                        leaf=self.leaf())
        self.bus = await connect(f"nats://127.0.0.1:{self.port}", name="local-cluster")
        if first:
            await sites.provision_site(self.bus, self.name)
            await self.bus.js.add_consumer(sites.SITE_IN, ConsumerConfig(
                durable_name="site", ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0, max_deliver=20))
        self.loop = ConsumerLoop(self.bus, stream=sites.SITE_IN, durable="site", handler=self.on_request,
                                 fetch_timeout=0.2)
        self.task = asyncio.create_task(self.loop.run())
        if not first:
            await self.admit()

    async def stop(self) -> None:
        assert self.loop is not None and self.bus is not None and self.proc is not None
        self.loop.stopping.set()
        if self.task is not None:
            await asyncio.wait([self.task], timeout=5)
        with contextlib.suppress(Exception):  # the site's own services stop with its server
            await self.bus.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)

    async def on_request(self, ev: Event) -> None:
        verb = ev.nats_subject.split(".")[2]
        run = ev.subject
        if verb == "reserve":
            if run not in self.holding and run not in self.queue:
                self.queue.append(run)
            await self.admit()
        elif verb == "apply":
            self.started[run] += 1
            asyncio.get_running_loop().call_later(self.duration, lambda: asyncio.ensure_future(self.free(run)))
        elif verb == "delete":
            if run in self.queue:
                self.queue.remove(run)
            await self.free(run)

    async def free(self, run: str) -> None:
        self.holding.discard(run)
        await self.admit()

    async def admit(self) -> None:
        """Reserve quota for the waiting reservations while there is room (a queue in arrival order)."""
        while self.queue and len(self.holding) < self.capacity and self.bus is not None:
            run = self.queue.pop(0)
            self.holding.add(run)
            await asyncio.sleep(random.uniform(0, 0.05))
            try:
                await self.bus.publish(f"k8s.{self.name}.Workload.default.job-{run}-a1.modified",
                                       reserved(self.name, run), event_type="workload.modified", ce_subject=run,
                                       msg_id=f"{self.name}.{run}.reserved", family="k8s")
            except Exception:  # noqa: BLE001 - the site's server is down (the cut): it reports after it is back
                self.holding.discard(run)
                self.queue.insert(0, run)
                return


async def main(args: argparse.Namespace) -> int:
    random.seed(7)
    root = Path(tempfile.mkdtemp(prefix="tau-multicluster-"))
    leaf_port = free_port()
    hub_proc, hub_port = natsserver.start(root / "hub", log_file=root / "hub.log",
                                          leaf=Leaf(sites.HUB_DOMAIN, listen_port=leaf_port))
    hub = await connect(f"nats://127.0.0.1:{hub_port}", name="dispatcher")
    names = [f"site-{i}" for i in range(args.sites)]
    site_list = [Site(n, root / n, leaf_port, capacity=args.capacity, duration=args.duration) for n in names]
    loops: list[ConsumerLoop] = []
    faults: list[str] = []
    try:
        await bootstrap(hub)
        # BACKEND keeps a request only until its reader acked it (interest retention, issue 27): a durable that
        # never acks holds them all for the count of the hub's applies below (the hub is this run's own)
        await hub.js.add_consumer("BACKEND", ConsumerConfig(durable_name="bench-hold-backend",
                                                            filter_subject="backend.>", ack_policy=AckPolicy.EXPLICIT))
        for s in site_list:
            await sites.provision_feed(hub, s.name)  # the hub's durable the site's SITE_IN sources
            await s.start(first=True)
            await sites.provision_hub(hub, s.name)
        clusters = "\n".join(f"  - {{name: {n}, backend: local, preference: {i // 3}}}" for i, n in enumerate(names))
        dispatch = ("{mode: AllAtOnce}" if args.mode == "AllAtOnce"
                    else "{mode: Incremental, incremental_step: 3, round_timeout: 10s}")
        platform = load_platform(PLATFORM.format(clusters=clusters, dispatch=dispatch))

        async def plat() -> Platform:
            return platform

        d = Dispatcher(hub, plat)
        loops = [ConsumerLoop(hub, stream="BACKEND", durable="dispatcher", handler=d.on_request, fetch_timeout=0.2)]
        loops += [ConsumerLoop(hub, stream=sites.hub_stream(n), durable=sites.DISPATCHER_DURABLE,
                               handler=d.reports_of(n), fetch_timeout=0.2) for n in names]
        tasks = [asyncio.create_task(loop.run()) for loop in loops]

        async def rounds() -> None:  # as the service's timer runs it: a failed tick is logged, the next one runs
            while True:
                try:
                    await d.next_rounds()
                except Exception as exc:  # noqa: BLE001 - a conflict with a claim in flight: next tick
                    print(f"round tick: {exc!r}", flush=True)
                await asyncio.sleep(1.0)

        rounds_task = asyncio.create_task(rounds())
        runs = [f"mc-{i:05d}" for i in range(args.runs)]
        sent_at: dict[str, float] = {}
        t0 = time.monotonic()
        for run in runs:
            req = request(run)
            await hub.publish("backend.dispatch.apply", req, event_type="apply", ce_subject=run,
                              msg_id=f"{run}.1.apply", workspace="bench", family="backend")
            sent_at[run] = time.monotonic()
        print(f"{args.runs} requests published in {time.monotonic() - t0:.1f}s", flush=True)

        chosen_at: dict[str, float] = {}
        chosen: dict[str, str] = {}
        victim = site_list[1]  # a preferred site: it holds runs when its link is cut
        cut_done = restored = False
        deadline = time.monotonic() + args.timeout
        while len(chosen) < len(runs) and time.monotonic() < deadline:
            for rec in await kv.values(hub, BUCKET, DispatchRecord):
                if rec.chosen and rec.apply.run_id not in chosen:
                    chosen[rec.apply.run_id], chosen_at[rec.apply.run_id] = rec.chosen, time.monotonic()
            if not cut_done and len(chosen) >= len(runs) // 2:
                print(f"cutting {victim.name} after {len(chosen)} choices", flush=True)
                await victim.stop()
                cut_at, cut_done = time.monotonic(), True
            if cut_done and not restored and time.monotonic() - cut_at >= args.cut_s:
                await victim.start(first=False)
                restored = True
                print(f"{victim.name} restored after {args.cut_s:g}s", flush=True)
            await asyncio.sleep(0.5)
        if cut_done and not restored:
            await victim.start(first=False)
        # the last applies reach their sites; the cut site's SITE_IN resumes on nats-server's own retry schedule
        all_chosen = time.monotonic()
        while time.monotonic() < deadline and sum(sum(s.started.values()) for s in site_list) < len(chosen):
            await asyncio.sleep(0.5)
        print(f"every chosen run started {time.monotonic() - all_chosen:.1f}s after the last choice", flush=True)
        await asyncio.sleep(args.duration + 1)  # and nothing starts twice afterwards
        rounds_task.cancel()

        # every run chosen once, one apply on the hub, started at one site once
        hub_applies: Counter[str] = Counter()
        chosen_events: Counter[str] = Counter()
        from taugrid.bus import replay, streams

        first, last = await streams.bounds(hub, "BACKEND")
        for seq in range(max(first, 1), last + 1):
            ev = await streams.at(hub, "BACKEND", seq)
            if ev is not None and ev.nats_subject.endswith(".apply") and not ev.nats_subject.startswith(
                    "backend.dispatch."):
                hub_applies[ev.subject] += 1
        # RUNS lets an event go once read (interest retention, issue 27): HISTORY keeps the dispatcher's
        async for batch in replay.batches(hub, "run.>"):
            for ev in batch:
                if ev.type == "dispatch.chosen":
                    chosen_events[ev.subject] += 1
        started: dict[str, list[str]] = defaultdict(list)
        for s in site_list:
            for run, n in s.started.items():
                started[run] += [s.name] * n
        for run in runs:
            if run not in chosen:
                faults.append(f"{run}: never chosen")
            elif chosen_events[run] != 1 or hub_applies[run] != 1:
                faults.append(f"{run}: {chosen_events[run]} dispatch.chosen, {hub_applies[run]} applies")
            elif started[run] != [chosen[run]]:
                faults.append(f"{run}: chosen {chosen[run]}, started at {started[run]}")
        waits = sorted(chosen_at[r] - sent_at[r] for r in chosen)
        ratio = Counter(chosen.values())
        print("dispatch ratio: " + ", ".join(f"{n} {ratio[n] / max(len(chosen), 1):.0%}" for n in names))
        if waits:
            p95 = waits[int(0.95 * (len(waits) - 1))]
            print(f"request → chosen: p50 {statistics.median(waits):.2f}s, p95 {p95:.2f}s, max {waits[-1]:.2f}s")
        print(f"{len(chosen)}/{len(runs)} chosen, {sum(len(v) for v in started.values())} starts, "
              f"{len(faults)} fault(s) → {'ok' if not faults else 'FAIL'}")
        for f in faults[:10]:
            print("  " + f)
        for loop in loops:
            loop.stopping.set()
        await asyncio.wait(tasks, timeout=5)
    finally:
        for s in site_list:
            if s.proc is not None and s.proc.poll() is None:
                s.proc.terminate()
        await hub.close()
        hub_proc.terminate()
    return 0 if not faults else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--capacity", type=int, default=8, help="runs a site holds at once")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds a started run lasts")
    parser.add_argument("--cut-s", type=float, default=10.0, help="seconds the cut site stays down")
    parser.add_argument("--mode", choices=("Incremental", "AllAtOnce"), default="Incremental")
    parser.add_argument("--timeout", type=float, default=600.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
