"""The local cluster controller: backend requests in, Kueue-like admission over the engine, workload records and
platform revisions, the Job controller's part (pods for admitted workloads, run by the local kubelet through
``podsync``), watch events out.

Idempotent: an apply for a workload it already knows is ignored (same run+attempt ⇒ same name); every
published object change carries ``Nats-Msg-Id = <uid>.<resourceVersion>``; log chunks are keyed by byte
offset. State is written to KV before the request is acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import heapq
import itertools
import logging
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import psutil

from taugrid.bus import kv, metrics, sitecapacity, sites
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.platformread import PlatformReader
from taugrid.bus.sitelease import SiteLeaseKeeper
from taugrid.config.clusters import DISPATCH, NAME_PATTERN
from taugrid.config.platform import Platform
from taugrid.config.siteplatform import for_cluster
from taugrid.core import heap
from taugrid.core.admission import Resize
from taugrid.core.contracts import BackendApply, BackendDelete, PodSetTopology, WatchEvent
from taugrid.core.errors import ConfigError, TemporaryError
from taugrid.core.events import HIGH_LANE, k8s_subject
from taugrid.core.ids import token
from taugrid.core.quantity import parse_memory
from taugrid.core.recentnames import RecentNames
from taugrid.core.sitecapacity import SiteCapacity
from taugrid.core.watched import slim
from taugrid.local import envrefs, objects, raycluster, resize
from taugrid.local.admit import (
    GPU,
    Evicted,
    Granted,
    LocalAdmitter,
    Pending,
    Request,
    amount,
    job_elastic,
    job_topology,
)
from taugrid.local.backend import run_user
from taugrid.local.jobpods import template
from taugrid.local.kubelet import Kubelet
from taugrid.local.lanelock import LaneLock
from taugrid.local.podsready import WAITING_MESSAGE, WAITING_REASON
from taugrid.local.podsync import PodRuntime, PodSync, PreparedRuntimes, failure
from taugrid.local.readiness import Readiness
from taugrid.local.runas import RunUser, WorkspaceUsers
from taugrid.local.runtime import PodRuntimes
from taugrid.local.secrets import SecretStore
from taugrid.local.sitecapacity import site_capacity
from taugrid.local.state import LocalPod, LocalWorkload
from taugrid.ports import free_port
from taugrid.settings import Settings, current

log = logging.getLogger("taugrid.local")
BUCKET = "local_cluster"
# A finished workload's key is purged, not deleted: the purge marker goes after this long (nothing reads a finished
# workload's key; the marker only tells a live watcher), where a delete marker stayed forever, one indexed subject
# per run ever run (issue 27).
FINISHED_MARKER_TTL_S = 600.0
PENDING_REFRESH_S = 3.0
PENDING_PASS_S = 0.5  # waiting runs' reasons and positions are worked out once a housekeeping pass of this period
# ... or, once a pass takes long (it sorts every queue and words every waiting run: 100-660 ms for Kueue's baseline's
# 12,000 waiting on two loaded cores, under the lock that ends and admissions wait for), once this many times as long
# as the last one took: the pass costs at most a tenth of the process, and a deep backlog's reasons come a little
# later (they go out at most PENDING_NEWS a pass anyway, and a run's at most every PENDING_REFRESH_S). Never less
# often than every PENDING_REFRESH_S, though: a new run's first reason (no quota, no node) waits at most that long
# however deep the backlog (a pass of seconds would otherwise leave reasons stale for tens of seconds).
PENDING_PASS_SHARE = 10.0
PLATFORM_CHECK_S = 1.0
FRONT_OF_LINE = 10
PENDING_NEWS = 64  # waiting runs' status updates published by one housekeeping pass, at most
HOSTNAME_LABEL = "kubernetes.io/hostname"
SAFETY_CYCLE_S = 2.0  # admission runs on wake-ups; this timer only catches what changed without one
SIM_PASS_GAP_S = 0.005  # after a simulated pod's end: its clock check passes, and pods ending together share a pass
ADMIT_BATCH = 256  # admissions decided before their starts are published together
# Starts and ends under way at once, at most (the rest wait their turn, in order): each holds its Job, Workload and
# pods as dicts from its first step to its last publish (about 25 KB of small objects a start: the Job 12, its pod's
# spec copied 8, the Workload 3), and a burst's were all under way together (1,000 ends at once: 40 KB each, where
# at most 64 publishes are in flight anyway, ``_inflight``); Python's allocator kept the arenas they filled after the
# burst (issue 27: the local cluster ended at 96-118 MB after Kueue's large-scale). 128 (256 until session 21): a
# 2,000-run burst in-process ended at 52 arenas against 57 at 256 and 50 at 64, its CPU no higher; not fewer: the
# ends of a pass run under the lock, a few round trips each, and admissions wait for all of them (at 64, the stack's
# ``--fraction 0.1`` held 2,255-2,585 workloads at once).
STEPS_AT_ONCE = 128
TRIM_PEAK = 256  # workloads held at once before a drained backlog is worth a heap trim (``_trim_after_drain``)
# How far above what it held once started a drained backlog may leave the process before it is recycled
# (``_trim_after_drain``): Kueue's baseline left it 50-60 MB above, a 300-run burst 6 MB.
RECYCLE_ABOVE_MB = 24.0
FINISHED_MEMORY = 20_000  # names of finished workloads remembered, against redelivered applies
_UNSYNCED = msgspec.Raw(b"null")  # a new workload's JSON until its first save writes it (``LocalWorkload.sync``)


class NodeCordonRecord(msgspec.Struct, frozen=True):
    """KV ``cordon.<node>``: a pool node the health monitor cordoned, kept across restarts."""

    node: str
    reason: str


def resident_mb() -> float:
    """This process's resident memory in MB (psutil, as the machine inventory reads the host)."""
    return float(psutil.Process().memory_info().rss) / 2**20


def excluded_nodes(pod_spec: dict[str, Any]) -> list[str]:
    """Nodes a pod template keeps off through required ``kubernetes.io/hostname NotIn`` affinity (what the
    renderer writes for a retry after a GPU/node fault, ``render.common.node_exclusion``)."""
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    out: set[str] = set()
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "NotIn":
                out.update(str(v) for v in expr.get("values") or [])
    return sorted(out)


class LocalCluster:
    def __init__(self, bus: Bus, *, data_dir: Path, node: str, capacity: dict[str, float], gpu_count: int,
                 gpu_memory_mb: int = 0, runtime: PodRuntime | None = None, drain_grace_s: float = 30.0,
                 run_as: WorkspaceUsers | None = None, given: Settings | None = None,
                 gpu_resource: str = "nvidia.com/gpu") -> None:
        """``runtime`` decides which interpreter runs ``python``/``python3`` in a workload's pods (default: the
        researcher's interpreter or a per-run environment, ``podsync.PreparedRuntimes``). ``node`` is this
        machine's name, the pool's one node unless the platform declares ``local.nodes``. ``drain_grace_s``: how
        long a drained node's pods get between SIGTERM and SIGKILL. ``run_as``: each workspace's OS user, which
        its pods run as (``runas``; the service passes ``runas.from_env``); None: the cluster's own user.
        ``given``: the process's settings (the service passes its own; default ``settings.current()``): the
        secrets store (``data.secrets_dir``), simulated pods (``local.simulate``), the pods' interpreter.
        ``gpu_resource``: whose GPUs this machine's are (``machine.inventory``: AMD's or Gaudi's where their tool
        lists them), the machine node's vendor when the platform declares no ``local.nodes``."""
        given = given if given is not None else current()
        # At a site (``TAU_SITE``) this cluster is the one ``TAU_CLUSTER`` names, in its subjects and its watch
        # changes, and it answers the dispatcher's reservations; otherwise the one stack's ``local``.
        self.site = given.process.site
        self.name = site_name(given.process.cluster) if self.site else "local"
        # At a site: its lease on the hub (``lease_pass``; bus/sitelease.py, shared with a Kubernetes site's
        # kube-bridge). ``lease_held`` is cleared when a renewal fails or says fence, set again once one succeeds
        # (fenced first): meanwhile nothing is admitted and the site's SITE_IN consumer fetches nothing (its
        # ``gate``), so a returning site handles no request and starts nothing before it has stopped its orphans
        self.lease = SiteLeaseKeeper(bus, self.name)
        self.lease_held = self.lease.held
        self._capacity_sent: SiteCapacity | None = None  # the last record the hub took (``report_capacity``)
        self.drain_grace_s = drain_grace_s
        self.bus, self.node = bus, node
        self.capacity, self.gpu_count, self.gpu_memory_mb = capacity, gpu_count, gpu_memory_mb
        self.wls: dict[str, LocalWorkload] = {}
        self._applying: set[str] = set()  # workloads whose apply is between its checks and its joining ``wls``
        # Workloads that finished or went away here (bounded): a redelivered apply of one is not run again (a
        # restarted nats-server may redeliver a request whose ack it confirmed just before it died). Held as
        # digests in flat arrays: names added one by one all through a backlog kept its arenas (issue 27).
        self.finished = RecentNames(FINISHED_MEMORY)
        self.platform: Platform | None = None
        self.platform_rev = -1
        self.admitter = LocalAdmitter(node=node, capacity=capacity, gpu_count=gpu_count,
                                      gpu_memory_mb=gpu_memory_mb or 81920, gpu_resource=gpu_resource)
        self.lq: dict[tuple[str, str], str] = {}
        self.priorities: dict[str, tuple[int, bool]] = {}
        self._versions: dict[str, int] = {}
        # Deletes, the control loop and pod status reports interleave at awaits; one lock keeps a workload's
        # transitions (start, delete, finish) from crossing. An apply takes it only for a platform refresh that
        # is due, ahead of other waiters when the apply is in the high lane (``apply``).
        self.lock = LaneLock()
        self.platforms = PlatformReader(bus)
        # secrets come from the workspace's 0600 file under data_dir/secrets, read as each pod starts
        secrets_dir = given.data.secrets_dir or data_dir / "secrets"
        self.kubelet = Kubelet(data_dir / "pods", resolve_secret=SecretStore(secrets_dir).resolver(),
                               resolve_config_map=envrefs.config_map_resolver(), claims_dir=data_dir / "claims",
                               secret_scope=objects.workspace_of,
                               run_user=None if run_as is None else _workspace_user(run_as))
        self.podsync = PodSync(bus, self.kubelet, node=node, gpu_memory_mb=gpu_memory_mb, lock=self.lock,
                               publish=self.publish, save=self.save,
                               runtime=runtime or PreparedRuntimes(PodRuntimes(data_dir), run_as), users=run_as,
                               secrets_dir=secrets_dir, local=given.local)
        # Kueue's waitForPodsReady, as the platform's ``wait_for_pods_ready`` sets it (``readiness``)
        self.readiness = Readiness(podsync=self.podsync, admitter=self.admitter, publish=self.publish, save=self.save,
                                   request=self._request, drop_versions=self._drop_versions, forget=self._forget,
                                   wake=self.wake)
        # Simulated node pool (as Kueue's performance tests do): pods complete after SIMULATED_DURATION seconds
        # from their env, and no process is spawned.
        self.simulate = given.local.simulate
        self._snapshot_at = 0.0
        self._platform_checked = 0.0
        self._pending_at = 0.0
        self._pending_every = PENDING_PASS_S  # the pending pass's period (``PENDING_PASS_SHARE``)
        self._held_peak = 0  # the most workloads held since the heap was last trimmed (``_trim_after_drain``)
        self._ended_since_trim = 0  # workloads that ended here since then
        self._drain_owed = False  # trimmed while a backlog was still held: trimmed again once nothing is
        # The service's ``Service.recycle`` and what the process held once started (``started``): a drained
        # backlog that leaves it ``RECYCLE_ABOVE_MB`` above that has it started afresh (``_trim_after_drain``)
        self.recycle: Callable[[str], None] | None = None
        self.started_mb: float | None = None
        self._blocked = False  # admission held by Kueue's blockAdmission at the last wake-up
        self._inflight = asyncio.Semaphore(64)  # bounded publishes: a burst must not time out the server
        self.work = asyncio.Event()  # set on new work or freed capacity (``wake``)
        self.cycles = 0  # admission cycles run, for tests and benchmarks
        # Simulated pods' end times (a heap, one entry per started simulated pod): their workloads are supervised
        # then, so a pod ends when its duration is up rather than at the next 0.2 s tick.
        self._sim_ends: list[tuple[float, str]] = []  # (end time, workload name)
        self._sim_timer: asyncio.TimerHandle | None = None
        self._sim_armed = 0.0
        self._sim_passes: set[asyncio.Task[None]] = set()
        # Ends due and not yet taken by a pass, and whether a pass is waiting for the lock to take them: one waits at
        # a time (``_sim_pass``)
        self._sim_due: list[str] = []
        self._sim_queued = False
        # Simulated runs found ended and released (``_release_ended``), by when: their ends are reported as of
        # then (the events' ce-time), since their quota was free from then, where the reports come after the
        # admissions the release allowed
        self._ended_at: dict[str, float] = {}
        self._freed = False  # capacity released since the last admission began (``_release_ended``)
        self._ending: set[str] = set()  # Ray workers told to stop because their head ended
        self.releases: set[asyncio.Task[None]] = set()  # shrinks' quota freed once their pods exited (``resize``)

    # ---------------------------------------------------------------- platform and restart
    async def refresh_platform(self) -> None:
        """Pick up a new platform revision; looked up at most once a second (it sits on every tick and apply)."""
        if not self._platform_due():
            return
        self._platform_checked = time.time()
        try:
            got = await self.platforms.get()  # the newest valid revision: an invalid one is never acted on
        except TemporaryError:
            return  # no valid revision at all: PlatformReader logged it once; keep the last one we had
        if got is None or got[1] == self.platform_rev:
            return
        p, rev = got
        if self.site:  # a site admits with its own quotas (platform.yaml clusters[].quotas), the rest as written
            p = for_cluster(p, self.name)
        self.lq = {(lq.namespace, lq.name): lq.cluster_queue for lq in p.local_queues}
        self.priorities = {pc.name: (pc.value, pc.preemptible) for pc in p.priority_classes}
        self.platform, self.platform_rev = p, rev
        for wl in self.wls.values():  # a new revision may move a LocalQueue to another ClusterQueue
            wl.cluster_queue = self.lq.get((wl.namespace, wl.workload_view()["spec"]["queueName"]), wl.cluster_queue)
        self.admitter.configure(p)
        self.podsync.tas = self.admitter.tas
        self.readiness.rule = p.wait_for_pods_ready
        self._refill()
        self.wake()

    def _platform_due(self) -> bool:
        return time.time() - self._platform_checked >= PLATFORM_CHECK_S

    def _refill(self) -> None:
        """Give a fresh engine every workload this cluster holds, running ones first (not those backing off after
        a PodsReady timeout: ``readiness`` submits them when their backoff ends)."""
        held = list(self.wls.values())
        self.admitter.rebuild([self._request(w) for w in held if w.state in ("running", "reserved", "deleted")],
                              [self._request(w) for w in held if w.state == "pending"
                               and not self.readiness.backing_off(w)])

    async def load(self) -> None:
        await self.refresh_platform()
        for wl in await kv.values(self.bus, BUCKET, LocalWorkload, prefix="wl."):
            self.wls[wl.name] = wl
            self._versions[wl.uid] = int(wl.job_view()["metadata"].get("resourceVersion", "1"))
        self._refill()
        for wl in list(self.wls.values()):  # pods that kept running under their shims
            for p in wl.pods:
                if p.phase == "Running" and not p.sim_end:
                    await self.podsync.adopt(wl, p)
        legacy = await kv.get(self.bus, BUCKET, "cordon")  # one-node clusters kept a single key
        if legacy is not None and legacy.value:
            self.admitter.cordon(self.node, legacy.value.decode())
        for entry in await kv.values(self.bus, BUCKET, NodeCordonRecord, prefix="cordon."):
            self.admitter.cordon(entry.node, entry.reason)
        log.info("local cluster loaded %d workload(s)%s", len(self.wls),
                 f"; cordoned: {self.admitter.cordoned}" if self.admitter.cordoned else "")

    async def save(self, wl: LocalWorkload) -> None:
        if wl.state == "finished":
            await kv.purge(self.bus, BUCKET, f"wl.{wl.name}", marker_ttl=FINISHED_MARKER_TTL_S)
        else:
            wl.sync()  # the record carries the Job as it is now
            await kv.put(self.bus, BUCKET, f"wl.{wl.name}", wl)

    # ---------------------------------------------------------------- backend requests
    async def on_node(self, ev: Event) -> None:
        """The health monitor cordoned (and maybe drained) or uncordoned a node; only our pool's nodes matter."""
        data = ev.as_dict()
        node = str(data.get("node") or "")
        if node not in self.admitter.node_names():
            return
        async with self.lock:
            if ev.nats_subject.endswith(".cordon"):
                reason = str(data.get("reason") or "unhealthy")
                self.admitter.cordon(node, reason)
                await kv.put(self.bus, BUCKET, f"cordon.{token(node)}", NodeCordonRecord(node=node, reason=reason))
                if data.get("drain"):
                    await self._drain(node, reason)
            else:
                self.admitter.uncordon(node)
                await kv.delete(self.bus, BUCKET, f"cordon.{token(node)}")
                if node == self.node:
                    await kv.delete(self.bus, BUCKET, "cordon")
            self.wake()
            for wl in self.wls.values():
                wl.last_pending = ""  # re-announce every waiting run's reason
            why = self.admitter.cordoned.get(node)
            log.warning("node %s %s", node, f"cordoned: {why}" if why else "uncordoned")

    async def _drain(self, node: str, reason: str) -> None:
        """Stop every running workload with a pod on ``node`` (SIGTERM, SIGKILL after the grace period), as a
        drain evicts them. The Job then fails (backoffLimit 0: one failed pod fails a gang), and recovery,
        told by ``health.degraded``, retries it elsewhere; an elastic run whose pods there can go shrinks instead
        (``resize.shrink_off``)."""
        for wl in list(self.wls.values()):  # applies join ``wls`` meanwhile (they take no lock)
            if wl.state != "running" or not any((p.node or self.node) == node for p in wl.pods):
                continue
            if await resize.shrink_off(self, wl, node, reason):  # an elastic run gives the node's pods up
                log.warning("node %s drained: %s shrunk off it", node, wl.name)
                continue
            for p in wl.pods:
                if p.phase == "Pending":  # not started yet: it never will be, there
                    self.podsync.forget(p)
                    p.phase = "Failed"
                    objects.pod_terminated(p.obj, exit_code=137, reason="Evicted",
                                           message=f"node {node} drained before the pod started: {reason}",
                                           started=time.time(), at=time.time())
                    await self.publish(wl, "Pod", p.obj, "modified")
                    continue
                if p.phase != "Running":
                    continue
                if p.sim_end:  # simulated pod: it just ends, as a killed one would
                    p.phase = "Failed"
                    objects.pod_terminated(p.obj, exit_code=143, reason="Evicted",
                                           message=f"node {node} drained: {reason}", started=p.started,
                                           at=time.time())
                    await self.publish(wl, "Pod", p.obj, "modified")
                else:
                    await self.podsync.ship_logs(wl, p, final=False)
                    await self.kubelet.stop(p.name, grace_s=self.drain_grace_s, reason="Evicted")
            log.warning("node %s drained: stopping %s (grace %gs)", node, wl.name, self.drain_grace_s)
            await self.save(wl)

    async def on_backend(self, ev: Event) -> None:
        verb = ev.nats_subject.split(".")[2:3]  # backend.<cluster>.<verb>[.high]: a high-lane apply has a lane token
        if verb == ["apply"]:
            await self.apply(ev.payload(BackendApply), traceparent=ev.traceparent, high=ev.lane == HIGH_LANE)
        elif verb == ["reserve"]:  # the dispatcher's: admit it here, start nothing until it is chosen (``held``)
            await self.apply(ev.payload(BackendApply), traceparent=ev.traceparent, high=ev.lane == HIGH_LANE,
                             hold=True)
        elif verb == ["delete"]:  # deletes travel in no lane (``LocalBackend.delete``)
            async with self.lock:
                await self.delete(ev.payload(BackendDelete))

    async def apply(self, req: BackendApply, *, traceparent: str = "", high: bool = False, hold: bool = False) -> None:
        """``hold``: a reservation (``held``), admitted but not started until an apply of the same workload comes.
        A new workload: saved and announced (its Job and Workload ADDED) before the engine or the control loop
        sees it. It takes the lock only to read a platform revision its request was resolved against and this
        cluster has not read: applies run concurrently (up to the consumer's in-flight limit), since one held the
        lock for its round trip, so applies were handled one bus round trip at a time (about 80/s under a burst's
        load), below Kueue's scenario's arrival rate. The periodic read is housekeeping's (every tick, under its
        lock): applies that waited on the lock for it held up the applies behind them (Kueue's TAS scenario through
        the pipeline: a lock wait of 1.2 s for the median apply at load 13, the lock held by admissions). Nothing
        else can touch the workload meanwhile: it joins ``wls`` and the engine together once its events are out,
        and a run's later requests (its delete) wait for this one in the consumer (one run's events in order)."""
        if req.platform_revision > self.platform_rev:  # resolved against a revision this cluster has not read
            async with self.lock.first(high):
                if req.platform_revision > self.platform_rev:  # not read meanwhile by the apply ahead of this one
                    self._platform_checked = 0.0
                    await self.refresh_platform()
        main = next((m for m in req.manifests if m.get("kind") in ("Job", "RayJob")), None)
        if main is None:
            return
        name = main["metadata"]["name"]
        if not hold and name in self.wls and self.wls[name].held:
            async with self.lock.first(high):
                await self._chosen(name)
            return
        if hold and req.may_preempt and name in self.wls and self.wls[name].held:
            async with self.lock.first(high):
                await self._let_preempt(self.wls[name])
            return
        if hold and name in self.wls and self.wls[name].state == "deleted":
            raise TemporaryError(f"{name} is still stopping here: reserved again once it has")  # redelivered
        if hold:  # reserved again after it went from here (this cluster was lost and fenced it, or was withdrawn):
            self.finished.discard(name)  # a reservation starts nothing by itself
        if name in self.wls or name in self.finished or name in self._applying:
            return  # redelivered apply: the same run+attempt is the same object, running or done
        wl = self._workload_from(req, main)
        wl.held = hold
        wl.preempt_granted = req.may_preempt
        wl.traceparent = traceparent
        wl.lane = self._lane(wl)
        wl.user = sys.intern(run_user(req.run_id))  # the verified submitter (its handler's ``identity.run_user``)
        self._applying.add(name)
        # One round trip instead of three: versions are taken in call order before any await, and the state is
        # still saved before the request is acknowledged. A Job's creation is not published (issue 30: a watch
        # change a run that no reader takes anything from; its Workload's ADDED says the run waits, and the Job
        # is first seen ending, preempted, resized or deleted); a RayJob's is, as KubeRay's status starts there.
        try:
            await asyncio.gather(self.save(wl),
                                 *([self.publish(wl, "RayJob", wl.job, "added")] if main["kind"] != "Job" else []),
                                 self.publish(wl, "Workload", wl.workload, "added"))
        except BaseException:
            # Not applied (the bus failed mid-way, e.g. a restarting server): forget it, so the redelivered request
            # applies it again instead of taking it for a duplicate; events that did go out carry the same ids.
            self._drop_versions(wl.job, wl.workload)
            raise
        finally:
            self._applying.discard(name)
        # A platform revision taken meanwhile may have moved its LocalQueue (``refresh_platform`` re-homes only
        # the workloads already in ``wls``).
        wl.cluster_queue = self.lq.get((wl.namespace, wl.workload["spec"]["queueName"]), wl.cluster_queue)
        self.wls[name] = wl
        self.admitter.submit(self._request(wl))
        wl.pack()  # it waits holding its Job and Workload as JSON, decoded when used (``LocalWorkload``)
        self.wake()

    def _workload_from(self, req: BackendApply, main: dict[str, Any]) -> LocalWorkload:
        now = time.time()
        meta = main["metadata"]
        labels = meta.get("labels", {})
        uid = f"{req.run_id}-a{req.attempt}"
        meta["uid"] = uid
        meta["resourceVersion"] = "1"
        # Its Workload and pods carry the run labels: the admission watcher keeps no KV entry for its uid.
        meta.setdefault("annotations", {})[objects.ANNOTATION_RUN_LABELLED] = "true"
        meta["creationTimestamp"] = objects.ts(now)
        queue = labels.get("kueue.x-k8s.io/queue-name", "")
        ns = meta.get("namespace", "default")
        prio_name = labels.get("kueue.x-k8s.io/priority-class", "")
        prio, preemptible = self.priorities.get(prio_name, (0, True))
        per_pod, pods_wanted, memory_limit = self._requests(main)
        head: dict[str, float] = {}
        if raycluster.is_ray_cluster(main):  # an elastic RayJob: Kueue's two pod sets, a head and its workers
            head = {r: amount(r, v) for r, v in raycluster.requests_of(raycluster.head_group(main)).items()}
            per_pod = {r: amount(r, v) for r, v in raycluster.requests_of(raycluster.worker_group(main)).items()}
            pods_wanted = int(raycluster.worker_group(main).get("replicas", 1))
            memory_limit = 0  # each pod keeps its own container's limit
        ann = {**meta.get("annotations", {}), **template(main).get("metadata", {}).get("annotations", {})}
        fraction = float(ann.get("taugrid.io/gpu-fraction", 0) or 0)
        gpu_mem = int(float(ann.get("taugrid.io/gpu-memory", 0) or 0))  # MiB, as render.common writes it
        if fraction or gpu_mem:
            per_pod[GPU] = 0.0
        pod_sets = [{"name": name, "count": n,
                     "template": {"spec": {"containers": [{"name": "main", "resources": {"requests": {
                         k: str(v) for k, v in requests.items()}}}]}}}
                    for name, n, requests in ([(raycluster.HEAD, 1, head), (raycluster.WORKERS, pods_wanted, per_pod)]
                                              if head else [("main", pods_wanted, per_pod)])]
        wl_obj = objects.workload(main, uid=uid, queue=queue, priority=prio, priority_class=prio_name,
                                  pod_sets=pod_sets, at=now)
        wl_obj["metadata"]["resourceVersion"] = "1"
        # Strings many workloads share (their namespace, workspace, interpreter...) are held once (``sys.intern``), not
        # once per workload as each request decodes them: a backlog's small objects stay resident (issue 27)
        wl = LocalWorkload(
            name=meta["name"], namespace=sys.intern(ns), uid=uid, run_id=req.run_id,
            workspace=sys.intern(req.workspace), attempt=req.attempt, job_json=_UNSYNCED, workload_json=_UNSYNCED,
            cluster_queue=self.lq.get((ns, queue), ""),
            priority=prio, created=now, pods_wanted=pods_wanted, per_pod=per_pod, head_per_pod=head,
            gpu_fraction=fraction,
            gpu_memory_mb=gpu_mem, memory_limit=memory_limit, preemptible=preemptible,
            placement=sys.intern(str(ann.get("taugrid.io/placement", "binpack"))),
            excluded_nodes=excluded_nodes(template(main).get("spec", {})),
            hang_timeout_s=float(ann.get("taugrid.io/hang-timeout", 0) or 0),
            source_object=sys.intern(req.source_object), python=sys.intern(req.python),
            python_source=sys.intern(req.python_source), image=sys.intern(req.image), pip=list(req.pip),
        )
        wl.keep(job=main, workload=wl_obj)  # their JSON is written by the first save
        return wl

    def _requests(self, main: dict[str, Any]) -> tuple[dict[str, float], int, int]:
        if main["kind"] == "RayJob":
            spec = main["spec"].get("rayClusterSpec", {})
            total: dict[str, float] = {}
            memory_limit = 0
            groups = [(1, spec.get("headGroupSpec", {}))] + [
                (int(g.get("replicas", 1)), g) for g in spec.get("workerGroupSpecs", [])]
            for n, g in groups:
                c = (g.get("template", {}).get("spec", {}).get("containers") or [{}])[0]
                for r, v in (c.get("resources", {}).get("requests") or {}).items():
                    total[r] = total.get(r, 0.0) + n * amount(r, v)
                lim = (c.get("resources", {}).get("limits") or {}).get("memory")
                memory_limit += n * int(parse_memory(lim)) if lim else 0
            return total, 1, memory_limit
        c = next(x for x in template(main)["spec"]["containers"] if x.get("name") == "main")
        res = c.get("resources", {})
        per_pod = {r: amount(r, v) for r, v in (res.get("requests") or {}).items()}
        lim = (res.get("limits") or {}).get("memory")
        return per_pod, int(main["spec"].get("parallelism") or 1), int(parse_memory(lim)) if lim else 0

    def _request(self, wl: LocalWorkload) -> Request:
        # pods numbered across pod sets in order (a Ray cluster's head first), as the engine numbers them
        pods = sorted(wl.pods, key=lambda p: (p.pod_set != raycluster.HEAD, p.index)) \
            if wl.state in ("running", "deleted") else []
        gpus, nodes = [list(p.gpus) for p in pods], [p.node for p in pods]
        if wl.state == "reserved":  # admitted with no pods yet: where the engine placed it
            gpus, nodes = [list(g) for g in wl.held_gpus], list(wl.held_nodes)
        job = wl.job_view()  # a waiting workload's Job is not decoded to be kept
        return Request(name=wl.name, cluster_queue=wl.cluster_queue, priority=wl.priority,
                       created=wl.queued_at or wl.created,
                       pods=wl.pods_wanted, per_pod=wl.per_pod, gpu_fraction=wl.gpu_fraction,
                       gpu_memory_mb=wl.gpu_memory_mb, preemptible=wl.preemptible, placement=wl.placement,
                       excluded_nodes=tuple(wl.excluded_nodes), topology=job_topology(job),
                       flavors=_admitted_flavors(wl), gpus=gpus, nodes=nodes, elastic=job_elastic(job),
                       head=dict(wl.head_per_pod), preemption_gated=self.site and wl.held and not wl.preempt_granted)

    async def _let_preempt(self, wl: LocalWorkload) -> None:
        """The dispatcher let this cluster preempt for a reservation it holds: waiting, it goes back to the engine
        ungated (its queue position kept: it keeps its creation time)."""
        if wl.preempt_granted:
            return
        wl.preempt_granted = True
        await self.save(wl)
        if wl.state == "pending":
            self.admitter.release(wl.name)
            self.admitter.submit(self._request(wl))
            self.wake()

    async def _chosen(self, name: str) -> None:
        """The dispatcher chose this cluster for a reservation: its pods start now if admission reserved its
        quota already, else as soon as it does (a plain workload from then on). At a site a reservation chosen
        but preempted since (pending again) stays held: the dispatcher reopens the choice on its eviction."""
        wl = self.wls.get(name)
        if wl is None or not wl.held:
            return
        if self.site and wl.state == "pending":  # evicted since it reported its admission: the dispatcher reopens
            return  # the choice when it reads that, and this copy waits as a reservation meanwhile
        wl.held = False
        if wl.state == "reserved":
            await self._create_pods(wl, wl.held_gpus, wl.held_nodes, time.time())
        else:
            await self.save(wl)

    async def lease_pass(self) -> None:
        """At a site: renew this cluster's lease on the hub. When the hub declared it lost (its runs requeued
        elsewhere), first stop every workload whose run attempt the hub no longer has chosen here (the orphans),
        then rejoin under the hub's generation (bus/sitelease.py, core/siteleases.py)."""
        if await self.lease.renew(self._dispatched, self._stop_orphan):
            self.wake()
        try:
            await self.report_capacity()
        except TemporaryError as exc:  # the lease is renewed; the record goes at the next pass
            log.warning("capacity of %s not reported to the hub: %s", self.name, exc)

    @property
    def lease_generation(self) -> int:
        return self.lease.generation

    async def _dispatched(self) -> dict[str, str]:
        """The workloads here that hold quota or run for a dispatched run attempt → its dispatch record key."""
        return {wl.name: sites.dispatch_key(wl.run_id, wl.attempt) for wl in self.wls.values()
                if wl.state in ("pending", "reserved", "running")}

    async def _stop_orphan(self, name: str, reason: str) -> None:
        wl = self.wls[name]
        async with self.lock:
            await self.delete(BackendDelete(run_id=wl.run_id, workspace=wl.workspace, attempt=wl.attempt,
                                            kind=str(wl.job["kind"]), namespace=wl.namespace, name=name,
                                            reason=reason))

    async def report_capacity(self) -> None:
        """At a site: this cluster's capacity and usage into the hub's ``site_capacity`` (its own key), only when
        the record changed since the last write the hub took: at most once a lease period, never per event."""
        if self.platform is None:
            return  # no platform read yet: no queues to report
        record = site_capacity(self.platform, self.admitter.pool, self.admitter.snapshot(time.time()),
                               lambda name: self.wls[name].run_id if name in self.wls else None)
        if record == self._capacity_sent:
            return
        await sitecapacity.report(self.bus, self.name, record, hub_domain=sites.HUB_DOMAIN)
        self._capacity_sent = record

    async def delete(self, req: BackendDelete) -> None:
        wl = self.wls.get(req.name)
        if wl is None or wl.state in ("finished", "deleted"):
            return
        if wl.state in ("pending", "reserved"):  # a withdrawn reservation gives its quota back, nothing ran
            self.admitter.release(wl.name)
            self.wake()
            await self._gone(wl, may_return=wl.held)
            return
        wl.state = "deleted"
        for p in wl.pods:
            if p.phase == "Pending":
                p.phase = "Deleted"  # never launched
                self.podsync.forget(p)
            elif p.phase == "Running" and not p.sim_end:
                await self.podsync.stop(p, "Cancelled")
        await self.save(wl)

    async def _gone(self, wl: LocalWorkload, *, may_return: bool = False) -> None:
        wl.state = "finished"
        await self.save(wl)
        for p in wl.pods:
            await self.publish(wl, "Pod", p.obj, "deleted")
        await self.publish(wl, wl.job["kind"], wl.job, "deleted")
        await self.publish(wl, "Workload", wl.workload, "deleted")
        self._forget(wl, may_return=may_return)

    # ---------------------------------------------------------------- the control loop
    async def tick(self) -> None:
        """One pass of everything: admission (cycles back to back while heads are admitted), then housekeeping."""
        async with self.lock:
            await self._admit()
            await self._housekeep()

    async def pods_ready_pass(self, now: float) -> None:
        """The waitForPodsReady checks at time ``now`` (housekeeping runs them at the current time; tests step
        ``now`` past a timeout or a backoff instead of sleeping through it)."""
        async with self.lock:
            await self.readiness.check(self.wls.values(), now)

    async def housekeep(self) -> None:
        """The timer's part: pods to launch, reasons for waiting runs, pods to supervise, the queue snapshot."""
        async with self.lock:
            await self._housekeep()

    def wake(self) -> None:
        """New work or freed capacity: the admission loop runs a cycle now instead of at its safety timer."""
        self.work.set()

    async def admission_loop(self, stopping: asyncio.Event, *, safety_s: float = SAFETY_CYCLE_S) -> None:
        """Event-driven admission: wait for ``wake`` (or the slow safety timer, which catches anything that
        changes without a wake-up); a workload's backoff ending wakes it at that time, then cycle until no head
        is admissible."""
        while not stopping.is_set():
            due = self.admitter.next_requeue()
            timeout = safety_s if due is None else min(safety_s, max(0.0, due - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.work.wait(), timeout=timeout)
            if stopping.is_set():
                return
            self.work.clear()
            try:
                async with self.lock:
                    await self._admit()
            except Exception:
                log.exception("admission failed; retrying at the next wake-up")
                await asyncio.sleep(0.1)

    async def _admit(self) -> None:
        """Admission cycles back to back, each admitting at most one head per ClusterQueue (Kueue's cycle),
        until a cycle admits nothing and no head is left untried. Cycles are pure engine work, so a batch of
        them runs first and the admitted workloads then start concurrently; a cycle that preempts ends its
        batch, so victims are stopped before anything later is admitted. A batch that ends early (a preemption,
        or ``ADMIT_BATCH`` admissions or fruitless cycles) wakes the loop again rather than holding the lock, so
        housekeeping interleaves with a long burst."""
        self._freed = False
        await self.refresh_platform()
        if not self.lease_held.is_set():  # a site away from its hub, or fencing: ``lease_pass`` wakes us
            return
        if self.readiness.blocked(self.wls.values()):
            # Kueue's blockAdmission: an admitted workload is not ready yet (``readiness`` wakes us once it is);
            # every waiting run is told why at the next housekeeping, not half a second later
            self._pending_at = 0.0 if not self._blocked else self._pending_at
            self._blocked = True
            return
        self._blocked = False
        granted: list[Granted] = []
        preempted: list[Evicted] = []
        resized: list[Resize] = []
        examined = 0
        while len(granted) < ADMIT_BATCH:
            got = self.admitter.cycle()
            self.cycles += 1
            granted += got
            preempted = list(self.admitter.preempted)
            resized += self.admitter.resized
            examined = 0 if got else examined + 1
            # a cycle that admits nothing has still tried one head per queue; the heads behind it are tried too
            # (one may fit, and every waiting run then has its reason), so one reason holds for the whole line
            if preempted or resized or (not got and (self.admitter.quiescent() or examined >= ADMIT_BATCH)):
                break
        now = time.time()
        for ev in preempted:
            if ev.victim in self.wls:
                await self._preempt(self.wls[ev.victim], ev.reason, ev.message, ev.preemptor, now)
        await self._each((self._start(self.wls[g.name], g.flavors, g.gpus, now, nodes=g.nodes, topology=g.topology)
                          for g in granted
                          if g.name in self.wls and self.wls[g.name].state == "pending"), at_once=STEPS_AT_ONCE)
        for r in resized:  # elastic runs (after the starts: a run may grow in the cycle that admits it)
            await resize.apply(self, r)
        if preempted or len(granted) >= ADMIT_BATCH or examined >= ADMIT_BATCH:
            self.wake()  # the batch ended early: a head may still be admissible, so the next cycle runs at once

    async def _housekeep(self) -> None:
        await self.refresh_platform()
        now = time.time()
        await self._each(self._launch_pending(wl) for wl in list(self.wls.values())
                         if wl.state == "running" and (not wl.announced or any(
                             p.phase == "Pending" or (p.sim_end and not p.added) for p in wl.pods)))
        await self._each(self._announce_reserved(wl) for wl in list(self.wls.values())
                         if wl.state == "reserved" and not wl.announced)
        await self.readiness.check(self.wls.values(), now)
        if now - self._pending_at >= self._pending_every:  # reasons and positions of every waiting run, a pass a queue
            self._pending_at = now
            began = time.perf_counter()
            why = self.admitter.pending_all()
            if self.readiness.blocked(self.wls.values()):
                why = {n: Pending(WAITING_REASON, WAITING_MESSAGE, p.position) for n, p in why.items()}
            # at most PENDING_NEWS a pass (the rest the next half second): a burst of arrivals made one pass publish
            # a thousand of them under the lock, ends and admissions queued behind it (Kueue's TAS scenario)
            news = list(itertools.islice((wl for wl in list(self.wls.values())
                                          if wl.state == "pending" and self._pending_news(wl, why.get(wl.name), now)),
                                         PENDING_NEWS))
            self._pending_every = pending_pass_period(time.perf_counter() - began)
            await self._each(self.publish(wl, "Workload", wl.workload, "modified") for wl in news)
            for wl in news:  # published (under the lock: nothing else holds its dicts): back to JSON while it waits
                if wl.state == "pending":
                    wl.pack()
        await self._supervise_many(list(self.wls.values()))
        if now - self._snapshot_at > 2.0:
            self._snapshot_at = now
            await self._publish_queues(now)
        self._trim_after_drain()

    def _trim_after_drain(self) -> None:
        """A drained backlog's memory back to the system: a waiting workload holds its Job and Workload as JSON,
        a running one its pods too (``LocalWorkload.pack``), a few kilobytes each in the C heap, where glibc keeps
        the pages a burst freed (``core/heap``). When what is held falls to a quarter of a peak of at least
        ``TRIM_PEAK`` workloads, the heap's free pages are released: once a backlog, never per tick (a trim walks
        the heap). The same when nothing is held any more and at least ``TRIM_PEAK`` workloads ended since the last
        trim: a long stream of runs, none of them held long, frees its JSON all over the heap too (Kueue's
        large-scale scenario ended with a 19.6 MB heap and nothing held), and once nothing is held after a trim
        made while some of a backlog still was (its last quarter's queues, not empty then, are empty now: Kueue's
        baseline trimmed last at 196 held and never again). Python's own arenas are not the C heap's:
        an arena goes back only once every object in it is freed, so the starts and ends under way are bounded
        (``STEPS_AT_ONCE``), and each trim first has the engine's queues that nothing waits in drop what the
        backlog left there (``Engine.settle_idle``: memos of ended heads, stale entries)."""
        held = len(self.wls)
        self._held_peak = max(self._held_peak, held)
        if (self._held_peak >= TRIM_PEAK and held <= self._held_peak // 4) or (
                held == 0 and (self._drain_owed or self._ended_since_trim >= TRIM_PEAK)):
            self.admitter.settle_idle()
            heap.trim()
            self._held_peak = held
            self._ended_since_trim = 0
            self._drain_owed = held > 0
            if held == 0:
                self._recycle_if_swollen()

    def started(self) -> None:
        """Note what the process holds once started (the baseline ``_recycle_if_swollen`` compares with)."""
        self.started_mb = resident_mb()

    def _recycle_if_swollen(self) -> None:
        """Nothing held after a backlog, yet the process still holds ``RECYCLE_ABOVE_MB`` more than once started:
        what stays is Python's arenas, each kept by a few of the objects made while the backlog was handled (a
        task, a timer, a module imported then; not one kind, not a leak: Kueue's baseline ended 50-60 MB above
        its start, 44-48 MB of it in wholly free pools, and freeing the kinds found did not lower it, docs §16).
        The service starts afresh (``Service.recycle``), which picks every workload and pod up again from the
        bus as after a crash; nothing runs now, and what arrives meanwhile waits in its stream."""
        if self.recycle is None or self.started_mb is None:
            return
        now_mb = resident_mb()
        if now_mb - self.started_mb >= RECYCLE_ABOVE_MB:
            self.recycle(f"a drained backlog left the local cluster at {now_mb:.0f} MB resident, "
                         f"{now_mb - self.started_mb:.0f} MB above its start; nothing is held")

    @staticmethod
    async def _each(coros: Iterable[Awaitable[None]], *, at_once: int = 0) -> None:
        """Run per-workload steps concurrently; one workload's failure (e.g. a publish timeout under load) is
        logged and retried on the next tick instead of aborting everyone else's. ``at_once``: at most that many
        under way (0: all), the rest begun, in order, as those end; a step not begun has decoded nothing."""
        steps: Iterable[Awaitable[None]] = coros
        if at_once:
            slots = asyncio.Semaphore(at_once)

            async def in_turn(step: Awaitable[None]) -> None:
                async with slots:
                    await step

            steps = [in_turn(step) for step in coros]
        for result in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(result, Exception):
                log.warning("local cluster step failed; retrying next tick: %r", result)

    async def _publish_queues(self, now: float) -> None:
        """`tau queue` reads this: quota use per ClusterQueue and the pending runs in order."""
        snap = self.admitter.snapshot(now)
        for q in snap:
            names = cast(list[str], q["pending"])  # LocalAdmitter.snapshot: workload names in admission order
            q["pending"] = [{"run_id": self.wls[n].run_id, "workload": n, "position": i}
                            for i, n in enumerate(names) if n in self.wls]
        await kv.put(self.bus, BUCKET, "queues", msgspec.json.encode({"time": now, "node": self.node, "queues": snap}))
        metrics.observe_queues(snap)

    async def _preempt(self, wl: LocalWorkload, reason: str, message: str, preemptor: str, now: float) -> None:
        """Stop the pods (SIGTERM, then SIGKILL after the grace period) and requeue, as Kueue does."""
        await self.podsync.take_down(wl, wl.pods, "Preempted")
        self._drop_versions(*(p.obj for p in wl.pods))  # requeued: its next pods are new objects
        by = self.wls.get(preemptor)
        objects.evict(wl.workload, reason=reason, message=message, preemptor_uid=by.uid if by else preemptor, at=now,
                      preemptor_run=by.run_id if by else "")
        await self.publish(wl, "Workload", wl.workload, "modified")
        objects.job_suspended(wl.job)
        await self.publish(wl, wl.job["kind"], wl.job, "modified")
        wl.pods, wl.state, wl.last_pending = [], "pending", ""
        if wl.head_per_pod:  # a Ray cluster: its dying head may hold its port a while; the next start takes another
            _remove_ray_files(wl)
            wl.rdzv_port = 0
        # at a site the eviction sends the run back to the dispatcher (kueue#8302): it queues here again as a
        # reservation and starts only if this cluster is chosen again
        wl.held = wl.held or self.site
        wl.preempt_granted = False  # gated again, as KEP-8303 re-applies the gate on eviction
        wl.requeues += 1
        wl.retry_reason = "Preempted"
        await self.save(wl)

    def _pending_news(self, wl: LocalWorkload, info: Pending | None, now: float) -> bool:
        """Is this waiting run's status worth a Workload update? A new reason is news at once. A changed message
        or position is refreshed at most every few seconds, and a position only near the front of the line
        (deeper positions move with every admission; `tau queue` lists them): otherwise every pending run
        would republish on every tick and the updates alone would swamp a long queue. A run no cycle has
        considered yet ("Waiting for the next scheduling cycle") has no news but its position (its Workload's ADDED
        said it waits for Kueue to consider it), so it is first reported once it has waited as long as a position
        is refreshed: reported at its first pass, a fifth of a 300-run burst's runs were queued twice, each
        admitted within a second of the report (one more watch change and ``admission.queued`` each, published
        under the lock the admissions wait for). A reason a cycle found goes out at its first pass."""
        if info is None:
            return False
        if info.untried and now - wl.created < PENDING_REFRESH_S:
            return False
        key = f"{info.reason}|{info.message}|{info.position}"
        if key == wl.last_pending:
            return False
        last_reason, _, rest = wl.last_pending.partition("|")
        last_message = rest.rpartition("|")[0]
        if last_reason == info.reason:
            if now - wl.last_pending_at < PENDING_REFRESH_S:
                return False
            if last_message == info.message and info.position > FRONT_OF_LINE:
                return False
        wl.last_pending, wl.last_pending_at = key, now
        objects.pending(wl.workload, reason=info.reason, message=info.message, position=info.position, at=now)
        return True

    async def _start(self, wl: LocalWorkload, flavors: dict[str, str], gpus: list[list[int]], now: float, *,
                     nodes: list[str] | None = None, topology: Sequence[PodSetTopology] = ()) -> None:
        """Admitted: persist the pods first, then announce and launch them. Resumable: a tick that fails half
        way (the bus timed out) leaves pods in phase Pending, and the next tick carries on from there. Pod i
        runs on ``nodes[i]`` (the engine placed pods in rank order, so a TAS assignment's domains fill by index)."""
        counts = {raycluster.HEAD: 1, raycluster.WORKERS: wl.pods_wanted} if wl.head_per_pod else {
            "main": wl.pods_wanted}
        objects.admit(wl.workload, cluster_queue=wl.cluster_queue, flavors=flavors, pod_counts=counts, at=now,
                      topology=topology)
        if wl.held:  # a reservation: the quota is taken and reported, the pods wait for the dispatcher's apply
            wl.state, wl.announced, wl.admitted_at = "reserved", False, now
            wl.held_gpus, wl.held_nodes = [list(g) for g in gpus], list(nodes or [])
            await self.save(wl)
            await self._announce_reserved(wl)
            return
        await self._create_pods(wl, gpus, nodes, now)

    async def _announce_reserved(self, wl: LocalWorkload) -> None:
        """The reservation's admission (its Workload's QuotaReserved/Admitted), which the dispatcher reads from
        this site's ``SITE_OUT``; the next housekeeping repeats it when this publish fails."""
        await self.publish(wl, "Workload", wl.workload, "modified")
        wl.announced = True

    async def _create_pods(self, wl: LocalWorkload, gpus: list[list[int]], nodes: list[str] | None,
                           now: float) -> None:
        self.readiness.admitted(wl, now)
        wl.pods = []
        if (wl.pods_wanted > 1 or job_elastic(wl.job)) and not wl.rdzv_port:
            wl.rdzv_port = free_port()  # torchrun's rendezvous, or a Ray cluster's head (its GCS port)
        # (pod set, index, name) per pod, in the engine's order: ``gpus`` and ``nodes`` follow it
        if wl.head_per_pod:
            # workers named as an Indexed Job's pods, so a shrink's record drops the right ones (``states``)
            pods = [(raycluster.HEAD, 0, f"{wl.name}-head")] + [
                (raycluster.WORKERS, i, f"{wl.name}-{i}") for i in range(wl.pods_wanted)]
        else:
            pods = [("", i, f"{wl.name}-{i}" if wl.pods_wanted > 1 else f"{wl.name}-pod")
                    for i in range(wl.pods_wanted)]
        for k, (pod_set, i, name) in enumerate(pods):
            name += f"-r{wl.requeues}" if wl.requeues else ""  # a requeued pod is a new pod
            node = nodes[k] if nodes and k < len(nodes) else self.node
            obj = objects.pod(wl.job, name=name, node=node, index=i, at=now, pod_set=pod_set)
            wl.pods.append(LocalPod.holding(obj, name=name, index=i, gpus=gpus[k] if k < len(gpus) else [], node=node,
                                    pod_set=pod_set))
        wl.state, wl.announced = "running", False
        wl.admitted_at = now
        objects.job_started(wl.job, active=len(wl.pods), at=now)
        if self.simulate:  # a simulated pod starts at once: recorded Running by this one save
            for p in wl.pods:
                self._sim_start(wl, p, now)
            if wl.job["kind"] == "Job":  # started together: the first rank's exec.running says them all (issue 30)
                objects.gang([p.obj for p in wl.pods], [p.index for p in wl.pods])
        try:
            await self.save(wl)
        except BaseException:
            for p in wl.pods:  # not recorded: the next tick starts them (``_launch_pending``)
                p.phase, p.started, p.sim_end = "Pending", 0.0, 0.0
            raise
        await self._launch_pending(wl)

    async def _launch_pending(self, wl: LocalWorkload) -> None:
        if not wl.announced:  # the Workload's admission (and a RayJob's start) together: one round trip
            # as of the admission (the Admitted condition's time): Kueue's usage counts from then, and the report
            # comes a save and a round trip later, seconds under load. A Job's start (unsuspended, startTime,
            # active) is not published: no reader takes anything from it (its pods say running, its Complete
            # carries the startTime), and it was a watch change a run (issue 30).
            await _all(self.publish(wl, "Workload", wl.workload, "modified", at=wl.admitted_at),
                       *([self.publish(wl, wl.job["kind"], wl.job, "modified", at=wl.admitted_at)]
                         if wl.job["kind"] != "Job" else []))
            wl.announced = True
        # a run's pods are announced together (a bus round trip for all, not one per pod); one that fails stays
        # unannounced and is announced by the next tick
        await self._each(self._announce_simulated(wl, p) for p in wl.pods
                         if self.simulate and p.phase == "Running" and p.sim_end and not p.added)
        for p in wl.pods:
            if p.phase != "Pending":
                continue
            if self.simulate:
                await self._simulate(wl, p)
            else:
                await self.podsync.launch(wl, p)
        if self.simulate and wl.state == "running" and wl.announced and all(p.added for p in wl.pods) and \
                wl.job_view()["kind"] == "Job":
            # started and announced (under the lock: nothing else holds its dicts): a simulated Job's pods end on a
            # timer, and nothing reads its Job or Workload until then, so it runs holding them as JSON too
            wl.pack()

    def _sim_start(self, wl: LocalWorkload, p: LocalPod, now: float) -> None:
        """Simulated pool: no process; the pod "runs" for SIMULATED_DURATION seconds from its env."""
        spec = template(wl.job, p.pod_set)["spec"]  # a Ray cluster's worker: its group's template
        env = {e["name"]: e.get("value", "") for e in spec["containers"][0].get("env", [])}
        p.sim_end = now + float(env.get("SIMULATED_DURATION", "1") or 1)
        p.phase, p.started = "Running", now
        objects.pod_running(p.obj, at=now)

    async def _simulate(self, wl: LocalWorkload, p: LocalPod) -> None:
        """Start a simulated pod whose start was not recorded (its save failed): record it Running, then say so."""
        self._sim_start(wl, p, time.time())
        try:
            await self.save(wl)
        except BaseException:
            # The bus failed (its only server restarting): the pod starts again at the next tick, so its Running
            # status is published then, not lost (the pod's end alone would not say it ever ran).
            p.phase, p.started, p.sim_end = "Pending", 0.0, 0.0
            raise
        await self._announce_simulated(wl, p)

    async def _announce_simulated(self, wl: LocalWorkload, p: LocalPod) -> None:
        """Publish a started simulated pod: its first change already Running, as a watch may first show a pod that
        started at once (one event, not Pending then Running). Saved before: one the bus did not take stays
        unannounced (``added`` False), is published by the next tick (after a restart too), and ends only then.
        A gang's pod past its first rank is not published (issue 30): the first rank's change lists it, and no reader
        takes anything from its own (its start is in the first rank's exec.running, its end in the Job's)."""
        if not objects.listed_by_first_rank(p.obj):
            await self.publish(wl, "Pod", p.obj, "modified" if p.added else "added")
        p.added = True
        self._supervise_at(p.sim_end, wl.name)

    def _supervise_at(self, when: float, name: str) -> None:
        """Supervise workload ``name`` just after ``when`` (a simulated pod's end); workloads due within
        ``SIM_PASS_GAP_S`` of the first share one pass, which touches only them (not every workload held)."""
        heapq.heappush(self._sim_ends, (when, name))
        self._arm_sim_timer()

    def _arm_sim_timer(self) -> None:
        if not self._sim_ends:
            return
        first = self._sim_ends[0][0]
        if self._sim_timer is not None:
            if self._sim_armed <= first:
                return  # an earlier pass is due; it re-arms for this one
            self._sim_timer.cancel()
        loop = asyncio.get_running_loop()
        self._sim_armed = first
        self._sim_timer = loop.call_later(max(0.0, first - time.time()) + SIM_PASS_GAP_S, self._sim_pass)

    def _sim_pass(self) -> None:
        """The ends now due join those no pass has taken yet; a pass is begun unless one already waits for the lock,
        which takes them all once it has it. A pass per timer, each waiting for the lock, piled up while the lock was
        held (Kueue's large-scale through the stack: 2,000 at once, 1.7 KB each, a task, its coroutine and its lock
        waiter), and a backlog's peak is what stays resident after it (issue 27)."""
        self._sim_timer = None
        now = time.time()
        while self._sim_ends and self._sim_ends[0][0] <= now:
            self._sim_due.append(heapq.heappop(self._sim_ends)[1])
        if self._sim_due and not self._sim_queued:
            self._sim_queued = True
            task = asyncio.create_task(self._supervise_due())
            self._sim_passes.add(task)
            task.add_done_callback(self._sim_pass_done)
        self._arm_sim_timer()

    async def _supervise_due(self, names: Iterable[str] = ()) -> None:
        """Simulated pods' ends (``names`` and every end ``_sim_pass`` queued until this pass has the lock): the
        capacity of every run whose pods have all ended is released and admitted first, then the ends are reported.
        Each report is a bus round trip (every pod's end, the Job's, the Workload's, the save) made under the lock,
        with the next pass queued behind it: admission waited for all of them while the quota stood free (under
        load, seconds a batch in Kueue's TAS scenario)."""
        self._sim_due.extend(names)
        async with self.lock:
            due, self._sim_due, self._sim_queued = self._sim_due, [], False
            await self._supervise_many([self.wls[n] for n in dict.fromkeys(due) if n in self.wls])

    async def _supervise_many(self, wls: list[LocalWorkload]) -> None:
        """``_supervise`` each running or deleted workload of ``wls``, once the capacity of those whose simulated
        pods have all ended is released and admitted (see ``_supervise_due``; housekeeping finds ends too)."""
        self._release_ended(wls)
        if self._freed:  # released since the last admission began
            await self._admit()
        # after the admission: a run it preempted is pending again, not to be supervised (nor released). A run whose
        # simulated pods all run, announced, until later has nothing to supervise yet (its ends' timer supervises it
        # then): housekeeping's pass over every run began a step for each of them, every 0.2 s (600 running in
        # Kueue's baseline, each a task of ``_each``'s).
        now = time.time()
        await self._each((self._supervise(wl) for wl in wls
                          if wl.state in ("running", "deleted") and not _simulated_until_later(wl, now)),
                         at_once=STEPS_AT_ONCE)

    def _release_ended(self, wls: Iterable[LocalWorkload]) -> bool:
        """Release the quota and node room of the running simulated workloads whose every pod has ended (as
        ``_supervise`` will find them), before their ends are reported: the capacity is free from then on.
        ``_supervise`` releases them again once reported, which is then a no-op. True if any was released.

        Only a workload the engine holds admitted is released (one a cycle preempted is pending there, still in
        state running here until its preemption is published, and must stay queued). Released by the simulated
        ends' timer itself, outside the lock, admissions outran the ends' reports: in Kueue's full TAS scenario
        the reports fell minutes behind (the local cluster at 375 MB), every housekeeping pass walked the
        unreported runs, and the wall went from 407 to 636 s (01:28 and 01:42, load 8-14 and 2-11)."""
        now, released = time.time(), False
        engine = self.admitter.engine
        for wl in wls:
            if wl.state == "running" and wl.pods and engine is not None and engine.is_admitted(wl.name) and all(
                    p.phase not in ("Running", "Pending") or (p.phase == "Running" and p.sim_end and p.added
                                                              and now >= p.sim_end) for p in wl.pods):
                self.admitter.release(wl.name)
                self._ended_at.setdefault(wl.name, now)
                released = self._freed = True
        return released

    async def _end_simulated(self, wl: LocalWorkload, p: LocalPod, at: float) -> None:
        """A simulated pod's end. A Job's pod is not published ending: its Job's Complete, which follows, says
        every index succeeded (``states`` marks the pods so), and the change cost a watch change and an
        ``exec.progress`` a pod (issue 30). A Ray cluster's pods are (their RayJob's success does not say how
        its workers ended)."""
        if wl.state != "deleted":
            objects.pod_terminated(p.obj, exit_code=0, reason="Completed", message="", started=p.started, at=at)
            if wl.job["kind"] != "Job":  # published first: a failed publish leaves it Running, tried again
                await self.publish(wl, "Pod", p.obj, "modified", at=at)
        p.phase = "Succeeded" if wl.state != "deleted" else "Failed"

    def _sim_pass_done(self, task: asyncio.Task[None]) -> None:
        self._sim_passes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("supervising at a simulated pod's end failed; the 0.2 s timer carries on: %r",
                        task.exception())

    async def _supervise(self, wl: LocalWorkload) -> None:
        """Logs of running pods; simulated pods that are due; the Job's end once no pod runs."""
        ended = []
        for p in wl.pods:
            if p.phase != "Running":
                continue
            if not p.sim_end:
                await self.podsync.ship_logs(wl, p, final=False)
            elif _simulated_end_due(wl, p, time.time()):
                ended.append(p)
        ended_at = self._ended_at.get(wl.name, 0.0)  # when its simulated pods were found ended and released
        await self._each(self._end_simulated(wl, p, ended_at or time.time())
                         for p in ended)  # together: one round trip for the run's pods
        head = next((p for p in wl.pods if p.pod_set == raycluster.HEAD), None)
        if head is not None and head.phase not in ("Running", "Pending"):
            await self._end_workers(wl)  # a Ray cluster ends with its head (the entrypoint), as KubeRay's does
        if any(p.phase in ("Running", "Pending") for p in wl.pods):
            return
        self.admitter.release(wl.name)
        self.wake()  # freed capacity
        if wl.state == "deleted":
            await self._gone(wl)
            return
        # a Ray cluster's outcome is its entrypoint's: the workers were stopped, or left, on their own
        failed = [p for p in ([head] if head is not None else wl.pods) if p.phase != "Succeeded"]
        now = ended_at or time.time()
        if failed:
            reason, msg = failure(failed[0])
            if reason == "EnvironmentFailed":  # never ran: the installer's words are the reason (a RayJob's too)
                msg = failed[0].obj["status"]["containerStatuses"][0]["state"]["terminated"].get("message", msg)
            else:
                reason = "DeadlineExceeded" if reason == "DeadlineExceeded" else "BackoffLimitExceeded"
            objects.job_finished(wl.job, succeeded=False, reason=reason, message=msg, at=now)
        else:
            objects.job_finished(wl.job, succeeded=True, reason="Completed", message="", at=now)
        objects.finish(wl.workload, succeeded=not failed, message="Job finished", at=now)
        # One round trip for both. The Workload's Finished is read only by the hub's dispatcher, which frees a
        # site's reservation on it; elsewhere no reader takes anything from it (the Job's end says the outcome), and
        # it was a watch change a run (issue 30).
        await _all(self.publish(wl, wl.job["kind"], wl.job, "modified", at=ended_at),
                   *([self.publish(wl, "Workload", wl.workload, "modified", at=ended_at)] if self.site else []))
        wl.state = "finished"
        await self.save(wl)
        self._forget(wl)

    async def _end_workers(self, wl: LocalWorkload) -> None:
        """A Ray cluster's head ended: stop its workers (SIGTERM, SIGKILL after the grace) and start no more."""
        for p in wl.pods:
            if p.pod_set != raycluster.WORKERS:
                continue
            if p.phase == "Pending":
                self.podsync.forget(p)
                p.phase = "Deleted"
            elif p.phase == "Running" and p.sim_end:  # simulated: it ends now, with its head
                if p.sim_end > time.time():
                    p.sim_end = time.time()
                    self._supervise_at(p.sim_end, wl.name)
            elif p.phase == "Running" and p.name not in self._ending:
                self._ending.add(p.name)
                await self.podsync.stop(p, "Completed")

    def _forget(self, wl: LocalWorkload, *, may_return: bool = False) -> None:
        """``may_return``: a withdrawn reservation, which nothing ran: the dispatcher may reserve the same workload
        here again after a loss elsewhere, so it is not remembered as done and its objects' versions go on (their
        event ids stay new within the streams' dedup window)."""
        self.wls.pop(wl.name, None)
        self._ended_at.pop(wl.name, None)
        self._ending.difference_update(p.name for p in wl.pods)
        if not may_return:
            _remove_ray_files(wl)
        if may_return:
            return
        self._drop_versions(wl.job, wl.workload, *(p.obj for p in wl.pods))
        # as JSON from here: a batch of ends holds its workloads until the whole batch is done, and a burst's
        # finished workloads' dicts were all alive together (issue 27)
        wl.pack()
        self.finished.add(wl.name)
        self._ended_since_trim += 1

    def _drop_versions(self, *objs: dict[str, Any]) -> None:
        """Forget the resourceVersions of objects that will not change again (one entry per object ever
        published would otherwise grow without bound); an object published after all continues from the
        resourceVersion its metadata carries."""
        for obj in objs:
            self._versions.pop(obj["metadata"].get("uid", obj["metadata"]["name"]), None)

    def _lane(self, wl: LocalWorkload) -> str:
        """The high lane for a workload whose priority class the platform ranks above its workspace's default
        (as the policy decided its ``policy.approved``), so its admission is reported ahead of a backlog."""
        name = str((wl.workload.get("spec") or {}).get("priorityClassName") or "")
        if self.platform is not None and name and self.platform.high_lane(wl.workspace, name):
            return HIGH_LANE
        return ""

    async def publish(self, wl: LocalWorkload, kind: str, obj: dict[str, Any], change: str, *, at: float = 0.0
                      ) -> None:
        """``at``: when the change happened, where that was before this publish (the event's ce-time); now if 0."""
        meta = obj["metadata"]
        uid = meta.get("uid", meta["name"])
        version = self._versions.get(uid, int(meta.get("resourceVersion", "0") or 0)) + 1
        self._versions[uid] = version
        meta["resourceVersion"] = str(version)
        watch = WatchEvent(type=change.upper(), object=slim(obj), cluster=self.name)  # what consumers read
        async with self._inflight:
            await self.bus.publish(
                k8s_subject(self.name, kind, meta.get("namespace", ""), meta["name"], change, lane=wl.lane), watch,
                event_type=f"{kind.lower()}.{change}", ce_subject=wl.run_id, msg_id=f"{uid}.{version}",
                workspace=wl.workspace, attempt=wl.attempt, family="k8s", traceparent=wl.traceparent, user=wl.user,
                time=_iso(at) if at else "",
                dedup=False,  # every publish is the object's next version: its id never repeats (headers_for)
            )


def pending_pass_period(took_s: float) -> float:
    """Seconds until the next pending pass after one that took ``took_s``: ``PENDING_PASS_SHARE`` times as long,
    within ``PENDING_PASS_S`` and ``PENDING_REFRESH_S``."""
    return min(PENDING_REFRESH_S, max(PENDING_PASS_S, PENDING_PASS_SHARE * took_s))


def _simulated_end_due(wl: LocalWorkload, p: LocalPod, now: float) -> bool:
    """Does the simulated pod ``p``, running, end at ``now``: its time is up and it was announced Running first (its
    ends' timer was armed then, ``_announce_simulated``), or its workload was deleted?"""
    return (now >= p.sim_end and p.added) or wl.state == "deleted"


def _simulated_until_later(wl: LocalWorkload, now: float) -> bool:
    """Does ``_supervise`` find nothing to do for ``wl`` at ``now``: a running workload whose pods are all simulated,
    announced Running (so a timer supervises it at their ends) and not due to end (no logs to ship, no end, no
    Job's end)?"""
    return wl.state == "running" and bool(wl.pods) and all(
        p.phase == "Running" and p.sim_end and p.added and not _simulated_end_due(wl, p, now) for p in wl.pods)


async def _all(*steps: Awaitable[None]) -> None:
    """Await ``steps`` together (published in this order: one connection keeps it) and raise the first failure,
    once every step has ended."""
    for result in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


def _iso(at: float) -> str:
    """An event's ce-time for epoch seconds ``at``: RFC 3339 in UTC to the millisecond, as ``envelope.now_iso``."""
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def site_name(cluster: str) -> str:
    """The cluster a site's local cluster is (``TAU_CLUSTER``), refused unless it can be a cluster's name."""
    if not re.fullmatch(NAME_PATTERN, cluster) or cluster == DISPATCH:
        raise ConfigError(f"TAU_SITE is on but TAU_CLUSTER is {cluster!r}: set TAU_CLUSTER to the name platform.yaml's "
                          f"clusters give this site (a-z, 0-9 and '-', up to 40, not {DISPATCH!r})")
    return cluster


def _workspace_user(users: WorkspaceUsers) -> Callable[[Mapping[str, Any]], RunUser]:
    """The OS user a pod runs as: its workspace's (label ``taugrid.io/workspace``)."""
    return lambda pod: users.user(objects.workspace_of(pod))


def _remove_ray_files(wl: LocalWorkload) -> None:
    """A Ray cluster's nodes' session files (logs, sockets), which Ray leaves behind; nothing for other workloads."""
    if wl.head_per_pod and wl.rdzv_port:
        for d in raycluster.temp_dirs(wl.rdzv_port):
            shutil.rmtree(d, ignore_errors=True)


def _admitted_flavors(wl: LocalWorkload) -> dict[str, str]:
    """resource -> flavor from the Workload's recorded admission (empty when it has none)."""
    adm = (wl.workload_view().get("status") or {}).get("admission") or {}
    out: dict[str, str] = {}
    for psa in adm.get("podSetAssignments") or []:
        for r, f in (psa.get("flavors") or {}).items():
            out.setdefault(r, f)
    return out
