"""Apply a platform's Kueue objects to a cluster (``tau platform apply --backend kubernetes``).

Renders with ``taugrid.render.kueue.render_platform``, validates every object against its CRD first (nothing
is applied when any object is invalid), then server-side applies each in apply order through ``KubeBackend``
as field manager ``taugrid``. Idempotent: applying the same platform twice changes nothing.

Objects taugrid applied earlier but the platform no longer names are left alone (never pruned): removing a
ClusterQueue that still has admitted workloads is an operator's decision, not a side effect of an apply.
"""

from __future__ import annotations

from typing import Any

from taugrid.config.platform import Platform
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import api_client_for
from taugrid.render.kueue import render_platform
from taugrid.render.validate import validate


def object_ref(obj: dict[str, Any]) -> str:
    """``Kind/name`` or ``Kind/namespace/name``."""
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{obj['kind']}/{ns}/{meta['name']}" if ns else f"{obj['kind']}/{meta['name']}"


async def apply_platform(p: Platform, *, api_client: Any = None) -> list[str]:
    """Server-side apply every Kueue object of ``p``; returns their refs in the order applied.

    Without ``api_client`` the client comes from the environment as for the renderer (``TAU_KUBE_HOST``,
    ``TAU_KUBECONFIG``/``KUBECONFIG`` + ``TAU_KUBE_CONTEXT``, else in-cluster) and is closed afterwards;
    a passed ``api_client`` stays open (it is the caller's). Raises ``PermanentError`` for an invalid
    object or a rejected apply (missing CRD, RBAC), ``TemporaryError`` when the API cannot be reached.
    """
    objs = render_platform(p)
    for obj in objs:
        validate(obj)
    own = api_client is None
    if own:
        api_client = await api_client_for()
    kube = KubeBackend(api_client)
    applied: list[str] = []
    try:
        for obj in objs:
            await kube.apply_one(obj)
            applied.append(object_ref(obj))
    finally:
        if own:
            await kube.close()
    return applied
