"""Kueue's ``Workload.status.admission.podSetAssignments[].topologyAssignment``, both ways. Pure.

Kueue's v1beta2 Workload (the CRD of v0.19.2 in ``deploy/crds``) stores it compressed: ``levels`` (the node label
keys, highest first; only ``kubernetes.io/hostname`` when the topology's lowest level is the hostname) and
``slices``, each covering ``domainCount`` domains with, per level, one ``universal`` value or ``individual``
``roots`` between an optional common ``prefix`` and ``suffix``, and ``podCounts`` ``universal`` or
``individual``. The full assignment is the slices' domains in order. v1beta1 stores the same as ``domains:
[{values, count}]``. ``decode`` reads either; ``encode`` writes v1beta2's form as Kueue does (one slice, a level's
values ``universal`` when all equal, else a common prefix and suffix taken out, pod counts ``universal`` when all
equal), so the local cluster's Workload reads like the real one.

Domains are in the order pods fill them (Kueue's rank ordering): ``ranks`` expands them to one domain per pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taugrid.core.contracts import PodSetTopology, TopologyDomain


def encode(levels: Sequence[str], domains: Sequence[TopologyDomain]) -> dict[str, Any]:
    """The v1beta2 ``topologyAssignment`` object of ``domains`` (values one per level, highest first)."""
    if not domains:
        return {"levels": list(levels), "slices": []}
    per_level = [_level_values([d.values[i] for d in domains]) for i in range(len(levels))]
    counts = [d.count for d in domains]
    pod_counts: dict[str, Any] = {"universal": counts[0]} if len(set(counts)) == 1 else {"individual": counts}
    return {"levels": list(levels),
            "slices": [{"domainCount": len(domains), "valuesPerLevel": per_level, "podCounts": pod_counts}]}


def _level_values(values: list[str]) -> dict[str, Any]:
    if len(set(values)) == 1:
        return {"universal": values[0]}
    prefix, suffix = _common_prefix(values), _common_prefix([v[::-1] for v in values])[::-1]
    shortest = min(len(v) for v in values)
    prefix = prefix[:max(0, shortest - len(suffix))]  # never overlapping ("ababa", "aba")
    out: dict[str, Any] = {"roots": [v[len(prefix):len(v) - len(suffix)] for v in values]}
    if prefix:
        out["prefix"] = prefix
    if suffix:
        out["suffix"] = suffix
    return {"individual": out}


def _common_prefix(values: list[str]) -> str:
    first, last = min(values), max(values)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def decode(pod_set: str, assignment: Mapping[str, Any]) -> PodSetTopology:
    """A ``topologyAssignment`` of either API version as ``PodSetTopology``; ValueError naming what is wrong."""
    levels = [str(k) for k in assignment.get("levels") or []]
    if not levels:
        raise ValueError("topologyAssignment has no levels")
    if "slices" in assignment:
        domains = [d for s in assignment.get("slices") or [] for d in _slice(s, len(levels))]
    else:  # v1beta1
        domains = [TopologyDomain(values=[str(v) for v in d.get("values") or []], count=int(d.get("count", 0)))
                   for d in assignment.get("domains") or []]
    for d in domains:
        if len(d.values) != len(levels) or d.count < 1:
            raise ValueError(f"topologyAssignment domain {d.values} x{d.count} does not match levels {levels}")
    return PodSetTopology(pod_set=pod_set, levels=levels, domains=domains)


def _slice(s: Mapping[str, Any], levels: int) -> list[TopologyDomain]:
    n = int(s.get("domainCount", 0))
    per_level = s.get("valuesPerLevel") or []
    if n < 1 or len(per_level) != levels:
        raise ValueError(f"topologyAssignment slice of {n} domain(s) has {len(per_level)} level(s), not {levels}")
    columns = [_values(v, n) for v in per_level]
    counts = s.get("podCounts") or {}
    individual = [int(c) for c in counts.get("individual") or []]
    pods = [int(counts["universal"])] * n if "universal" in counts else individual
    if len(pods) != n:
        raise ValueError(f"topologyAssignment slice has {len(pods)} pod count(s) for {n} domain(s)")
    return [TopologyDomain(values=[col[i] for col in columns], count=pods[i]) for i in range(n)]


def _values(level: Mapping[str, Any], n: int) -> list[str]:
    if "universal" in level:
        return [str(level["universal"])] * n
    ind = level.get("individual") or {}
    roots = [str(r) for r in ind.get("roots") or []]
    if len(roots) != n:
        raise ValueError(f"topologyAssignment level has {len(roots)} root(s) for {n} domain(s)")
    return [f"{ind.get('prefix') or ''}{r}{ind.get('suffix') or ''}" for r in roots]


def ranks(topology: PodSetTopology) -> list[list[str]]:
    """Per pod index (rank), the domain's values it falls in: the first domain's ``count`` pods first."""
    return [list(d.values) for d in topology.domains for _ in range(d.count)]
