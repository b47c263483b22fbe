"""Resize an elastic Job on Kubernetes the way Kueue v0.19.2's ElasticJobsViaWorkloadSlices expects it.

Kueue never resizes a Job itself: whoever owns the Job (a user, an autoscaler; here taugrid) changes its
``spec.parallelism`` and Kueue follows (``site/.../concepts/elastic_workload.md``, ``pkg/workloadslicing``):
- a *smaller* parallelism is recorded in place in the admitted Workload; the Job controller removes the
  highest-index pods at once. So a shrink is done when the patch is accepted, and the patch itself records
  the resize (``taugrid.io/resized``, which ``translate`` reads as ``exec.resized``);
- a *larger* parallelism makes Kueue create a new Workload slice (``kueue.x-k8s.io/workload-slice-replacement-for``
  naming the old one) that queues like any workload, charged only what it adds, on the old slice's flavors;
  the new pods wait behind Kueue's elastic-job scheduling gate until the slice is admitted, and only then
  does the old slice finish. So a growth is only *asked for* by the patch (``taugrid.io/resize-requested``),
  and becomes ``taugrid.io/resized`` when the watch shows the slice admitted (``slice_admitted_patch``): a slice
  left pending leaves the run at its old size, and no event claims otherwise.

Refused (``PermanentError``, naming the fix): a Job without Kueue's opt-in and taugrid's range (render writes
both for ``policy.mode: elastic``), a finished or suspended Job (a suspended Job is admitted whole at its written
size), a size outside the range. Kueue's own webhook refuses a parallelism change with partial admission; taugrid
never renders both.

An elastic RayJob (``RayScaler``) resizes its Ray cluster's worker group, not its own spec: KubeRay (v1.7.0-rc.0,
``getOrCreateRayClusterInstance``: "Disregard changes in RayClusterSpec of RayJob") never carries a change of a
RayJob's ``rayClusterSpec`` to the RayCluster it made, and Kueue (v0.20.0-devel, ``raycluster.UpdatePodSets``)
counts an elastic RayJob's worker pod sets from that RayCluster's ``workerGroupSpecs[].replicas`` (only with
``enableInTreeAutoscaling`` and the opt-in, which render writes). So the scaler patches the RayCluster named in
the RayJob's ``status.rayClusterName``: the group's ``replicas``, and for a shrink ``scaleStrategy.workersToDelete``
naming the group's youngest worker pods (with in-tree autoscaling on, KubeRay deletes only the pods named there,
as it does for the autoscaler's own scale-downs); then it records the resize on the RayJob (``taugrid.io/resized``
for a shrink, ``taugrid.io/resize-requested`` for a growth until Kueue admits its slice), which ``translate``
reads as ``exec.resized``. KubeRay's autoscaler writes the same ``replicas`` by the Ray cluster's demand, within
the same bounds: taugrid is one more writer of it, not the only one.

Invariant: only ``taugrid.core.errors`` leave this module; Kubernetes is reached only through ``client.KubeApi``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from taugrid.core.errors import PermanentError
from taugrid.kube.client import KubeApi, Resource, resource_for
from taugrid.kube.translate import ANNOTATION_RESIZED

# The same keys as ``render.job`` writes (repeated: taugrid.kube does not import the renderer).
ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
ELASTIC_RANGE = "taugrid.io/elastic"  # "min:max:step:cooldown"
# A growth taugrid asked for and Kueue has not admitted yet (same JSON as ANNOTATION_RESIZED).
ANNOTATION_RESIZE_REQUESTED = "taugrid.io/resize-requested"
SLICE_REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
MERGE_PATCH = "application/merge-patch+json"
GROWN, SHRUNK = "Grown", "Shrunk"
ELASTIC_KINDS = ("Job", "RayJob")
RAY_CLUSTER_LABEL, RAY_GROUP_LABEL, RAY_NODE_TYPE_LABEL = "ray.io/cluster", "ray.io/group", "ray.io/node-type"


class ElasticRange(NamedTuple):
    min_count: int
    max_count: int
    step: int
    cooldown_s: float


def elastic_range(job: Mapping[str, Any]) -> ElasticRange | None:
    """The Job's size range, or None when it did not opt in to Kueue's elastic jobs with taugrid's range."""
    ann = (job.get("metadata") or {}).get("annotations") or {}
    text = str(ann.get(ELASTIC_RANGE) or "")
    if job.get("kind") not in ELASTIC_KINDS or ann.get(ELASTIC_JOB) != "true" or text.count(":") != 3:
        return None
    low, high, step, cooldown = text.split(":")
    try:
        return ElasticRange(int(low), int(high), int(step), float(cooldown))
    except ValueError:
        return None


def _what(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{job.get('kind') or 'Job'} {meta.get('namespace', '')}/{meta.get('name', '')}"


def _finished(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    if job.get("kind") == "RayJob":
        return status.get("jobDeploymentStatus") in ("Complete", "Failed")
    conds = status.get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)


def worker_group(ray: Mapping[str, Any]) -> dict[str, Any]:
    """The (first) worker group of a RayJob's ``rayClusterSpec`` or of a RayCluster's spec; {} without one."""
    spec = ray.get("spec") or {}
    groups = (spec.get("rayClusterSpec") or spec).get("workerGroupSpecs") or []
    return dict(groups[0]) if groups else {}


def _checked(job: Mapping[str, Any], count: int) -> ElasticRange:
    """The job's range, once it may be resized to ``count`` (else ``PermanentError`` naming the fix)."""
    what = _what(job)
    rng = elastic_range(job)
    if rng is None:
        raise PermanentError(f"{what} is not elastic (no {ELASTIC_JOB}: \"true\" with a {ELASTIC_RANGE} range): "
                             "submit it with policy.mode: elastic to let it resize")
    if _finished(job):
        raise PermanentError(f"{what} has finished: there is nothing to resize")
    if (job.get("spec") or {}).get("suspend"):
        raise PermanentError(f"{what} is suspended: Kueue admits it whole at its written size; resize it once "
                             "it runs")
    if not rng.min_count <= count <= rng.max_count:
        unit = "workers" if job.get("kind") == "RayJob" else "pods"
        raise PermanentError(f"{what}: {count} {unit} is outside its range {rng.min_count}..{rng.max_count} "
                             "(policy.elastic.min/max)")
    return rng


def _record(old: int, count: int, cause: str, preemptor: str, pod_set: str, at: float | None) -> dict[str, Any]:
    """The annotations that record a resize: a shrink is done at once, a growth only asked for (its slice)."""
    grow = count > old
    record = json.dumps({"old_count": old, "new_count": count, "cause": cause or (GROWN if grow else SHRUNK),
                         "preemptor": preemptor, "pod_set": pod_set,
                         "at": _stamp(time.time() if at is None else at)}, separators=(",", ":"))
    return ({ANNOTATION_RESIZE_REQUESTED: record} if grow
            else {ANNOTATION_RESIZED: record, ANNOTATION_RESIZE_REQUESTED: None})  # a shrink supersedes


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resize_patch(job: Mapping[str, Any], count: int, *, cause: str = "", preemptor: str = "",
                 at: float | None = None) -> dict[str, Any]:
    """The merge patch that takes ``job`` to ``count`` pods ({} when it already runs that many). ``cause``
    defaults to Grown or Shrunk; ``preemptor``: the run a shrink gives its pods to."""
    _checked(job, count)
    old = int((job.get("spec") or {}).get("parallelism") or 1)
    if count == old:
        return {}
    return {"metadata": {"annotations": _record(old, count, cause, preemptor, "main", at)},
            "spec": {"parallelism": count}}


def ray_resize_patches(rayjob: Mapping[str, Any], cluster: Mapping[str, Any], count: int,
                       workers: list[Mapping[str, Any]], *, cause: str = "", preemptor: str = "",
                       at: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The merge patches (RayCluster, RayJob) that take an elastic RayJob's worker group to ``count`` workers
    (({}, {}) when its Ray cluster already has them). ``workers``: the group's worker pods; a shrink names the
    youngest of them in ``workersToDelete``."""
    _checked(rayjob, count)
    group = worker_group(cluster)
    if not group:
        raise PermanentError(f"{_what(rayjob)}: its RayCluster {(cluster.get('metadata') or {}).get('name')} has "
                             "no worker group to resize")
    written = group.get("replicas")
    old = 1 if written is None else int(written)  # Kueue counts a missing one as 1
    if count == old:
        return {}, {}
    groups = [dict(g) for g in (cluster.get("spec") or {}).get("workerGroupSpecs") or []]
    groups[0]["replicas"] = count
    if count < old:
        youngest = sorted(workers, key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp") or ""),
                                                  str((p.get("metadata") or {}).get("name") or "")), reverse=True)
        groups[0]["scaleStrategy"] = {"workersToDelete": [str(p["metadata"]["name"]) for p in youngest[:old - count]]}
    pod_set = str(group.get("groupName") or "")
    return ({"spec": {"workerGroupSpecs": groups}},
            {"metadata": {"annotations": _record(old, count, cause, preemptor, pod_set, at)}})


def admitted_count(workload: Mapping[str, Any], pod_set: str | None = None) -> int | None:
    """The pods an admitted Workload holds (its pod sets' admitted counts, or only ``pod_set``'s), None while it
    is not admitted."""
    status = workload.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    admission = status.get("admission") or {}
    if conds.get("Admitted") != "True" or not admission:
        return None
    return sum(int(a.get("count") or 0) for a in admission.get("podSetAssignments") or []
               if pod_set is None or a.get("name") == pod_set)


def slice_admitted_patch(job: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """When ``workload`` is the admitted scale-up slice of ``job`` at the size taugrid asked for, the patch that
    records the growth as done ({} otherwise: not a slice, not admitted yet, or another size)."""
    if SLICE_REPLACEMENT_FOR not in ((workload.get("metadata") or {}).get("annotations") or {}):
        return {}
    requested = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESIZE_REQUESTED)
    if not requested:
        return {}
    try:
        asked = json.loads(requested)
        wanted = int(asked["new_count"])
    except (ValueError, KeyError, TypeError):
        return {}
    # a RayJob's record names its worker pod set: the slice's head pod set is not counted
    pod_set = str(asked.get("pod_set") or "") if job.get("kind") == "RayJob" else None
    if admitted_count(workload, pod_set) != wanted:
        return {}
    return {"metadata": {"annotations": {ANNOTATION_RESIZED: requested, ANNOTATION_RESIZE_REQUESTED: None}}}


def owner(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the Job or RayJob a Workload belongs to, None for other owners."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        api = str(ref.get("apiVersion", ""))
        if (ref.get("kind"), api.split("/")[0]) in (("Job", "batch"), ("RayJob", "ray.io")):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


class JobScaler:
    """Resizes elastic Jobs and RayJobs through one API connection (merge patches)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.jobs = resource_for("Job", "batch/v1")
        self.rayjobs = resource_for("RayJob", "ray.io/v1")
        self.rayclusters = resource_for("RayCluster", "ray.io/v1")
        self.pods = resource_for("Pod", "v1")

    def _resource(self, kind: str) -> Resource:
        return {"Job": self.jobs, "RayJob": self.rayjobs, "RayCluster": self.rayclusters}[kind]

    async def _get(self, namespace: str, name: str, kind: str = "Job") -> dict[str, Any]:
        return await self.api.request("GET", self._resource(kind).path(namespace, name),
                                      what=f"get {kind} {namespace}/{name}")

    async def _patch(self, namespace: str, name: str, patch: dict[str, Any], rv: str,
                     kind: str = "Job") -> dict[str, Any]:
        # With the resourceVersion read: an object changed meanwhile (another resize) is a conflict, not overwritten.
        body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": rv}}
        return await self.api.request("PATCH", self._resource(kind).path(namespace, name),
                                      what=f"resize {kind} {namespace}/{name}", body=body, content_type=MERGE_PATCH)

    async def resize(self, namespace: str, name: str, count: int, *, cause: str = "",
                     preemptor: str = "") -> dict[str, Any]:
        """Take the Job to ``count`` pods; returns the Job as stored (unchanged when it already has them)."""
        job = await self._get(namespace, name)
        patch = resize_patch(job, count, cause=cause, preemptor=preemptor)
        if not patch:
            return job
        return await self._patch(namespace, name, patch, str(job["metadata"]["resourceVersion"]))

    async def resize_rayjob(self, namespace: str, name: str, count: int, *, cause: str = "",
                            preemptor: str = "") -> dict[str, Any]:
        """Take the RayJob's worker group to ``count`` workers (its RayCluster's, ``ray_resize_patches``); returns
        the RayJob as stored (unchanged when its cluster already has them)."""
        rayjob = await self._get(namespace, name, "RayJob")
        _checked(rayjob, count)
        cluster_name = str((rayjob.get("status") or {}).get("rayClusterName") or "")
        if not cluster_name:
            raise PermanentError(f"RayJob {namespace}/{name} has no Ray cluster yet (status.rayClusterName): "
                                 "resize it once KubeRay has created it")
        cluster = await self._get(namespace, cluster_name, "RayCluster")
        group = str(worker_group(cluster).get("groupName") or "")
        selector = f"{RAY_CLUSTER_LABEL}={cluster_name},{RAY_GROUP_LABEL}={group},{RAY_NODE_TYPE_LABEL}=worker"
        pods = await self.api.request("GET", self.pods.path(namespace), query={"labelSelector": selector},
                                      what=f"list the worker pods of RayCluster {namespace}/{cluster_name}")
        live = [p for p in pods.get("items") or [] if not (p.get("metadata") or {}).get("deletionTimestamp")]
        cluster_patch, rayjob_patch = ray_resize_patches(rayjob, cluster, count, live, cause=cause,
                                                         preemptor=preemptor)
        if not cluster_patch:
            return rayjob
        await self._patch(namespace, cluster_name, cluster_patch, str(cluster["metadata"]["resourceVersion"]),
                          "RayCluster")
        return await self._patch(namespace, name, rayjob_patch, str(rayjob["metadata"]["resourceVersion"]), "RayJob")

    async def confirm_slice(self, workload: Mapping[str, Any]) -> bool:
        """Record a growth as done when ``workload`` is its admitted slice; whether the Job (RayJob) was patched."""
        found = owner(workload)
        namespace = str((workload.get("metadata") or {}).get("namespace") or "")
        if found is None or SLICE_REPLACEMENT_FOR not in ((workload.get("metadata") or {}).get("annotations") or {}):
            return False
        if admitted_count(workload) is None:  # a pending slice's changes need no look at the Job
            return False
        kind, name = found
        job = await self._get(namespace, name, kind)
        patch = slice_admitted_patch(job, workload)
        if not patch:
            return False
        await self._patch(namespace, name, patch, str(job["metadata"]["resourceVersion"]), kind)
        return True
