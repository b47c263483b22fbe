"""Build engine objects from the ported Kueue test data (``cases_*.json``, written by ``extract.py``)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from taugrid.core.admission import (
    BorrowWithinCohort,
    BorrowWithinCohortPolicy,
    ClusterQueue,
    Cohort,
    Engine,
    FlavorFungibility,
    FlavorQuotas,
    LocalQueue,
    PodSet,
    PreemptionPolicy,
    QueueingStrategy,
    ReclaimWithinCohort,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Taint,
    Toleration,
    WithinClusterQueue,
    Workload,
)

HERE = Path(__file__).parent
OLDEST = -1e9  # Go's zero time: older than any timestamp a case sets

_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}


def qty(text: str) -> float:
    """A Kubernetes quantity ("2", "500m", "3Gi", or "count*qty") as a number in base units."""
    if "*" in text:
        n, _, rest = text.partition("*")
        return int(n) * qty(rest)
    m = re.fullmatch(r"(-?[0-9.]+)([a-zA-Z]*)", text.strip())
    if m is None or m.group(2) not in _SUFFIX:
        raise ValueError(f"quantity {text!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


@cache
def load(kind: str) -> dict[str, Any]:
    return json.loads((HERE / f"cases_{kind}.json").read_text())


# Kueue's tests count GPUs as the extended resource example.com/gpu; the engine's GPUs are nvidia.com/gpu.
GPU_NAMES = ("nvidia.com/gpu", "example.com/gpu")


def load_cases(kind: str) -> list[dict[str, Any]]:
    """The cases of ``cases_<kind>.json`` with Kueue's example.com/gpu renamed to the engine's nvidia.com/gpu."""
    return json.loads(json.dumps(load(kind)["cases"]).replace(GPU_NAMES[1], GPU_NAMES[0]))  # type: ignore[no-any-return]


def groups(spec: list[list[dict[str, Any]]], limits: bool = True) -> tuple[ResourceGroup, ...]:
    """Resource groups; ``limits=False`` drops borrowing/lending limits (Kueue's tests set them on queues without
    a cohort, where they mean nothing; the engine refuses them there as Kueue's webhook does)."""
    out = []
    for g in spec:
        covered = tuple(dict.fromkeys(r for fq in g for r in fq["resources"]))
        out.append(ResourceGroup(covered, tuple(
            FlavorQuotas(fq["name"], {r: ResourceQuota(qty(v[0]), None if v[1] is None or not limits else qty(v[1]),
                                                       None if v[2] is None or not limits else qty(v[2]))
                                      for r, v in fq["resources"].items()}) for fq in g)))
    return tuple(out)


def cluster_queue(spec: dict[str, Any]) -> ClusterQueue:
    p = spec["preemption"]
    bwc = p["bwc"] or {"policy": "Never", "threshold": None}
    fung = spec.get("fungibility") or {}
    return ClusterQueue(
        spec["name"], groups(spec["groups"], limits=spec["cohort"] is not None), cohort=spec["cohort"],
        queueing_strategy=QueueingStrategy(spec["strategy"]),
        preemption=PreemptionPolicy(WithinClusterQueue(p["within"]), ReclaimWithinCohort(p["reclaim"]),
                                    BorrowWithinCohort(BorrowWithinCohortPolicy(bwc["policy"]), bwc["threshold"])),
        fair_weight=spec["fair_weight"],
        flavor_fungibility=FlavorFungibility(
            when_can_borrow=fung.get("when_can_borrow") or "MayStopSearch",
            when_can_preempt=fung.get("when_can_preempt") or "TryNextFlavor",
            preference=fung.get("preference")))


def cohort(spec: dict[str, Any]) -> Cohort:
    return Cohort(spec["name"], parent=spec["parent"], resource_groups=groups(spec["groups"]),
                  fair_weight=spec["fair_weight"])


def flavor(spec: dict[str, Any]) -> ResourceFlavor:
    return ResourceFlavor(spec["name"], dict(spec["labels"]),
                          tuple(Taint(t["key"], t["value"], t["effect"]) for t in spec["taints"]))


def workload(spec: dict[str, Any], queue: str, name: str | None = None) -> Workload:
    created = spec["created"]
    return Workload(
        name or spec["name"], queue,
        tuple(PodSet(ps["name"], ps["count"], {r: qty(v) for r, v in ps["requests"].items()},
                     node_selector=dict(ps["node_selector"]),
                     tolerations=tuple(Toleration(t["key"], t["operator"], t["value"], t["effect"])
                                       for t in ps["tolerations"])) for ps in spec["pod_sets"]),
        priority=spec["priority"], created_at=OLDEST if created is None else created)


def restore(engine: Engine, spec: dict[str, Any], name: str | None = None) -> None:
    """Load an admitted workload with its recorded flavors and usage."""
    adm = spec["admission"]
    by_name = {p["name"]: p for p in adm["pod_sets"]}
    flavors, usage = [], []
    for ps in spec["pod_sets"]:
        a = by_name.get(ps["name"], {"flavors": {}, "usage": {}})
        flavors.append(dict(a["flavors"]))
        usage.append({r: qty(v) for r, v in a["usage"].items()})
    at = spec["reserved_at"]
    evicted = any(c["type"] == "Evicted" and c["status"] == "True" for c in spec["conditions"])
    engine.restore(workload(spec, adm["cq"], name), flavors, OLDEST if at is None else at, usage=usage,
                   evicted=evicted)


def engine(case: dict[str, Any], *, local_queues: list[dict[str, str]] = (), fair_sharing: bool = False
           ) -> Engine:  # type: ignore[assignment]
    gates = case.get("feature_gates") or {}
    return Engine([cluster_queue(c) for c in case["cluster_queues"]], [cohort(c) for c in case["cohorts"]],
                  [flavor(f) for f in case["flavors"]],
                  local_queues=[LocalQueue(f"{lq['namespace']}/{lq['name']}", lq["cq"]) for lq in local_queues],
                  fair_sharing=fair_sharing,
                  recompute_on_overlap=gates.get("RecomputeAssignmentUponPreemptionTargetsOverlap", True))
