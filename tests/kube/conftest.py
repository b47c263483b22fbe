"""A scripted Kubernetes API served over real HTTP by kmock, for kubernetes-asyncio to talk to.

kmock's own ``KubernetesEmulator`` keeps objects but assigns no uid/resourceVersion, ignores
``resourceVersion`` on watch, and PATCH cannot create (so no server-side apply). This fake adds exactly
those semantics on top of kmock's ``RawHandler`` + ``Server``: SSA create-or-update (a no-op apply keeps the
resourceVersion), uids, a history for watch resume, 410 after compaction, bookmarks, label selectors,
injected HTTP faults and abrupt TCP drops of open watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest

from taugrid.kube.client import make_api_client
from tests.kube.fakelogs import FakeLogs

ResKey = tuple[str, str, str]  # group, version, plural


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[ResKey, str | None, str], dict[str, Any]] = {}
        self.rv = 100
        self.history: list[tuple[int, ResKey, str, dict[str, Any]]] = []
        self.compacted_below = 0
        self.faults: list[dict[str, Any]] = []
        self.watches: list[asyncio.Queue[Any]] = []
        self.watch_requests: list[dict[str, str]] = []
        self.deletes: list[dict[str, Any]] = []
        self.applies: list[dict[str, Any]] = []
        self.evictions: list[dict[str, Any]] = []
        self.pdb_blocked: set[tuple[str | None, str]] = set()  # (namespace, pod): evictions answer 429
        self.logs = FakeLogs()  # the pod log endpoint (tests/kube/fakelogs.py)
        # Kueue's pending-workloads visibility API (visibility.kueue.x-k8s.io/<version>), per ClusterQueue:
        # name → PendingWorkloadsSummary items. None = not served (404, as on a Kueue without it).
        self.pending_workloads: dict[str, list[dict[str, Any]]] | None = None
        self.visibility_version = "v1beta1"
        self.visibility_requests: list[dict[str, Any]] = []

    # ---- scripting from tests

    def fail(
        self,
        method: str,
        status: int,
        message: str = "",
        *,
        times: int = 1,
        headers: dict[str, str] | None = None,
        reason: str = "",
    ) -> None:
        self.faults.append(
            {
                "method": method.upper(),
                "status": status,
                "message": message,
                "times": times,
                "headers": headers or {},
                "reason": reason or "Failure",
            }
        )

    def put(self, res: ResKey, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace (as a controller would), bumping the resourceVersion."""
        meta = obj.setdefault("metadata", {})
        key = (res, meta.get("namespace"), meta["name"])
        existed = key in self.objects
        meta.setdefault("uid", self.objects[key]["metadata"]["uid"] if existed else str(uuid.uuid4()))
        return self._commit(res, key, obj, "MODIFIED" if existed else "ADDED")

    def modify(
        self, res: ResKey, namespace: str | None, name: str, change: Callable[[dict[str, Any]], None]
    ) -> None:
        obj = copy.deepcopy(self.objects[(res, namespace, name)])
        change(obj)
        self._commit(res, (res, namespace, name), obj, "MODIFIED")

    def remove(self, res: ResKey, namespace: str | None, name: str) -> None:
        obj = self.objects.pop((res, namespace, name))
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(res, "DELETED", obj)

    def compact(self) -> None:
        self.compacted_below = self.rv  # watching from the current revision stays valid
        self.history.clear()

    def bookmark(self) -> None:
        for q in self.watches:
            q.put_nowait(("BOOKMARK", None))

    def drop_watches(self) -> None:
        for q in self.watches:
            q.put_nowait(("DROP", None))

    # ---- internals

    def _commit(self, res: ResKey, key: Any, obj: dict[str, Any], ev_type: str) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self._emit(res, ev_type, obj)
        return obj

    def _emit(self, res: ResKey, ev_type: str, obj: dict[str, Any]) -> None:
        snapshot = copy.deepcopy(obj)
        self.history.append((self.rv, res, ev_type, snapshot))
        for q in self.watches:
            q.put_nowait((ev_type, (res, snapshot)))

    @staticmethod
    def _selected(obj: dict[str, Any], params: dict[str, str]) -> bool:
        fields, labels = params.get("fieldSelector") or "", params.get("labelSelector") or ""
        return FakeKube._fields_selected(obj, fields) and FakeKube._labels_selected(obj, labels)

    @staticmethod
    def _labels_selected(obj: dict[str, Any], selector: str) -> bool:
        if not selector:
            return True
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))

    @staticmethod
    def _fields_selected(obj: dict[str, Any], selector: str) -> bool:
        for term in filter(None, selector.split(",")):
            path, want = term.split("=", 1)
            value: Any = obj
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if str(value if value is not None else "") != want:
                return False
        return True

    @staticmethod
    def _merge_patch(target: Any, patch: Any) -> Any:
        """RFC 7386 JSON merge patch."""
        if not isinstance(patch, dict):
            return copy.deepcopy(patch)
        out = copy.deepcopy(target) if isinstance(target, dict) else {}
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = FakeKube._merge_patch(out.get(k), v)
        return out

    @staticmethod
    def _conflict(name: str) -> Any:
        return kmock.Response(
            status=409,
            payload={"kind": "Status", "code": 409, "reason": "Conflict",
                     "message": f'Operation cannot be fulfilled on "{name}": the object has been modified; '
                                "please apply your changes to the latest version and try again"},
        )

    def _subresource(
        self, method: str, res: ResKey, ns: str | None, name: str, sub: str, request: Any
    ) -> Any:
        key = (res, ns, name)
        if method == "PATCH" and sub == "status":
            self.applies.append({"params": dict(request.params), "subresource": sub, "body": request.data,
                                 "content_type": request.headers.get("Content-Type", "")})
            old = self.objects.get(key)
            if old is None:
                return self._not_found(name)
            merged = copy.deepcopy(old)
            status = merged.setdefault("status", {})
            for field, value in ((request.data or {}).get("status") or {}).items():
                if field == "conditions":
                    by_type = {c.get("type"): c for c in status.get("conditions") or []}
                    by_type.update({c.get("type"): c for c in value})
                    status["conditions"] = list(by_type.values())
                else:
                    status[field] = value
            return old if merged == old else self._commit(res, key, merged, "MODIFIED")
        if method == "GET" and sub == "pendingworkloads" and res[0] == "visibility.kueue.x-k8s.io":
            self.visibility_requests.append({"version": res[1], "queue": name, "params": dict(request.params)})
            if self.pending_workloads is None or res[1] != self.visibility_version:
                return kmock.Response(status=404, payload={"kind": "Status", "code": 404, "reason": "NotFound",
                                                           "message": "the server could not find the requested "
                                                                      "resource"})
            items = self.pending_workloads.get(name, [])[: int(request.params.get("limit", 1000))]
            return {"kind": "PendingWorkloadsSummary", "apiVersion": f"{res[0]}/{res[1]}", "metadata": {},
                    "items": copy.deepcopy(items)}
        if method == "POST" and sub == "eviction":
            self.evictions.append({"namespace": ns, "name": name, "body": request.data})
            if key not in self.objects:
                return self._not_found(name)
            if (ns, name) in self.pdb_blocked:
                return kmock.Response(
                    status=429,
                    payload={"kind": "Status", "code": 429, "reason": "TooManyRequests",
                             "message": "Cannot evict pod as it would violate the pod's disruption budget."},
                )
            self.remove(res, ns, name)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        if method == "GET" and sub == "log":
            if key not in self.objects:
                return self._not_found(name)
            stream = self.logs.serve(ns, name, request)
            if stream is None:
                container = request.params.get("container", "")
                return kmock.Response(status=400, payload={
                    "kind": "Status", "code": 400, "reason": "BadRequest",
                    "message": f'container "{container}" in pod "{name}" is waiting to start: PodInitializing'})
            return stream
        return kmock.Response(status=405, payload={"kind": "Status", "code": 405, "message": "not supported"})

    def _merge_patch_object(self, res: ResKey, ns: str | None, name: str, request: Any) -> Any:
        self.applies.append({"params": dict(request.params), "body": request.data,
                             "content_type": request.headers.get("Content-Type", "")})
        key = (res, ns, name)
        old = self.objects.get(key)
        if old is None:
            return self._not_found(name)
        patch = copy.deepcopy(request.data or {})
        want_rv = (patch.get("metadata") or {}).pop("resourceVersion", None)
        if want_rv is not None and str(want_rv) != old["metadata"]["resourceVersion"]:
            return self._conflict(name)
        merged = self._merge_patch(old, patch)
        return old if merged == old else self._commit(res, key, merged, "MODIFIED")

    def _in_scope(
        self,
        res: ResKey,
        ns: str | None,
        obj: dict[str, Any],
        want: ResKey,
        params: dict[str, str],
        want_ns: str | None,
    ) -> bool:
        return res == want and (want_ns is None or ns == want_ns) and self._selected(obj, params)

    def handle(self, request: kmock.Request) -> Any:
        method = str(request.method).upper().split(".")[-1]
        for fault in self.faults:
            if fault["method"] == method and fault["times"] > 0:
                fault["times"] -= 1
                return kmock.Response(
                    status=fault["status"],
                    headers=fault["headers"],
                    payload={
                        "apiVersion": "v1",
                        "kind": "Status",
                        "status": "Failure",
                        "code": fault["status"],
                        "reason": fault["reason"],
                        "message": fault["message"],
                    },
                )
        if request.resource is None:
            return kmock.Response(
                status=404, payload={"kind": "Status", "code": 404, "message": "no such path"}
            )
        res: ResKey = (
            request.resource.group or "",
            request.resource.version or "",
            request.resource.plural or "",
        )
        ns, name, params = request.namespace, request.name, dict(request.params)
        if name and request.subresource:
            return self._subresource(method, res, ns, name, request.subresource, request)
        if method == "PATCH" and name and "merge-patch" in request.headers.get("Content-Type", ""):
            return self._merge_patch_object(res, ns, name, request)
        if method == "GET" and params.get("watch") in ("true", "1"):
            self.watch_requests.append(params)
            return self._watch(request, res, ns, params)
        if method == "GET" and name:
            obj = self.objects.get((res, ns, name))
            return obj if obj else self._not_found(name)
        if method == "GET":
            items = [o for (r, n, _), o in self.objects.items() if self._in_scope(r, n, o, res, params, ns)]
            return {
                "kind": "List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": copy.deepcopy(items),
            }
        if method == "PATCH" and name:
            self.applies.append(
                {
                    "params": params,
                    "content_type": request.headers.get("Content-Type", ""),
                    "body": request.data,
                }
            )
            key = (res, ns, name)
            body = copy.deepcopy(request.data)
            old = self.objects.get(key)
            if old is not None:
                merged = copy.deepcopy(old)
                for field, value in body.items():
                    if field == "metadata":
                        merged["metadata"].update({k: v for k, v in value.items()})
                    elif field != "status":
                        merged[field] = value
                if merged == old:
                    return old  # a no-op apply changes nothing, not even the resourceVersion
                return self._commit(res, key, merged, "MODIFIED")
            body["metadata"]["uid"] = str(uuid.uuid4())
            body["metadata"]["managedFields"] = [
                {"manager": params.get("fieldManager"), "operation": "Apply"}
            ]
            return self._commit(res, key, body, "ADDED")
        if method == "DELETE" and name:
            self.deletes.append({"name": name, "namespace": ns, "body": request.data})
            if (res, ns, name) not in self.objects:
                return self._not_found(name)
            obj = self.objects[(res, ns, name)]
            self.remove(res, ns, name)
            return obj
        return kmock.Response(status=405, payload={"kind": "Status", "code": 405, "message": "not supported"})

    @staticmethod
    def _not_found(name: str) -> Any:
        return kmock.Response(
            status=404,
            payload={"kind": "Status", "code": 404, "reason": "NotFound", "message": f'"{name}" not found'},
        )

    async def _watch(
        self, request: kmock.Request, res: ResKey, ns: str | None, params: dict[str, str]
    ) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.watches.append(queue)
        try:
            yield b""  # send the headers now
            since = params.get("resourceVersion")
            if since and int(since) < self.compacted_below:
                yield {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": 410,
                        "reason": "Expired",
                        "message": f"too old resource version: {since} ({self.rv})",
                    },
                }
                return
            if not since:
                for (r, n, _), o in list(self.objects.items()):
                    if self._in_scope(r, n, o, res, params, ns):
                        yield {"type": "ADDED", "object": copy.deepcopy(o)}
            else:
                for rv, r, ev_type, o in list(self.history):
                    if rv > int(since) and self._in_scope(
                        r, o["metadata"].get("namespace"), o, res, params, ns
                    ):
                        yield {"type": ev_type, "object": o}
            while True:
                ev_type, payload = await queue.get()
                if ev_type == "DROP":
                    transport = request._raw_request.transport if request._raw_request else None
                    if transport is not None:
                        transport.abort()
                    return
                if ev_type == "BOOKMARK":
                    if params.get("allowWatchBookmarks") == "true":
                        yield {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": "Pod",
                                "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self.rv)},
                            },
                        }
                    continue
                r, o = payload
                if self._in_scope(r, o["metadata"].get("namespace"), o, res, params, ns):
                    yield {"type": ev_type, "object": o}
        finally:
            self.watches.remove(queue)


def _with_status(answer: Any) -> Any:
    return answer if isinstance(answer, kmock.Response) else kmock.Response(status=200, payload=answer)


@contextlib.asynccontextmanager
async def emulated_api(fake: FakeKube) -> AsyncIterator[tuple[str, Any]]:
    """``fake`` served over real HTTP: (its URL, a kubernetes-asyncio ApiClient for it), both gone on exit."""
    async with kmock.RawHandler() as handler, kmock.Server(handler) as server:
        # kmock copies the status of a returned Response onto the reaction itself (it sticks for later
        # requests), so every answer carries its own status explicitly.
        handler << (lambda request: _with_status(fake.handle(request)))
        url = str(server.url).rstrip("/")
        api_client = await make_api_client(host=url)
        try:
            yield url, api_client
        finally:
            await api_client.close()


@pytest.fixture
async def fake_kube() -> AsyncIterator[tuple[FakeKube, Any]]:
    """(FakeKube, ApiClient) — a fresh API server per test."""
    fake = FakeKube()
    async with emulated_api(fake) as (_, api_client):
        yield fake, api_client
