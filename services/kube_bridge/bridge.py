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
Cluster-scoped kinds (Nodes) are always watched cluster-wide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from taugrid.bus.connection import Bus
from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import TauError, TemporaryError
from taugrid.core.events import k8s_subject
from taugrid.core.ids import token
from taugrid.kube.client import KubeApi, Resource
from taugrid.kube.translate import LABEL_JOB_UID, LABEL_RUN_ID, traceparent_of
from taugrid.kube.watch import DEFAULT_RESOURCES, Watcher
from taugrid_services.kube_bridge.lease import Checkpoints, Lease

log = logging.getLogger("taugrid.kube_bridge")

BUCKET = "bridge"


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
    ) -> None:
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

    async def run(self, stopping: asyncio.Event) -> None:
        """Until ``stopping``: stand by, take the lease when free, watch while holding it."""
        kv = await self.bus.kv(BUCKET)
        self.lease = Lease(kv, f"lease.{token(self.cluster)}", self.holder, ttl_s=self.lease_ttl_s)
        self.checkpoints = Checkpoints(kv, token(self.cluster))
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

    async def publish(self, ev: WatchEvent) -> None:
        meta = ev.object.get("metadata") or {}
        kind = str(ev.object.get("kind") or "")
        subject = k8s_subject(
            self.cluster, kind, meta.get("namespace") or "", meta.get("name") or "", ev.type
        )
        while True:
            try:
                await self.bus.publish(
                    subject,
                    ev,
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
