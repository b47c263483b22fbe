"""The dispatcher's requests at a Kubernetes site (docs §13d), done the way MultiKueue does it across clusters.

MultiKueue (kueue ``pkg/controller/admissionchecks/multikueue``; its concept page) copies only the *Workload* to
each worker cluster; the worker's own Kueue queues it and reserves quota; the manager then deletes the copies on
the other workers and creates the Job on the one that reserved first, labelled
``kueue.x-k8s.io/prebuilt-workload-name`` so that worker's Kueue runs it under the Workload it already admitted.
Here the dispatcher is the manager and each request arrives in the site's ``SITE_IN``:

* ``reserve``: the run's namespace-level objects are not created yet; only a Kueue Workload for its Job or
  RayJob (``reservation``): named as the Job, labelled with the run (so its admission, which the kube-bridge's
  watch publishes into ``SITE_OUT``, is read by the dispatcher as this cluster's), in the Job's LocalQueue, one
  PodSet per pod group, and Kueue's preemption gate (``PREEMPTION_GATE_ANNOTATION``), as MultiKueue gates its
  copies: it preempts nothing until the dispatcher lets this cluster (a reservation with ``may_preempt``, which lifts
  the gate). Nothing runs: no Job exists.
* ``apply``: the run's manifests, the Job or RayJob labelled with the Workload reserved for it when there is one
  (``chosen``): Kueue unsuspends it under the quota already reserved. An apply with no reservation here is applied
  as it is (Kueue queues it itself).
* ``delete`` (a withdrawal, a cancel, a fenced orphan): the Job or RayJob and the reservation's Workload.
* Kueue preempting a chosen run here (``hold_back``): the dispatcher reads the same change and reopens the choice,
  so the run must not start here again by itself when Kueue admits its Workload again; as the local site queues an
  evicted run again as a reservation, the Job or RayJob is deleted and its Workload kept, queued as the reservation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from taugrid.core.contracts import BackendApply, BackendDelete
from taugrid.core.errors import PermanentError
from taugrid.core.workloadstatus import preempted
from taugrid.kube.apply import KubeBackend
from taugrid.kube.client import resource_for
from taugrid.kube.translate import LABEL_ATTEMPT, LABEL_MANAGED_BY, LABEL_RUN_ID, LABEL_WORKSPACE

PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
# Kueue's preemption gate (KEP-8303, alpha: feature gate SynchronizedPreemption), MultiKueue's own gate: a gated
# Workload that could be admitted only by preempting waits with QuotaReserved False, reason PreemptionGated, which the
# dispatcher reads as this cluster asking to preempt; a reservation with ``may_preempt`` lifts it.
PREEMPTION_GATE_ANNOTATION = "kueue.x-k8s.io/preemption-gated"
PREEMPTION_GATE = "multi-kueue:OrchestratedPreemption"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
RUN_OBJECT_KINDS = ("Job", "RayJob")
RUN_LABELS = (LABEL_MANAGED_BY, LABEL_RUN_ID, LABEL_WORKSPACE, LABEL_ATTEMPT)


def run_object(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's Job or RayJob among its manifests; a request without one is refused (nothing to reserve for)."""
    found = next((m for m in manifests if m.get("kind") in RUN_OBJECT_KINDS), None)
    if found is None:
        raise PermanentError("the request names no Job or RayJob: nothing to reserve quota for or to run")
    return found


def pod_sets(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Kueue's PodSets of a Job (``main``, its parallelism) or a RayJob (``head``, then each worker group by its
    ``groupName`` with its ``replicas``), each with its pod template."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Job":
        return [{"name": "main", "count": int(spec.get("parallelism", 1)), "template": spec.get("template") or {}}]
    cluster = spec.get("rayClusterSpec") or {}
    out = [{"name": "head", "count": 1, "template": (cluster.get("headGroupSpec") or {}).get("template") or {}}]
    for group in cluster.get("workerGroupSpecs") or []:
        out.append({"name": str(group.get("groupName") or "workers"), "count": int(group.get("replicas", 1)),
                    "template": group.get("template") or {}})
    return out


def reservation(req: BackendApply) -> dict[str, Any]:
    """The Kueue Workload that reserves quota here for the run's Job or RayJob, named as it."""
    obj = run_object(req.manifests)
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        raise PermanentError(f"{obj['kind']} {meta.get('name')} has no {QUEUE_LABEL} label: Kueue would never "
                             "admit its reservation (the renderer sets it from the run's queue)")
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(obj)}
    if labels.get(PRIORITY_LABEL):
        spec |= {"priorityClassName": labels[PRIORITY_LABEL],
                 "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"}
    out_meta: dict[str, Any] = {"name": meta["name"], "namespace": meta.get("namespace") or "default",
                                "labels": {k: labels[k] for k in RUN_LABELS if k in labels}}
    if not req.may_preempt:  # one cluster at a time preempts for a run: the dispatcher lets it (``may_preempt``)
        out_meta["annotations"] = {PREEMPTION_GATE_ANNOTATION: PREEMPTION_GATE}
    return {"apiVersion": WORKLOAD_API, "kind": "Workload", "metadata": out_meta, "spec": spec}


def chosen(req: BackendApply) -> list[dict[str, Any]]:
    """The run's manifests, its Job or RayJob to run under the Workload reserved for it (same name)."""
    out = copy.deepcopy(req.manifests)
    obj = run_object(out)
    meta = obj.setdefault("metadata", {})
    meta.setdefault("labels", {})[PREBUILT_LABEL] = meta["name"]
    return out


class SiteWork:
    """Carries the requests out over the site's Kubernetes API (server-side apply: a redelivery changes nothing)."""

    def __init__(self, kube: KubeBackend) -> None:
        self.kube = kube

    async def reserve(self, req: BackendApply) -> None:
        """A reservation (gated: it preempts nothing), or the dispatcher's grant to preempt for one: the same
        Workload with its gate lifted."""
        ns = [m for m in req.manifests if m.get("kind") == "Namespace"]  # the Workload's namespace, when new
        wl = reservation(req)
        await self.kube.apply([*ns, wl])
        if req.may_preempt:  # lifted explicitly: an apply that omits a field another manager set leaves it
            meta = wl["metadata"]
            await self.kube.api.request(
                "PATCH", resource_for("Workload", WORKLOAD_API).path(meta["namespace"], meta["name"]),
                what=f"lift the preemption gate of Workload {meta['namespace']}/{meta['name']}",
                body={"metadata": {"annotations": {PREEMPTION_GATE_ANNOTATION: None}}},
                content_type="application/merge-patch+json")

    async def apply(self, req: BackendApply) -> None:
        obj = run_object(req.manifests)
        meta = obj.get("metadata") or {}
        reserved = await self.kube.get("Workload", str(meta.get("namespace") or "default"), str(meta["name"]),
                                       api_version=WORKLOAD_API)
        await self.kube.apply(chosen(req) if reserved is not None else req.manifests)

    async def delete(self, req: BackendDelete) -> None:
        await self.kube.delete(req.kind, req.namespace, req.name, grace_s=req.grace_s)
        await self.kube.delete("Workload", req.namespace, req.name, api_version=WORKLOAD_API)

    async def hold_back(self, workload: Mapping[str, Any]) -> bool:
        """A run's Workload here that Kueue preempted while its Job or RayJob exists: the Workload's owner
        references to it are dropped first (Kueue adopts a prebuilt Workload: deleting its Job would take it
        along), then the Job or RayJob is deleted; the Workload queues on as the reservation, reported again when
        Kueue admits it, and only the dispatcher's next apply makes a Job for it. True when it held one back."""
        meta = workload.get("metadata") or {}
        if (workload.get("kind") != "Workload" or LABEL_RUN_ID not in (meta.get("labels") or {})
                or not preempted(workload)):
            return False
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        run_obj = ""
        for kind in RUN_OBJECT_KINDS:
            if await self.kube.get(kind, namespace, name) is not None:
                run_obj = kind
                break
        if not run_obj:
            return False  # a reservation (no Job yet), or held back already
        refs = list(meta.get("ownerReferences") or [])
        kept = [r for r in refs if r.get("kind") not in RUN_OBJECT_KINDS]
        if kept != refs:
            await self.kube.api.request(
                "PATCH", resource_for("Workload", WORKLOAD_API).path(namespace, name),
                what=f"keep Workload {namespace}/{name} as the reservation", body={"metadata": {"ownerReferences":
                                                                                              kept or None}},
                content_type="application/merge-patch+json")
        await self.kube.delete(run_obj, namespace, name)
        return True
