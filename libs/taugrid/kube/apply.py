"""Create and delete objects on a Kubernetes cluster.

``apply`` uses server-side apply (PATCH ``application/apply-patch+yaml``, ``fieldManager``, ``force=true``)
for any kind, so it creates or updates in one call and is idempotent on redelivery: the renderer names an
object after run and attempt, so the same message applies the same object again and changes nothing.
``delete`` uses ``propagationPolicy: Background`` (the Job's pods / the RayJob's cluster follow) and treats
404 as success (already gone).

Invariant: only ``taugrid.core.errors`` leave this module (see ``client``).
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client as k8s_client

from taugrid.core.errors import NotFound, PermanentError
from taugrid.kube.client import KubeApi, resource_for

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


class KubeBackend:
    """Apply/delete through one ApiClient, as field manager ``field_manager``."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        field_manager: str = "taugrid",
        *,
        retries: int = 3,
        retry_cap_s: float = 5.0,
    ) -> None:
        self.api = KubeApi(api_client, retries=retries, retry_cap_s=retry_cap_s)
        self.field_manager = field_manager

    async def close(self) -> None:
        await self.api.close()

    async def apply(self, manifests: list[dict[str, Any]]) -> None:
        """Server-side apply each manifest, in order (a namespace before what lives in it)."""
        for manifest in manifests:
            await self.apply_one(manifest)

    async def apply_one(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Apply one manifest; returns the object as the server stored it."""
        api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
        meta = manifest.get("metadata") or {}
        name = meta.get("name")
        if not api_version or not kind or not name:
            raise PermanentError(
                f"manifest needs apiVersion, kind and metadata.name (got {api_version!r}, {kind!r}, {name!r})"
            )
        resource = resource_for(kind, api_version)
        namespace = meta.get("namespace") if resource.namespaced else None
        if resource.namespaced and not namespace:
            raise PermanentError(f"{kind} {name}: metadata.namespace is required for a namespaced kind")
        what = f"apply {kind} {namespace + '/' if namespace else ''}{name}"
        try:
            return await self.api.request(
                "PATCH",
                resource.path(namespace, name),
                what=what,
                body=manifest,
                content_type=APPLY_CONTENT_TYPE,
                query={"fieldManager": self.field_manager, "force": "true"},
            )
        except NotFound as exc:
            raise PermanentError(
                f"{exc} (is the {resource.api_version} API installed — CRD for {kind} — and does namespace "
                f"{namespace!r} exist?)"
            ) from exc

    async def delete(
        self, kind: str, namespace: str, name: str, *, grace_s: int = 30, api_version: str | None = None
    ) -> None:
        """Delete with Background propagation; an object that is already gone counts as deleted."""
        resource = resource_for(kind, api_version)
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "gracePeriodSeconds": max(0, int(grace_s)),
        }
        try:
            await self.api.request(
                "DELETE",
                resource.path(namespace if resource.namespaced else None, name),
                what=f"delete {kind} {namespace}/{name}",
                body=body,
            )
        except NotFound:
            return

    async def get(
        self, kind: str, namespace: str | None, name: str, *, api_version: str | None = None
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        resource = resource_for(kind, api_version)
        try:
            return await self.api.request("GET", resource.path(namespace, name), what=f"get {kind} {name}")
        except NotFound:
            return None
