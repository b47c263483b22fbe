"""What a Kubernetes site runs for the hub, as its lease's fencing reads it (``bus/sitelease.py``, docs §13d).

A run's Job or RayJob (and a reservation's Workload, ``sitework.reservation``) carries its run id, workspace and
attempt (``translate.run_ref``), so the site's dispatched run attempts are read from the cluster itself, never
from a copy that could drift: each is keyed ``Kind/ns/name`` and mapped to the hub's dispatch record key
(``sites.dispatch_key``). Stopping one deletes it with Background propagation (its pods go with it, the way
``tau cancel`` does it).
"""

from __future__ import annotations

from collections.abc import Iterable

from taugrid.bus.sites import dispatch_key
from taugrid.core.errors import NotFound
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import resource_for
from taugrid.kube.translate import run_ref
from taugrid.kube.watch import MANAGED_SELECTOR

# a reservation is a Workload of ours alone (``sitework.reservation``): it holds quota, so it is fenced too
RUN_KINDS = (("batch/v1", "Job"), ("ray.io/v1", "RayJob"), ("kueue.x-k8s.io/v1beta2", "Workload"))


def workload_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}"


async def dispatched(kube: KubeBackend, namespaces: Iterable[str] = ()) -> dict[str, str]:
    """Every run object of ours here (``workload_key`` → its dispatch record key), in ``namespaces`` (empty:
    all). A kind whose API is not installed (no KubeRay) has none."""
    out: dict[str, str] = {}
    scopes: list[str | None] = list(namespaces) or [None]
    for api_version, kind in RUN_KINDS:
        resource = resource_for(kind, api_version)
        for namespace in scopes:
            try:
                found = await kube.api.request("GET", resource.path(namespace), what=f"list {resource.plural}",
                                               query={"labelSelector": MANAGED_SELECTOR})
            except NotFound:
                break  # the CRD is not installed here
            for obj in found.get("items") or []:
                ref, meta = run_ref(obj), obj.get("metadata") or {}
                if ref is not None:
                    out[workload_key(kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = (
                        dispatch_key(ref.run_id, ref.attempt))
    return out


async def stop(kube: KubeBackend, key: str, grace_s: int = 30) -> None:
    """Delete the run object ``key`` (``workload_key``) and, through its owner references, its pods."""
    kind, namespace, name = key.split("/", 2)
    await kube.delete(kind, namespace, name, grace_s=grace_s,
                      api_version=dict((k, v) for v, k in RUN_KINDS).get(kind))
