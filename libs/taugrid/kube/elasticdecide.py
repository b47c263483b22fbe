"""When a running elastic Job on Kubernetes grows or shrinks: the decisions Kueue leaves to the Job's owner.

Kueue v0.19.2's ElasticJobsViaWorkloadSlices only follows a change of an elastic Job's ``spec.parallelism`` (a
scale-up slice that queues and is admitted like any workload, a scale-down recorded in place) and preempts an
elastic workload whole, like any other (``site/.../concepts/elastic_workload.md``: "If the job requests more
parallelism..."; "Preemption: follows the existing workload preemption mechanism"). Who changes the parallelism is
the Job's owner; for taugrid's runs that is this module, run by the leading kube-bridge on what it watches, and
``kube/resize.py`` carries each decision out. The rules are the local engine's (``core/admission/elastic.py``):

- *Grow*: an admitted elastic Job below its maximum, its cooldown passed since it started or last resized, grows by
  its ``step`` (capped at the maximum) when its ClusterQueue has no pending workload (growth never takes what a
  waiting workload could use) and the queue's unreserved nominal quota holds the new pods. Highest priority first,
  then the oldest; each growth is charged before the next is weighed.
- *Shrink for a preemptor*: a pending workload (not a scale-up slice) that its ClusterQueue's unreserved nominal
  quota cannot hold takes pods, one at a time, from the queue's elastic Jobs of lower priority above their minimum
  (lowest priority first, then the youngest), until the quota holds it; when even all of them at their minimum
  would not make room, none is shrunk and Kueue preempts as it would.
- A queue with a resize in flight (a Job's parallelism, or an elastic RayJob's Ray cluster's desired workers as its
  ``status.rayClusterStatus.desiredWorkerReplicas`` says, not yet its Workload's admitted count; a RayJob's shrink
  recorded in the last ``RAY_FOLLOW_S`` that Kueue has not recorded; or a growth asked for and not admitted) is
  left alone until Kueue has followed it: a decision is never taken twice.
- An elastic RayJob is weighed like a Job by its worker pod set (the group's name; the head is never resized):
  its count, and its pod's resources, are that pod set's admitted count and ``resourceUsage`` per pod.

Quota is counted per resource over the queue's flavors (as ``tau queue`` shows it), nominal only: borrowing from
the cohort is not counted on, so a decision never relies on capacity Kueue could take back.

Pure: Kubernetes objects in (as the API returns them), decisions out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from taugrid.kube.queues import nominal, quantity
from taugrid.kube.resize import (
    ANNOTATION_RESIZE_REQUESTED,
    GROWN,
    SLICE_REPLACEMENT_FOR,
    ElasticRange,
    admitted_count,
    elastic_range,
    owner,
    worker_group,
)
from taugrid.kube.translate import ANNOTATION_RESIZED, LABEL_RUN_ID

SHRUNK_FOR_PREEMPTOR = "ShrunkForPreemptor"
# How long a RayJob's recorded shrink holds its queue while Kueue has not followed it: KubeRay reconciles the
# RayCluster, and Kueue the Workload, within seconds; beyond this the record is taken as superseded.
RAY_FOLLOW_S = 60.0


class Decision(NamedTuple):
    namespace: str
    job: str
    pods: int  # the Job's new parallelism (a RayJob's: its worker group's replicas)
    cause: str
    preemptor: str = ""  # the run a shrink gives its pods to
    kind: str = "Job"  # or "RayJob"


@dataclass
class _Elastic:
    namespace: str
    job: str
    kind: str
    cluster_queue: str
    priority: int
    count: int  # pods admitted
    rng: ElasticRange
    per_pod: dict[str, float]
    since: float  # started or last resized
    in_flight: bool


def decide(*, cluster_queues: Iterable[Mapping[str, Any]], local_queues: Iterable[Mapping[str, Any]],
           workloads: Iterable[Mapping[str, Any]], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
           now: float) -> list[Decision]:
    """The resizes to carry out now. ``jobs``: the watched Jobs by (namespace, name)."""
    queue_of = {(_meta(lq).get("namespace", ""), _meta(lq).get("name", "")): str((lq.get("spec") or {}).get(
        "clusterQueue") or "") for lq in local_queues}
    free = {str(_meta(cq).get("name", "")): _free(cq) for cq in cluster_queues
            if "flavorsReservation" in (cq.get("status") or {})}  # a queue Kueue has not reported on: unknown room
    elastic: list[_Elastic] = []
    pending: dict[str, list[Mapping[str, Any]]] = {}
    for wl in workloads:
        if _finished(wl):
            continue
        meta = _meta(wl)
        if not _reserved(wl):
            cq = queue_of.get((meta.get("namespace", ""), str((wl.get("spec") or {}).get("queueName") or "")), "")
            if cq in free:
                pending.setdefault(cq, []).append(wl)
            continue
        found = _elastic(wl, jobs, now)
        if found is not None and found.cluster_queue in free:
            elastic.append(found)
    out: list[Decision] = []
    for cq, room in free.items():
        mine = [e for e in elastic if e.cluster_queue == cq]
        waiting = pending.get(cq, [])
        if any(e.in_flight for e in mine) or any(_is_slice(w) for w in waiting):
            continue
        if waiting:
            out += _shrinks(waiting, mine, room)
        else:
            out += _growths(mine, room, now)
    return out


def _growths(mine: list[_Elastic], room: dict[str, float], now: float) -> list[Decision]:
    out = []
    for e in sorted(mine, key=lambda e: (-e.priority, e.since)):
        if e.count >= e.rng.max_count or now < e.since + e.rng.cooldown_s:
            continue
        add = min(e.rng.step, e.rng.max_count - e.count)
        if not _fits({r: v * add for r, v in e.per_pod.items()}, room):
            continue
        for r, v in e.per_pod.items():
            room[r] = room.get(r, 0.0) - v * add
        out.append(Decision(e.namespace, e.job, e.count + add, GROWN, kind=e.kind))
    return out


def _shrinks(waiting: list[Mapping[str, Any]], mine: list[_Elastic], room: dict[str, float]) -> list[Decision]:
    out: list[Decision] = []
    counts = {id(e): e.count for e in mine}
    for wl in sorted(waiting, key=lambda w: -_priority(w)):
        need = _request(wl)
        if _fits(need, room):
            continue  # Kueue admits it as it is
        victims = sorted((e for e in mine if e.priority < _priority(wl) and counts[id(e)] > e.rng.min_count),
                         key=lambda e: (e.priority, -e.since))
        trial, taken = dict(room), {id(e): 0 for e in victims}
        for e in victims:
            while counts[id(e)] - taken[id(e)] > e.rng.min_count and not _fits(need, trial):
                taken[id(e)] += 1
                for r, v in e.per_pod.items():
                    trial[r] = trial.get(r, 0.0) + v
        if not _fits(need, trial):
            continue  # even every victim at its minimum is not enough: Kueue preempts whole, as it would
        preemptor = _run_of(wl)
        for e in victims:
            if taken[id(e)]:
                counts[id(e)] -= taken[id(e)]
                out.append(Decision(e.namespace, e.job, counts[id(e)], SHRUNK_FOR_PREEMPTOR, preemptor, e.kind))
        room.clear()
        room.update({r: v - need.get(r, 0.0) for r, v in trial.items()})  # the preemptor's, once admitted
    return out


def _elastic(wl: Mapping[str, Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]],
             now: float) -> _Elastic | None:
    meta = _meta(wl)
    found = owner(wl)
    job = jobs.get((str(meta.get("namespace", "")), found[1])) if found else None
    if job is None or found is None or job.get("kind") != found[0]:
        return None
    rng = elastic_range(job)
    # a RayJob resizes its worker group's pod set only; its head stays (Kueue names the pod set as the group)
    pod_set = str(worker_group(job).get("groupName") or "") if found[0] == "RayJob" else None
    admitted = admitted_count(wl, pod_set)
    if rng is None or not admitted or (job.get("spec") or {}).get("suspend"):
        return None
    usage: dict[str, float] = {}
    for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        if pod_set is not None and psa.get("name") != pod_set:
            continue
        for r, v in (psa.get("resourceUsage") or {}).items():
            usage[r] = usage.get(r, 0.0) + quantity(v)
    job_meta = _meta(job)
    annotations = job_meta.get("annotations") or {}
    if found[0] == "RayJob":  # its spec keeps the written size (KubeRay reads it once): its Ray cluster's, as
        # KubeRay copies the RayCluster's status into the RayJob's (one worker group: its clamped replicas)
        desired = ((job.get("status") or {}).get("rayClusterStatus") or {}).get("desiredWorkerReplicas")
        size = admitted if desired is None else int(desired)
        if _unfollowed_shrink(annotations, admitted, now):  # KubeRay's status may lag taugrid's patch
            size = -1
    else:
        size = int((job.get("spec") or {}).get("parallelism") or 1)
    return _Elastic(namespace=str(meta.get("namespace", "")), job=found[1], kind=found[0],
                    cluster_queue=str(((wl.get("status") or {}).get("admission") or {}).get("clusterQueue") or ""),
                    priority=_priority(wl), count=admitted, rng=rng,
                    per_pod={r: v / admitted for r, v in usage.items()},
                    since=_last_resize(annotations) or _stamp((job.get("status") or {}).get("startTime"))
                    or _stamp(job_meta.get("creationTimestamp")),
                    in_flight=size != admitted or bool(annotations.get(ANNOTATION_RESIZE_REQUESTED)))


def _free(cq: Mapping[str, Any]) -> dict[str, float]:
    """Nominal quota less what is reserved, per resource over the queue's flavors."""
    room = nominal(cq)
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            name = str(res.get("name", ""))
            room[name] = room.get(name, 0.0) - quantity(res.get("total", 0))
    return room


def _request(wl: Mapping[str, Any]) -> dict[str, float]:
    """What a pending workload asks for: each pod set's count times its pod's container requests."""
    out: dict[str, float] = {}
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        count = int(ps.get("count") or 1)
        spec = (ps.get("template") or {}).get("spec") or {}
        for c in spec.get("containers") or []:
            for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
                out[r] = out.get(r, 0.0) + quantity(v) * count
    return out


def _fits(need: Mapping[str, float], room: Mapping[str, float]) -> bool:
    return all(v <= room.get(r, 0.0) + 1e-9 for r, v in need.items() if v > 0)


def _priority(wl: Mapping[str, Any]) -> int:
    return int((wl.get("spec") or {}).get("priority") or 0)


def _run_of(wl: Mapping[str, Any]) -> str:
    """The run a workload is for: its run-id label, else its pod template's (Kueue copies the Job's template into
    the pod sets), else its own name."""
    for labels in [_meta(wl).get("labels") or {}, *[((ps.get("template") or {}).get("metadata") or {}).get(
            "labels") or {} for ps in (wl.get("spec") or {}).get("podSets") or []]]:
        if labels.get(LABEL_RUN_ID):
            return str(labels[LABEL_RUN_ID])
    return str(_meta(wl).get("name", ""))


def _reserved(wl: Mapping[str, Any]) -> bool:
    """Whether Kueue has reserved the workload's quota (``QuotaReserved``: admitted, or waiting on its checks)."""
    conds = (wl.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "True" for c in conds)


def _is_slice(wl: Mapping[str, Any]) -> bool:
    return SLICE_REPLACEMENT_FOR in (_meta(wl).get("annotations") or {})


def _finished(wl: Mapping[str, Any]) -> bool:
    conds = (wl.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Finished" and c.get("status") == "True" for c in conds)


def _last_resize(annotations: Mapping[str, Any]) -> float:
    try:
        return _stamp(json.loads(str(annotations.get(ANNOTATION_RESIZED) or "{}")).get("at"))
    except (ValueError, AttributeError):
        return 0.0


def _unfollowed_shrink(annotations: Mapping[str, Any], admitted: int, now: float) -> bool:
    """Whether taugrid's last recorded resize of a RayJob is a shrink, at most ``RAY_FOLLOW_S`` old, that Kueue
    has not recorded yet (the Workload still admits the old count). Later, or once the count moved otherwise
    (KubeRay's autoscaler writes the same replicas), the record no longer holds the queue."""
    try:
        record = json.loads(str(annotations.get(ANNOTATION_RESIZED) or "{}"))
        old, new = int(record["old_count"]), int(record["new_count"])
    except (ValueError, KeyError, TypeError):
        return False
    return new < old == admitted and now - _stamp(record.get("at")) < RAY_FOLLOW_S


def _stamp(text: Any) -> float:
    """An RFC 3339 time as epoch seconds; 0 for none."""
    if not text:
        return 0.0
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return at if math.isfinite(at) else 0.0


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})
