"""List+watch one Kubernetes resource and yield its changes as ``WatchEvent``s.

Invariants:
  * No transition is lost: the watch resumes from the last resourceVersion yielded (or bookmarked) after a
    dropped connection or a server-side timeout; a resourceVersion the server has compacted (410 Gone)
    triggers a relist whose diff against the known set is emitted — ADDED for new objects, MODIFIED for
    changed ones, DELETED (with the last known object) for vanished ones.
  * No change is yielded twice: events are deduplicated by (uid, resourceVersion) against the known set.
  * ``resource_version`` after a yield covers that event: a caller that persists it after handling the
    event and passes it back on restart resumes exactly there. (After a restart the known set is empty,
    so deletions that happened while down *and* fell behind a 410 cannot be synthesised.)
  * API errors and broken streams back off with full jitter; a PermanentError (RBAC, unknown resource)
    propagates to the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from taugrid.core.contracts import WatchEvent
from taugrid.core.errors import NotFound, TemporaryError
from taugrid.kube.client import Gone, KubeApi, Resource, backoff_delay, resource_for

log = logging.getLogger(__name__)

MANAGED_SELECTOR = "taugrid.io/managed-by=taugrid"

# What the kube-bridge watches, with the label selector each needs (Workloads and Nodes carry no tau labels).
DEFAULT_RESOURCES: list[tuple[Resource, str | None]] = [
    (resource_for("Workload"), None),
    (resource_for("Job"), MANAGED_SELECTOR),
    (resource_for("RayJob"), MANAGED_SELECTOR),
    (resource_for("Pod"), MANAGED_SELECTOR),
    (resource_for("Node"), None),
    (resource_for("Event"), None),
    (resource_for("ClusterQueue"), None),  # `tau queue` on Kubernetes (kube-bridge's queue snapshot)
    (resource_for("LocalQueue"), None),
]


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Watcher:
    """``async for ev in Watcher(api, resource, ...)`` — endless; cancel the task to stop."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        *,
        cluster: str = "local",
        namespace: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_s: int = 300,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.cluster = cluster
        self.namespace = namespace
        self.label_selector = label_selector
        self.resource_version = resource_version or None
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.known: dict[str, dict[str, Any]] = {}  # uid → last object seen
        self._recently_deleted: dict[tuple[str, str], None] = {}  # insertion-ordered, bounded
        self.relists = 0

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self.events()

    async def events(self) -> AsyncIterator[WatchEvent]:
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    async for ev in self._relist():
                        yield ev
                async for ev in self._watch():
                    failures = 0
                    yield ev
                failures = 0  # the server closed the watch (timeoutSeconds): simply watch again
            except Gone:
                log.info(
                    "%s: resourceVersion %s expired; relisting", self.resource.plural, self.resource_version
                )
                self.resource_version = None
            except (TemporaryError, NotFound) as exc:
                delay = max(
                    getattr(exc, "delay", 0.0),
                    backoff_delay(failures, initial=self.backoff_initial_s, cap=self.backoff_max_s),
                )
                delay = min(delay, self.backoff_max_s)
                failures += 1
                log.warning("%s watch failed (%s); retrying in %.2fs", self.resource.plural, exc, delay)
                await asyncio.sleep(delay)

    def _query(self) -> dict[str, str]:
        query = {}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        return query

    async def listed(self) -> tuple[list[dict[str, Any]], str]:
        """Every object in scope now, page by page (each with its apiVersion and kind), and the list's
        resourceVersion; changes nothing here (``_relist`` is what also adopts them)."""
        path = self.resource.path(self.namespace)
        items: list[dict[str, Any]] = []
        query = self._query()
        while True:
            page = await self.api.request(
                "GET", path, what=f"list {self.resource.plural}", query={**query, "limit": "500"}
            )
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            query = {**self._query(), "continue": meta["continue"]}
        api_version, kind = self.resource.api_version, self.resource.kind
        for item in items:
            # List items omit apiVersion/kind; restore them so every emitted object is self-describing.
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items, str(meta.get("resourceVersion") or "")

    async def _relist(self) -> AsyncIterator[WatchEvent]:
        """List everything; emit the difference against the known set; adopt the list's resourceVersion."""
        items, list_rv = await self.listed()
        self.relists += 1
        current: dict[str, dict[str, Any]] = {_uid(item): item for item in items}
        previous, self.known = self.known, current
        events = []
        for uid, obj in current.items():
            old = previous.get(uid)
            if old is None:
                events.append(WatchEvent(type="ADDED", object=obj, cluster=self.cluster))
            elif _rv(old) != _rv(obj):
                events.append(WatchEvent(type="MODIFIED", object=obj, cluster=self.cluster))
        for uid, obj in previous.items():
            if uid not in current:
                events.append(WatchEvent(type="DELETED", object=obj, cluster=self.cluster))
        for i, ev in enumerate(events):
            if i == len(events) - 1:  # only the last one covers the whole list
                self.resource_version = list_rv or None
            yield ev
        self.resource_version = list_rv or None

    async def _watch(self) -> AsyncIterator[WatchEvent]:
        query = {
            **self._query(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.timeout_s),
        }
        if self.resource_version:
            query["resourceVersion"] = self.resource_version
        stream = self.api.stream(
            self.resource.path(self.namespace),
            what=f"watch {self.resource.plural}",
            query=query,
            read_timeout_s=self.timeout_s + 30,
        )
        async for raw in stream:
            ev_type, obj = raw.get("type"), raw.get("object") or {}
            if ev_type == "BOOKMARK":
                self.resource_version = _rv(obj) or self.resource_version
                continue
            if ev_type == "ERROR":
                code = int(obj.get("code") or 0)
                message = str(obj.get("message") or obj.get("reason") or "")
                if code == 410:
                    raise Gone(f"watch {self.resource.plural}: {message}", delay=0.0)
                raise TemporaryError(f"watch {self.resource.plural}: ERROR {code} {message}", delay=1.0)
            if ev_type not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            uid, rv = _uid(obj), _rv(obj)
            obj.setdefault("apiVersion", self.resource.api_version)
            obj.setdefault("kind", self.resource.kind)
            old = self.known.get(uid)
            if ev_type == "DELETED":
                if (uid, rv) in self._recently_deleted:
                    continue  # a replay after a reconnect: already emitted
                self.known.pop(uid, None)
                self._recently_deleted[(uid, rv)] = None
                while len(self._recently_deleted) > 4096:
                    del self._recently_deleted[next(iter(self._recently_deleted))]
            else:
                if old is not None and _rv(old) == rv:
                    self.resource_version = rv or self.resource_version
                    continue  # a replay after a reconnect: already emitted
                self.known[uid] = obj
            self.resource_version = rv or self.resource_version
            yield WatchEvent(type=ev_type, object=obj, cluster=self.cluster)
