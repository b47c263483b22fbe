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

Invariant: only ``taugrid.core.errors`` leave this module; Kubernetes is reached only through ``client.KubeApi``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from taugrid.core.errors import PermanentError
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.translate import ANNOTATION_RESIZED

# The same keys as ``render.job`` writes (repeated: taugrid.kube does not import the renderer).
ELASTIC_JOB = "kueue.x-k8s.io/elastic-job"
ELASTIC_RANGE = "taugrid.io/elastic"  # "min:max:step:cooldown"
# A growth taugrid asked for and Kueue has not admitted yet (same JSON as ANNOTATION_RESIZED).
ANNOTATION_RESIZE_REQUESTED = "taugrid.io/resize-requested"
SLICE_REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
MERGE_PATCH = "application/merge-patch+json"
GROWN, SHRUNK = "Grown", "Shrunk"


class ElasticRange(NamedTuple):
    min_count: int
    max_count: int
    step: int
    cooldown_s: float


def elastic_range(job: Mapping[str, Any]) -> ElasticRange | None:
    """The Job's size range, or None when it did not opt in to Kueue's elastic jobs with taugrid's range."""
    ann = (job.get("metadata") or {}).get("annotations") or {}
    text = str(ann.get(ELASTIC_RANGE) or "")
    if job.get("kind") != "Job" or ann.get(ELASTIC_JOB) != "true" or text.count(":") != 3:
        return None
    low, high, step, cooldown = text.split(":")
    try:
        return ElasticRange(int(low), int(high), int(step), float(cooldown))
    except ValueError:
        return None


def _what(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"Job {meta.get('namespace', '')}/{meta.get('name', '')}"


def _finished(job: Mapping[str, Any]) -> bool:
    conds = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds)


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resize_patch(job: Mapping[str, Any], count: int, *, cause: str = "", preemptor: str = "",
                 at: float | None = None) -> dict[str, Any]:
    """The merge patch that takes ``job`` to ``count`` pods ({} when it already runs that many). ``cause``
    defaults to Grown or Shrunk; ``preemptor``: the run a shrink gives its pods to."""
    what = _what(job)
    rng = elastic_range(job)
    if rng is None:
        raise PermanentError(f"{what} is not elastic (no {ELASTIC_JOB}: \"true\" with a {ELASTIC_RANGE} range): "
                             "submit it with policy.mode: elastic to let it resize")
    if _finished(job):
        raise PermanentError(f"{what} has finished: there is nothing to resize")
    spec = job.get("spec") or {}
    if spec.get("suspend"):
        raise PermanentError(f"{what} is suspended: Kueue admits it whole at its written size; resize it once "
                             "it runs")
    if not rng.min_count <= count <= rng.max_count:
        raise PermanentError(f"{what}: {count} pods is outside its range {rng.min_count}..{rng.max_count} "
                             "(policy.elastic.min/max)")
    old = int(spec.get("parallelism") or 1)
    if count == old:
        return {}
    grow = count > old
    record = json.dumps({"old_count": old, "new_count": count, "cause": cause or (GROWN if grow else SHRUNK),
                         "preemptor": preemptor, "pod_set": "main", "at": _stamp(time.time() if at is None else at)},
                        separators=(",", ":"))
    annotations = ({ANNOTATION_RESIZE_REQUESTED: record} if grow
                   else {ANNOTATION_RESIZED: record, ANNOTATION_RESIZE_REQUESTED: None})  # a shrink supersedes
    return {"metadata": {"annotations": annotations}, "spec": {"parallelism": count}}


def admitted_count(workload: Mapping[str, Any]) -> int | None:
    """The pods an admitted Workload holds (its pod sets' admitted counts), None while it is not admitted."""
    status = workload.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    admission = status.get("admission") or {}
    if conds.get("Admitted") != "True" or not admission:
        return None
    return sum(int(a.get("count") or 0) for a in admission.get("podSetAssignments") or [])


def slice_admitted_patch(job: Mapping[str, Any], workload: Mapping[str, Any]) -> dict[str, Any]:
    """When ``workload`` is the admitted scale-up slice of ``job`` at the size taugrid asked for, the patch that
    records the growth as done ({} otherwise: not a slice, not admitted yet, or another size)."""
    if SLICE_REPLACEMENT_FOR not in ((workload.get("metadata") or {}).get("annotations") or {}):
        return {}
    requested = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESIZE_REQUESTED)
    if not requested:
        return {}
    try:
        wanted = int(json.loads(requested)["new_count"])
    except (ValueError, KeyError, TypeError):
        return {}
    if admitted_count(workload) != wanted:
        return {}
    return {"metadata": {"annotations": {ANNOTATION_RESIZED: requested, ANNOTATION_RESIZE_REQUESTED: None}}}


def owner_job(workload: Mapping[str, Any]) -> str | None:
    """The name of the Job a Workload belongs to (its controller ownerReference), None for other owners."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name"))
    return None


class JobScaler:
    """Resizes elastic Jobs through one API connection (merge patches of the Job)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.jobs = resource_for("Job", "batch/v1")

    async def _get(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.api.request("GET", self.jobs.path(namespace, name), what=f"get Job {namespace}/{name}")

    async def _patch(self, namespace: str, name: str, patch: dict[str, Any], rv: str) -> dict[str, Any]:
        # With the resourceVersion read: a Job changed meanwhile (another resize) is a conflict, not overwritten.
        body = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": rv}}
        return await self.api.request("PATCH", self.jobs.path(namespace, name), what=f"resize Job {namespace}/{name}",
                                      body=body, content_type=MERGE_PATCH)

    async def resize(self, namespace: str, name: str, count: int, *, cause: str = "",
                     preemptor: str = "") -> dict[str, Any]:
        """Take the Job to ``count`` pods; returns the Job as stored (unchanged when it already has them)."""
        job = await self._get(namespace, name)
        patch = resize_patch(job, count, cause=cause, preemptor=preemptor)
        if not patch:
            return job
        return await self._patch(namespace, name, patch, str(job["metadata"]["resourceVersion"]))

    async def confirm_slice(self, workload: Mapping[str, Any]) -> bool:
        """Record a growth as done when ``workload`` is its admitted slice; whether the Job was patched."""
        name = owner_job(workload)
        namespace = str((workload.get("metadata") or {}).get("namespace") or "")
        if name is None or SLICE_REPLACEMENT_FOR not in ((workload.get("metadata") or {}).get("annotations") or {}):
            return False
        if admitted_count(workload) is None:  # a pending slice's changes need no look at the Job
            return False
        job = await self._get(namespace, name)
        patch = slice_admitted_patch(job, workload)
        if not patch:
            return False
        await self._patch(namespace, name, patch, str(job["metadata"]["resourceVersion"]))
        return True
