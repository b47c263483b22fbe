"""Render a ``platform.yaml`` as the Kueue objects a cluster needs (``kueue.x-k8s.io/v1beta2``).

``render_platform(p)`` → Topologies, ResourceFlavors, Cohorts (parents before children), ClusterQueues,
LocalQueues and WorkloadPriorityClasses, in that order, so a server-side apply in list order never names an
object that does not exist yet (Kueue tolerates that anyway, but ``kubectl get`` reads better).

Invariants:
  * pure and deterministic: the same platform gives byte-identical objects;
  * field names are those of the served v1beta2 CRDs in ``deploy/crds`` (``spec.cohortName``, not the
    v1beta1 ``spec.cohort``); every object passes ``taugrid.render.validate.validate``;
  * quotas are rendered as Kubernetes quantity strings exactly as written in platform.yaml (``192`` → "192",
    ``1800Gi`` stays "1800Gi"); fair-sharing weights as quantity strings (``2.0`` → "2");
  * a ClusterQueue without a ``namespace_selector`` gets ``{}`` (every namespace may submit) — a null
    selector would mean *no* namespace, which is never what an omitted key means in platform.yaml;
  * every object carries ``taugrid.io/managed-by: taugrid`` so operators can find what taugrid owns.
"""

from __future__ import annotations

from typing import Any

from taugrid.config.platform import (
    ClusterQueue,
    Cohort,
    LocalQueue,
    Platform,
    PriorityClass,
    ResourceFlavor,
    Taint,
    Toleration,
    Topology,
)

API_VERSION = "kueue.x-k8s.io/v1beta2"
MANAGED = {"taugrid.io/managed-by": "taugrid"}
ANNOTATION_PREEMPTIBLE = "taugrid.io/preemptible"


def render_platform(p: Platform) -> list[dict[str, Any]]:
    """Every Kueue object ``p`` describes, in apply order (departments' cohorts and ClusterQueues included),
    then the KAI Queues of its departments (``render.kai``)."""
    from taugrid.render.kai import render_kai_queues

    return [
        *(topology(t) for t in p.topologies),
        *(resource_flavor(f) for f in p.resource_flavors),
        *(cohort(c) for c in _parents_first(p.all_cohorts())),
        *(cluster_queue(q) for q in p.all_cluster_queues()),
        *(local_queue(q) for q in p.local_queues),
        *(priority_class(pc) for pc in p.priority_classes),
        *render_kai_queues(p),
    ]


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(MANAGED)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def quantity(value: str | int | float) -> str:
    """A Kubernetes quantity string: ints and whole floats without a fraction, strings as written."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value).strip()


def _taint(t: Taint) -> dict[str, Any]:
    out: dict[str, Any] = {"key": t.key, "effect": t.effect}
    if t.value:
        out["value"] = t.value
    return out


def toleration(t: Toleration) -> dict[str, Any]:
    """A core/v1 Toleration; empty fields are omitted (an empty key with Exists tolerates everything)."""
    out: dict[str, Any] = {"operator": t.operator}
    if t.key:
        out["key"] = t.key
    if t.value and t.operator == "Equal":
        out["value"] = t.value
    if t.effect:
        out["effect"] = t.effect
    return out


def resource_flavor(f: ResourceFlavor) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if f.node_labels:
        spec["nodeLabels"] = {k: str(v) for k, v in f.node_labels.items()}
    if f.taints:
        spec["nodeTaints"] = [_taint(t) for t in f.taints]
    if f.tolerations:
        spec["tolerations"] = [toleration(t) for t in f.tolerations]
    if f.topology_name is not None:
        spec["topologyName"] = f.topology_name
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(f.name), "spec": spec}


def topology(t: Topology) -> dict[str, Any]:
    """Kueue's TAS ``Topology``: its levels as node labels, highest first (Kueue reads them in that order)."""
    return {"apiVersion": API_VERSION, "kind": "Topology", "metadata": _meta(t.name),
            "spec": {"levels": [{"nodeLabel": level} for level in t.levels]}}


def cohort(c: Cohort) -> dict[str, Any]:
    spec: dict[str, Any] = {"fairSharing": {"weight": quantity(c.fair_weight)}}
    if c.parent:
        spec["parentName"] = c.parent
    return {"apiVersion": API_VERSION, "kind": "Cohort", "metadata": _meta(c.name), "spec": spec}


def _parents_first(cohorts: list[Cohort]) -> list[Cohort]:
    by_name = {c.name: c for c in cohorts}
    out: list[Cohort] = []
    seen: set[str] = set()

    def visit(c: Cohort, trail: frozenset[str]) -> None:
        if c.name in seen or c.name in trail:  # a cycle is platformcheck's to report; do not loop on it
            return
        parent = by_name.get(c.parent or "")
        if parent is not None:
            visit(parent, trail | {c.name})
        seen.add(c.name)
        out.append(c)

    for c in cohorts:
        visit(c, frozenset())
    return out


def cluster_queue(q: ClusterQueue) -> dict[str, Any]:
    groups = []
    for g in q.resource_groups:
        flavors = []
        for f in g.flavors:
            resources = []
            for r in f.resources:
                entry: dict[str, Any] = {"name": r.name, "nominalQuota": quantity(r.nominal_quota)}
                if r.borrowing_limit is not None:
                    entry["borrowingLimit"] = quantity(r.borrowing_limit)
                if r.lending_limit is not None:
                    entry["lendingLimit"] = quantity(r.lending_limit)
                resources.append(entry)
            flavors.append({"name": f.name, "resources": resources})
        groups.append({"coveredResources": list(g.covered_resources), "flavors": flavors})
    preemption: dict[str, Any] = {
        "withinClusterQueue": q.preemption.within_cluster_queue,
        "reclaimWithinCohort": q.preemption.reclaim_within_cohort,
    }
    bwc = q.preemption.borrow_within_cohort
    if bwc.policy != "Never" or bwc.max_priority_threshold is not None:
        preemption["borrowWithinCohort"] = {"policy": bwc.policy}
        if bwc.max_priority_threshold is not None:
            preemption["borrowWithinCohort"]["maxPriorityThreshold"] = bwc.max_priority_threshold
    selector: dict[str, Any] = (
        {"matchLabels": {k: str(v) for k, v in q.namespace_selector.items()}} if q.namespace_selector else {}
    )
    spec: dict[str, Any] = {
        "namespaceSelector": selector,
        "queueingStrategy": q.queueing_strategy,
        "resourceGroups": groups,
        "preemption": preemption,
        "fairSharing": {"weight": quantity(q.fair_sharing.weight)},
    }
    ff = q.flavor_fungibility
    if ff.model_fields_set or ff != type(ff)():  # only when the platform sets it: Kueue's defaults otherwise
        spec["flavorFungibility"] = {"whenCanBorrow": ff.when_can_borrow, "whenCanPreempt": ff.when_can_preempt}
        if ff.preference is not None:
            spec["flavorFungibility"]["preference"] = ff.preference
    if q.cohort:
        spec["cohortName"] = q.cohort
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(q.name), "spec": spec}


def configuration_note(p: Platform) -> str:
    """What Kueue's controller Configuration needs for the platform's ``fair_sharing`` ("" when it is unset):
    Kueue has no API object for it, so ``render`` can only say it."""
    if "fair_sharing" not in p.model_fields_set:
        return ""
    fs = p.fair_sharing
    enable = fs.enable if fs.enable is not None else any(q.fair_sharing.weight != 1.0 for q in p.cluster_queues)
    strategies = ", ".join(fs.preemption_strategies)
    return ("# fair_sharing is Kueue's controller Configuration, not an API object; set it in the kueue-manager-config"
            f" ConfigMap:\n#   fairSharing: {{enable: {str(enable).lower()}, preemptionStrategies: [{strategies}]}}\n")


def local_queue(q: LocalQueue) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": _meta(q.name, q.namespace),
        "spec": {"clusterQueue": q.cluster_queue},
    }


def priority_class(pc: PriorityClass) -> dict[str, Any]:
    meta = _meta(pc.name)
    # Kueue has no "never preempt" flag; keep ours visible on the object for operators and audits.
    meta["annotations"] = {ANNOTATION_PREEMPTIBLE: "true" if pc.preemptible else "false"}
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": meta,
                           "value": pc.value}
    if pc.description:
        out["description"] = pc.description
    return out
