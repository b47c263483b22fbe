"""The kube-bridge loop: hold the cluster's lease, run one Watcher per resource, publish every change.

Idempotent: each change is published with ``Nats-Msg-Id = <uid>.<resourceVersion>`` (``.deleted`` appended
for deletions, whose relist-synthesised form repeats the last resourceVersion), so replays after a
reconnect, a relist or a takeover are dropped by the K8S stream's dedup window. The resourceVersion per
resource is checkpointed to the ``bridge`` KV bucket only after the events up to it were stored, so a
restart resumes without a gap. Only the lease holder watches; losing the lease stops the watchers at once.

Trace continuity: each change is published with the ``traceparent`` of the run it belongs to — the
``taugrid.io/traceparent`` annotation the renderer stamps on our objects and pod templates (so Pods carry it,
and Kueue Workloads on their copied pod templates); objects without it (Nodes, Events, foreign objects) are
published with no trace context rather than the bridge's own.

``namespaces`` (``TAU_WATCH_NAMESPACES``, set by the Helm chart when RBAC is namespaced): empty watches every
namespace with one watcher per resource; otherwise each namespaced resource gets one watcher per namespace
(keyed and checkpointed as ``<plural>.<namespace>``), since namespaced RBAC forbids cluster-wide lists.
Cluster-scoped kinds (Nodes, ClusterQueues) are always watched cluster-wide.

Queue snapshot: while it leads, the bridge keeps the ClusterQueues and LocalQueues it watches and, every
``queue_every_s``, asks Kueue's pending-workloads visibility API (``visibility.kueue.x-k8s.io``, where
served and allowed; re-probed every ``VISIBILITY_RETRY_S`` otherwise) for each ClusterQueue's pending
workloads in order, then writes ``taugrid.kube.queues.snapshot`` to the ``local_cluster`` KV bucket under
``queues`` — the key the local cluster writes — so ``tau queue`` reads one place on both backends.

Elastic Jobs and RayJobs (``kube/resize.py``): when a watched Workload is Kueue's admitted scale-up slice of an
elastic Job or RayJob (``kueue.x-k8s.io/workload-slice-replacement-for``), the leader records on it the growth
taugrid asked for
(``taugrid.io/resize-requested`` → ``taugrid.io/resized``, read as ``exec.resized``), after the change itself
is published. A failure there (RBAC, a conflict) is logged and left to the slice's next change. Kueue itself never
changes an elastic Job's size: the leader keeps the watched elastic Jobs and RayJobs, Workloads and queues and,
every ``queue_every_s``, carries out what ``kube/elasticdecide.py`` decides (grow into free quota, shrink for a
pending higher-priority workload) through ``JobScaler.resize`` (a RayJob's Ray cluster: ``resize_rayjob``); the
patched Job is kept at once, so the next round sees
the resize in flight and decides nothing more until Kueue has followed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from taugrid.bus import kv, metrics
from taugrid.bus.connection import Bus
from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import NotFound, PermanentError, TauError, TemporaryError
from taugrid.core.events import k8s_subject
from taugrid.core.ids import token
from taugrid.core.watched import slim
from taugrid.kube import queues
from taugrid.kube.client import KubeApi, Resource
from taugrid.kube.elasticdecide import decide
from taugrid.kube.resize import ELASTIC_JOB, SLICE_REPLACEMENT_FOR, JobScaler
from taugrid.kube.translate import LABEL_JOB_UID, LABEL_RUN_ID, LOCAL_CLUSTER_ANNOTATIONS, traceparent_of
from taugrid.kube.watch import DEFAULT_RESOURCES, Watcher
from taugrid_services.kube_bridge.lease import Checkpoints, Lease

log = logging.getLogger("taugrid.kube_bridge")

BUCKET = "bridge"
QUEUES_BUCKET, QUEUES_KEY = "local_cluster", "queues"  # where `tau queue` reads, on both backends
QUEUE_KINDS = ("ClusterQueue", "LocalQueue")
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")  # newest first; Kueue has served v1beta1 since 0.6
VISIBILITY_RETRY_S = 60.0


def message_id(ev: WatchEvent) -> str:
    meta = ev.object.get("metadata") or {}
    base = f"{meta.get('uid', '')}.{meta.get('resourceVersion', '')}"
    return f"{base}.deleted" if ev.type == "DELETED" else base


def ordering_key(obj: dict[str, Any]) -> str:
    """``ce-subject``: the run when labelled, else the owning job, else the object (keeps per-object order)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    owners = [ref.get("uid") for ref in meta.get("ownerReferences") or [] if ref.get("uid")]
    return str(
        labels.get(LABEL_RUN_ID)
        or labels.get(LABEL_JOB_UID)
        or (owners[0] if owners else "")
        or meta.get("uid")
        or meta.get("name", "")
    )


def without_local_annotations(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (already a copy, ``slim``'s) without the annotations only the local cluster may set
    (``LOCAL_CLUSTER_ANNOTATIONS``): on a real cluster they would be whatever whoever may annotate it wrote."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and not LOCAL_CLUSTER_ANNOTATIONS.isdisjoint(annotations):
        obj["metadata"] = {**meta, "annotations": {k: v for k, v in annotations.items()
                                                    if k not in LOCAL_CLUSTER_ANNOTATIONS}}
    return obj


def _queue_key(obj: dict[str, Any]) -> tuple[str, str]:
    """A queue object's (namespace, name): "" for a ClusterQueue's namespace."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Bridge:
    def __init__(
        self,
        bus: Bus,
        api: KubeApi,
        *,
        cluster: str,
        holder: str | None = None,
        resources: list[tuple[Resource, str | None]] | None = None,
        lease_ttl_s: float = 15.0,
        checkpoint_every_s: float = 2.0,
        watch_timeout_s: int = 300,
        backoff_max_s: float = 30.0,
        namespaces: list[str] | None = None,
        queue_every_s: float = 2.0,
        observers: list[Callable[[WatchEvent], Awaitable[None]]] | None = None,
    ) -> None:
        """``observers``: called with each change once it is published (a site's ``KubeSite.on_change``); a
        failure there is logged and left to the object's next change."""
        self.bus, self.api, self.cluster = bus, api, cluster
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}"
        self.resources = resources if resources is not None else DEFAULT_RESOURCES
        self.lease_ttl_s = lease_ttl_s
        self.checkpoint_every_s = checkpoint_every_s
        self.watch_timeout_s = watch_timeout_s
        self.backoff_max_s = backoff_max_s
        self.namespaces = sorted({n.strip() for n in namespaces or [] if n.strip()})
        self.watchers: dict[str, Watcher] = {}
        self.published = 0
        self._saved: dict[str, str] = {}
        self._safe: dict[str, str | None] = {}
        self._inflight: set[str] = set()
        self.lease: Lease | None = None
        self.checkpoints: Checkpoints | None = None
        self.queue_every_s = queue_every_s
        self.queue_objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in QUEUE_KINDS}
        # queues a watch changed or deleted while they are listed (``_seed_queues``); None when not listing
        self._queues_touched: set[tuple[str, tuple[str, str]]] | None = None
        self.visibility_version: str | None = None
        self._visibility_probed_at = -VISIBILITY_RETRY_S
        self.scaler = JobScaler(api)
        self.elastic_jobs: dict[tuple[str, str], dict[str, Any]] = {}  # full objects: the decider reads their spec
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.observers = list(observers or [])

    async def run(self, stopping: asyncio.Event) -> None:
        """Until ``stopping``: stand by, take the lease when free, watch while holding it."""
        self.lease = Lease(self.bus, BUCKET, f"lease.{token(self.cluster)}", self.holder, ttl_s=self.lease_ttl_s)
        self.checkpoints = Checkpoints(self.bus, BUCKET, token(self.cluster))
        try:
            while not stopping.is_set():
                try:
                    if await self.lease.try_acquire():
                        log.info("%s holds the kube-bridge lease for cluster %s", self.holder, self.cluster)
                        await self._lead(stopping)
                except TemporaryError as exc:
                    log.warning("kube-bridge: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=self.lease_ttl_s / 3)
        finally:
            await self.lease.release()

    async def _lead(self, stopping: asyncio.Event) -> None:
        assert self.lease is not None and self.checkpoints is not None
        tasks = []
        for key, resource, selector, namespace in self._scopes():
            watcher = Watcher(
                self.api,
                resource,
                cluster=self.cluster,
                namespace=namespace,
                label_selector=selector,
                resource_version=await self.checkpoints.get(key),
                timeout_s=self.watch_timeout_s,
                backoff_max_s=self.backoff_max_s,
            )
            self.watchers[key] = watcher
            tasks.append(asyncio.create_task(self._pump(key, watcher), name=f"watch-{key}"))
        if any(resource.kind == "ClusterQueue" for resource, _ in self.resources):
            tasks.append(asyncio.create_task(self._snapshot_queues(stopping), name="queue-snapshot"))
        kinds = {resource.kind for resource, _ in self.resources}
        if {"Workload", "ClusterQueue", "LocalQueue"} <= kinds and kinds & {"Job", "RayJob"}:
            tasks.append(asyncio.create_task(self._resize_elastic(stopping), name="elastic-resize"))
        try:
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stopping.wait(), timeout=min(self.lease_ttl_s / 3, self.checkpoint_every_s)
                    )
                await self._checkpoint()
                if any(t.done() for t in tasks):
                    for t in tasks:
                        if t.done() and not t.cancelled() and t.exception():
                            log.error("kube-bridge: %s stopped: %s", t.get_name(), t.exception())
                    return  # a permanent failure (RBAC): give the lease up, retry later
                if not await self.lease.try_acquire():
                    log.warning("%s lost the kube-bridge lease for %s", self.holder, self.cluster)
                    return
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(TauError):
                await self._checkpoint()
            if self.lease.held and stopping.is_set():
                await self.lease.release()

    def _scopes(self) -> list[tuple[str, Resource, str | None, str | None]]:
        """(watcher key, resource, label selector, namespace or None for all) for every watch to run."""
        out: list[tuple[str, Resource, str | None, str | None]] = []
        for resource, selector in self.resources:
            if resource.namespaced and self.namespaces:
                out += [(f"{resource.plural}.{ns}", resource, selector, ns) for ns in self.namespaces]
            else:
                out.append((resource.plural, resource, selector, None))
        return out

    async def _pump(self, plural: str, watcher: Watcher) -> None:
        async for ev in watcher:
            # The watcher's resourceVersion already covers ``ev``; it is safe to checkpoint only once stored.
            self._inflight.add(plural)
            await self.publish(ev)
            self._inflight.discard(plural)
            self._safe[plural] = watcher.resource_version
            self._keep_queue(ev)
            self._keep_elastic(ev)
            await self._elastic_slice(ev)
            for observe in self.observers:
                try:
                    await observe(ev)
                except TauError as exc:  # the Kubernetes API refused or was away: the next change tries again
                    log.warning("kube-bridge: acting on %s: %s", (ev.object.get("metadata") or {}).get("name"), exc)

    async def _elastic_slice(self, ev: WatchEvent) -> None:
        """An admitted scale-up slice: its Job's requested growth is done (``JobScaler.confirm_slice``)."""
        obj = ev.object
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if obj.get("kind") != "Workload" or ev.type == "DELETED" or SLICE_REPLACEMENT_FOR not in annotations:
            return
        try:
            await self.scaler.confirm_slice(obj)
        except TauError as exc:  # the Job gone, RBAC, a conflict: the slice's next change tries again
            log.warning("kube-bridge: recording the growth of workload slice %s: %s",
                        (obj.get("metadata") or {}).get("name"), exc)

    def _keep_elastic(self, ev: WatchEvent) -> None:
        """The elastic Jobs and the Workloads the resize decisions read, as the watch last showed them."""
        kind = str(ev.object.get("kind") or "")
        meta = ev.object.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        store = self.workloads if kind == "Workload" else self.elastic_jobs if kind in ("Job", "RayJob") else None
        if store is None:
            return
        if ev.type == "DELETED" or (kind != "Workload" and (meta.get("annotations") or {}).get(ELASTIC_JOB) != "true"):
            store.pop(key, None)
        else:
            store[key] = ev.object

    async def _resize_elastic(self, stopping: asyncio.Event) -> None:
        """Every ``queue_every_s``: carry out the decider's resizes of running elastic Jobs."""
        while not stopping.is_set():
            decisions = decide(cluster_queues=self.queue_objects["ClusterQueue"].values(),
                               local_queues=self.queue_objects["LocalQueue"].values(),
                               workloads=self.workloads.values(), jobs=self.elastic_jobs, now=time.time())
            for d in decisions:
                resize = self.scaler.resize_rayjob if d.kind == "RayJob" else self.scaler.resize
                try:
                    self.elastic_jobs[(d.namespace, d.job)] = await resize(
                        d.namespace, d.job, d.pods, cause=d.cause, preemptor=d.preemptor)
                    log.info("kube-bridge: %s %s/%s to %d pods (%s)", d.kind, d.namespace, d.job, d.pods, d.cause)
                except TauError as exc:  # a conflict, the Job gone, RBAC: the next round decides again
                    log.warning("kube-bridge: resizing %s %s/%s to %d pods: %s", d.kind, d.namespace, d.job, d.pods,
                                exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=self.queue_every_s)

    def _keep_queue(self, ev: WatchEvent) -> None:
        kind = str(ev.object.get("kind") or "")
        if kind not in self.queue_objects:
            return
        key = _queue_key(ev.object)
        if self._queues_touched is not None:  # being listed (``_seed_queues``): what the watch says is newer
            self._queues_touched.add((kind, key))
        if ev.type == "DELETED":
            self.queue_objects[kind].pop(key, None)
        else:
            self.queue_objects[kind][key] = ev.object

    async def _seed_queues(self) -> None:
        """The snapshot's queues whole as this lead begins: each queue kind listed once (by its watcher's scope)
        and taken as the view, replacing what an earlier lead kept (a queue deleted since is gone). Its watch
        delivers them too, but one resumed from its checkpoint only what changed since, and one that lists first
        one at a time: a snapshot of what it had delivered missed every queue that had not changed, or most of
        them. What a watch delivered while the list was read is newer and stays (a deletion too)."""
        self._queues_touched = set()
        try:
            listed: dict[str, dict[tuple[str, str], dict[str, Any]]] = {kind: {} for kind in self.queue_objects}
            for key, resource, _, _ in self._scopes():
                if resource.kind in listed:
                    items, _ = await self.watchers[key].listed()
                    listed[resource.kind].update((_queue_key(item), item) for item in items)
            touched = self._queues_touched
            for kind, kept in self.queue_objects.items():
                view = {k: v for k, v in listed[kind].items() if (kind, k) not in touched}
                view.update((k, v) for k, v in kept.items() if (kind, k) in touched)
                kept.clear()
                kept.update(view)
        finally:
            self._queues_touched = None

    async def _snapshot_queues(self, stopping: asyncio.Event) -> None:
        """Every ``queue_every_s``: the queue snapshot into KV, once the queues were listed (``_seed_queues``;
        nothing while there is no ClusterQueue)."""
        seeded = False
        while not stopping.is_set():
            if not seeded:
                try:
                    await self._seed_queues()
                    seeded = True
                except TauError as exc:  # the API away or refusing: no snapshot yet, listed again next round
                    log.warning("kube-bridge: listing the queues for their snapshot: %s", exc)
            cqs = list(self.queue_objects["ClusterQueue"].values()) if seeded else []
            if cqs:
                pending = await self._pending([str(cq["metadata"]["name"]) for cq in cqs])
                snap = queues.snapshot(cqs, self.queue_objects["LocalQueue"].values(), pending=pending,
                                       cluster=self.cluster, now=time.time())
                metrics.observe_queues(snap["queues"])
                try:
                    await kv.put(self.bus, QUEUES_BUCKET, QUEUES_KEY, msgspec.json.encode(snap))
                except Exception as exc:  # NATS briefly away: the next round writes a fresher one
                    log.warning("kube-bridge: queue snapshot not written: %r", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=self.queue_every_s)

    async def _pending(self, names: list[str]) -> dict[str, dict[str, Any]] | None:
        """ClusterQueue → its PendingWorkloadsSummary, or None where the visibility API is not served/allowed."""
        if self.visibility_version is None:
            if time.monotonic() - self._visibility_probed_at < VISIBILITY_RETRY_S:
                return None
            self._visibility_probed_at = time.monotonic()
        versions = [self.visibility_version] if self.visibility_version else list(VISIBILITY_VERSIONS)
        out: dict[str, dict[str, Any]] = {}
        for name in names:
            for version in versions:
                path = f"/apis/{VISIBILITY_GROUP}/{version}/clusterqueues/{name}/pendingworkloads"
                try:
                    out[name] = await self.api.request("GET", path, what=f"pending workloads of {name}",
                                                       query={"limit": 1000})
                except NotFound:
                    continue  # this version is not served (or the queue just went away)
                except (PermanentError, TemporaryError) as exc:  # 403: RBAC lacks visibility get
                    log.warning("kube-bridge: visibility API: %s", exc)
                    self.visibility_version = None
                    return None
                self.visibility_version = version
                versions = [version]
                break
            if self.visibility_version is None:
                break  # no version answered for the first queue: the API is not served here
        if self.visibility_version is None:
            log.info("kube-bridge: Kueue's visibility API is not served; `tau queue` shows counts only")
            return None
        return out

    async def publish(self, ev: WatchEvent) -> None:
        meta = ev.object.get("metadata") or {}
        kind = str(ev.object.get("kind") or "")
        subject = k8s_subject(
            self.cluster, kind, meta.get("namespace") or "", meta.get("name") or "", ev.type
        )
        carried = WatchEvent(type=ev.type, object=without_local_annotations(slim(ev.object)),
                             cluster=ev.cluster)  # what consumers read
        while True:
            try:
                await self.bus.publish(
                    subject,
                    carried,
                    event_type=f"{kind.lower()}.{ev.type.lower()}",
                    ce_subject=ordering_key(ev.object),
                    msg_id=message_id(ev),
                    family="k8s",
                    traceparent=traceparent_of(ev.object),
                )
                break
            except TemporaryError as exc:  # NATS is down: hold the watch, do not skip the change
                log.warning("kube-bridge: %s", exc)
                await asyncio.sleep(exc.delay)
        self.published += 1

    async def _checkpoint(self) -> None:
        assert self.checkpoints is not None
        for plural, watcher in self.watchers.items():
            rv = self._safe.get(plural) if plural in self._inflight else watcher.resource_version
            if rv and self._saved.get(plural) != rv:
                await self.checkpoints.put(plural, rv)
                self._saved[plural] = rv
