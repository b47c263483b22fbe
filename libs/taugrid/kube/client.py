"""Kubernetes API access: build an ApiClient, make raw REST calls, translate every failure.

``KubeApi`` speaks plain JSON over ``ApiClient.call_api`` (any group/version/kind, no generated models), so
``apply`` and ``watch`` need no per-kind client. Resource paths come from a small table of the kinds we
touch (no discovery round trip); an unknown kind falls back to the usual lower-case plural.

Invariants: no kubernetes_asyncio/aiohttp exception leaves this module. 400/403/422 (and 401, and a 409 that
retrying cannot fix) → ``PermanentError`` carrying the server's message; 429/5xx/connection failures →
``TemporaryError`` with ``delay`` from Retry-After or backoff, after ``retries`` quick in-place retries;
404 → ``NotFound``; 410 → ``Gone`` (a TemporaryError: the caller must relist).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, NamedTuple

import aiohttp
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from taugrid.core.errors import NotFound, PermanentError, TemporaryError
from taugrid.settings import KubeSettings, current


class Gone(TemporaryError):
    """410: the requested resourceVersion is too old (compacted). Relist, then watch again."""


class Resource(NamedTuple):
    api_version: str  # "v1", "batch/v1", "ray.io/v1", "kueue.x-k8s.io/v1beta2"
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


_KNOWN = [
    Resource("v1", "Pod", "pods"),
    Resource("v1", "Event", "events"),
    Resource("v1", "Node", "nodes", False),
    Resource("v1", "Namespace", "namespaces", False),
    Resource("v1", "ConfigMap", "configmaps"),
    Resource("v1", "Secret", "secrets"),
    Resource("v1", "Service", "services"),
    Resource("v1", "ServiceAccount", "serviceaccounts"),
    Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    Resource("batch/v1", "Job", "jobs"),
    Resource("ray.io/v1", "RayJob", "rayjobs"),
    Resource("ray.io/v1", "RayCluster", "rayclusters"),
    Resource("kueue.x-k8s.io/v1beta2", "Workload", "workloads"),
    Resource("kueue.x-k8s.io/v1beta2", "LocalQueue", "localqueues"),
    Resource("kueue.x-k8s.io/v1beta2", "ClusterQueue", "clusterqueues", False),
    Resource("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", False),
    Resource("kueue.x-k8s.io/v1beta2", "Topology", "topologies", False),  # Kueue TAS (cluster-scoped)
    Resource("kueue.x-k8s.io/v1beta2", "Cohort", "cohorts", False),
    Resource("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", False),
    Resource("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
    Resource("scheduling.run.ai/v2", "Queue", "queues", False),  # KAI Scheduler's queue (cluster-scoped)
    Resource("events.k8s.io/v1", "Event", "events"),
]
_BY_KIND: dict[str, Resource] = {}
for _r in _KNOWN:
    _BY_KIND.setdefault(_r.kind, _r)  # first wins: core/v1 Event is "Event"
_BY_GVK = {(r.api_version, r.kind): r for r in _KNOWN}


def resource_for(kind: str, api_version: str | None = None) -> Resource:
    """The REST resource of ``kind`` (in ``api_version`` when given)."""
    if api_version:
        known = _BY_GVK.get((api_version, kind))
        if known:
            return known
        lower = kind.lower()
        plural = lower[:-1] + "ies" if lower.endswith("y") else lower + ("es" if lower.endswith("s") else "s")
        namespaced = _BY_KIND[kind].namespaced if kind in _BY_KIND else True
        return Resource(api_version, kind, plural, namespaced)
    if kind not in _BY_KIND:
        raise PermanentError(f"unknown kind {kind!r}: pass its apiVersion (known: {sorted(_BY_KIND)})")
    return _BY_KIND[kind]


async def make_api_client(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    host: str | None = None,
    token: str | None = None,
    verify_ssl: bool = True,
) -> k8s_client.ApiClient:
    """An ApiClient from an explicit ``host`` (tests, proxies), in-cluster service account, or a kubeconfig.

    ``in_cluster=None`` tries the service account first and falls back to the kubeconfig (``$KUBECONFIG``).
    """
    try:
        if host:
            cfg = k8s_client.Configuration(host=host)
            cfg.verify_ssl = verify_ssl
            if token:
                cfg.api_key = {"authorization": token}
                cfg.api_key_prefix = {"authorization": "Bearer"}
            return k8s_client.ApiClient(configuration=cfg)
        if in_cluster is not False:
            try:
                cfg = k8s_client.Configuration()
                k8s_config.load_incluster_config(client_configuration=cfg)
                return k8s_client.ApiClient(configuration=cfg)
            except k8s_config.ConfigException:
                if in_cluster:
                    raise
        return await k8s_config.new_client_from_config(config_file=kubeconfig, context=context)
    except (k8s_config.ConfigException, OSError, ValueError, KeyError, yaml.YAMLError) as exc:  # a bad kubeconfig
        raise PermanentError(
            f"cannot configure the Kubernetes client ({exc}); set `kubeconfig:` in platform.yaml, "
            "$KUBECONFIG, or run inside the cluster with a service account"
        ) from exc


async def api_client_for(kube: KubeSettings | None = None) -> k8s_client.ApiClient:
    """The Kubernetes client a process's settings name, the one way every service and command builds it:
    ``TAU_KUBE_HOST`` (tests, proxies), else ``TAU_KUBECONFIG`` (or ``KUBECONFIG``) with ``TAU_KUBE_CONTEXT``,
    else the in-cluster service account. ``kube``: default this process's settings."""
    kube = kube or current().kube
    return await make_api_client(kubeconfig=kube.kubeconfig or None, context=kube.context or None,
                                 host=kube.host or None)


def status_message(body: object) -> str:
    """The ``message`` of a Kubernetes Status body, or the body itself."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            parsed = json.loads(body)
        except ValueError:
            return body.strip()[:500]
        body = parsed
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or body)[:2000]
    return str(body)[:500]


def _retry_after(headers: Mapping[str, str] | None, default: float) -> float:
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return default
    return default


def error_for(
    status: int, message: str, *, what: str, headers: Mapping[str, str] | None = None, backoff: float = 1.0
) -> Exception:
    """The taugrid error for an HTTP ``status`` answering ``what`` (e.g. ``apply Job team-a/x``)."""
    text = f"{what}: {message}" if message else f"{what}: HTTP {status}"
    if status == 404:
        return NotFound(text)
    if status == 410:
        return Gone(text, delay=0.0)
    if status == 409 and ("being deleted" in message or "has been modified" in message):
        return TemporaryError(text, delay=_retry_after(headers, backoff))  # a retry sees the new state
    if status == 429 or status >= 500 or status == 0:
        return TemporaryError(text, delay=_retry_after(headers, backoff))
    if status == 401:
        return PermanentError(f"{text} (credentials rejected: check the kubeconfig or service account token)")
    if status == 403:
        return PermanentError(f"{text} (forbidden: grant the taugrid service account this verb in RBAC)")
    return PermanentError(text)  # 400, 409, 422: the request itself is wrong


def translate_exception(exc: BaseException, *, what: str, backoff: float = 1.0) -> Exception:
    if isinstance(exc, ApiException):
        headers = dict(exc.headers or {}) if exc.headers else {}
        return error_for(
            int(exc.status or 0),
            status_message(exc.body or exc.reason or ""),
            what=what,
            headers=headers,
            backoff=backoff,
        )
    if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError)):
        return TemporaryError(
            f"{what}: cannot reach the Kubernetes API ({type(exc).__name__}: {exc})", delay=backoff
        )
    return TemporaryError(f"{what}: unexpected failure ({type(exc).__name__}: {exc})", delay=backoff)


def backoff_delay(attempt: int, *, initial: float = 0.5, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter (attempt 0 → up to ``initial``)."""
    return random.uniform(0, min(cap, initial * (2**attempt)))


class KubeApi:
    """Raw JSON calls over one ApiClient. ``retries`` temporary failures are retried here, quickly."""

    def __init__(
        self, api_client: k8s_client.ApiClient, *, retries: int = 3, retry_cap_s: float = 5.0
    ) -> None:
        self.api_client = api_client
        self.retries = retries
        self.retry_cap_s = retry_cap_s

    async def close(self) -> None:
        await self.api_client.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                return await self._once(
                    method, path, what=what, query=query, body=body, content_type=content_type
                )
            except TemporaryError as err:
                if isinstance(err, Gone) or attempt == self.retries:
                    raise
                await asyncio.sleep(min(err.delay, self.retry_cap_s))
        raise AssertionError("unreachable")

    async def _once(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
    ) -> dict[str, Any]:
        try:
            response = await self.api_client.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=60,
            )
            try:
                data = await response.read()
            finally:
                response.release()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise translate_exception(exc, what=what, backoff=backoff_delay(0, initial=0.5)) from exc
        if not 200 <= response.status <= 299:
            raise error_for(
                response.status,
                status_message(data),
                what=what,
                headers=dict(response.headers),
                backoff=backoff_delay(1, initial=0.5),
            )
        try:
            result: dict[str, Any] = json.loads(data) if data else {}
        except ValueError as exc:
            raise TemporaryError(f"{what}: the API answered with non-JSON ({data[:200]!r})") from exc
        return result

    async def _lines(
        self, path: str, *, what: str, query: Mapping[str, Any], accept: str, kind: str, read_timeout_s: float
    ) -> AsyncGenerator[bytes, None]:
        """Yield the lines (without their newline) of a streaming GET until the server closes it.

        Both the watch and the pod log API stream this way; a refused request → the error for its status,
        a broken stream → ``TemporaryError`` naming ``kind`` ("watch", "log")."""
        try:
            response = await self.api_client.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=read_timeout_s),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise translate_exception(exc, what=what) from exc
        try:
            if not 200 <= response.status <= 299:
                data = await response.read()
                raise error_for(response.status, status_message(data), what=what, headers=dict(response.headers))
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line
            if buffer:
                yield buffer
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise TemporaryError(f"{what}: {kind} stream broke ({type(exc).__name__}: {exc})", delay=0.5) from exc
        finally:
            response.release()

    async def stream(
        self, path: str, *, what: str, query: Mapping[str, Any], read_timeout_s: float
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the JSON lines of a watch. Ends when the server closes it; a broken stream → TemporaryError."""
        # aclosing: a consumer that stops early releases the response now, not when the generator is collected.
        lines = self._lines(
            path, what=what, query=query, accept="application/json", kind="watch", read_timeout_s=read_timeout_s
        )
        async with contextlib.aclosing(lines):
            async for line in lines:
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise TemporaryError(f"{what}: watch stream broke (ValueError: {exc})", delay=0.5) from exc

    async def log_lines(
        self,
        namespace: str,
        pod: str,
        *,
        container: str,
        since_time: str | None = None,
        follow: bool = True,
        read_timeout_s: float = 600.0,
    ) -> AsyncIterator[str]:
        """Yield a container's log lines with their timestamps (``<RFC3339Nano> <text>``), following until the
        container stops or the server closes the stream; ``since_time`` (RFC3339) starts there.

        The pod log API (``GET .../pods/<pod>/log``) through the ApiClient: the generated
        ``read_namespaced_pod_log`` has no ``sinceTime`` parameter. 400 (container not started yet) →
        ``PermanentError`` with the server's message; 404 → ``NotFound``; a broken stream → ``TemporaryError``.
        """
        query: dict[str, str] = {"container": container, "timestamps": "true", "follow": str(follow).lower()}
        if since_time:
            query["sinceTime"] = since_time
        what = f"logs of {namespace}/{pod}/{container}"
        path = f"/api/v1/namespaces/{namespace}/pods/{pod}/log"
        lines = self._lines(path, what=what, query=query, accept="*/*", kind="log", read_timeout_s=read_timeout_s)
        async with contextlib.aclosing(lines):
            async for line in lines:
                yield line.decode("utf-8", "replace").removesuffix("\r")
