"""Flavor assignment ("nominate"): which flavor each pod set takes, and whether that fits, borrows or preempts.

Role: Kueue's flavor assigner. Per pod set and per resource group, flavors are tried in the ClusterQueue's
order; a flavor is eligible only when its node labels agree with the pod set's node selector and its taints
are tolerated. Each (flavor, resource) is classified against the quota tree:
NoFit (beyond ``potential``) < Preempt-with-borrowing < Preempt < Fit-with-borrowing < Fit.
The first Fit stops the search; a Fit-with-borrowing also stops it (Kueue's default
``whenCanBorrow: MayStopSearch``); Preempt keeps searching (``whenCanPreempt: TryNextFlavor``).

Invariant: the returned usage is what the workload would add to its ClusterQueue, per (flavor, resource),
summed over all pods of all pod sets (a gang is charged whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from . import results as R
from .model import (
    BorrowWithinCohortPolicy,
    ClusterQueue,
    ReclaimWithinCohort,
    ResourceFlavor,
    WithinClusterQueue,
    Workload,
    from_units,
    untolerated,
)
from .quota import FR, QNode, QuotaTree


class Mode(IntEnum):
    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


@dataclass(slots=True)
class Shortfall:
    """One (flavor, resource) that did not fit: for messages and ``explain``."""

    flavor: str
    resource: str
    needed: int
    available: int
    potential: int


@dataclass(slots=True)
class PodSetAssignment:
    name: str
    count: int
    flavors: dict[str, str]
    usage: dict[FR, int]


@dataclass(slots=True)
class Assignment:
    mode: Mode
    borrows: bool = False
    pod_sets: list[PodSetAssignment] = field(default_factory=list)
    usage: dict[FR, int] = field(default_factory=dict)
    reason: str = ""
    message: str = ""
    shortfalls: list[Shortfall] = field(default_factory=list)


def fmt(units: int) -> str:
    return str(from_units(units))


def _can_preempt(cq: ClusterQueue, val: int, nominal: int) -> bool:
    p = cq.preemption
    bwc = p.borrow_within_cohort.policy != BorrowWithinCohortPolicy.NEVER
    any_policy = (p.within_cluster_queue != WithinClusterQueue.NEVER
                  or p.reclaim_within_cohort != ReclaimWithinCohort.NEVER or bwc)
    return any_policy and (val <= nominal or bwc)


def _classify(tree: QuotaTree, node: QNode, cq: ClusterQueue, fr: FR, prev: int, req: int,
              reasons: list[str], shortfalls: list[Shortfall]) -> tuple[Mode, bool]:
    val = prev + req
    flavor, resource = fr
    nominal = node.nominal.get(fr, 0)
    pot = tree.potential(node, fr)
    if val > pot:
        if prev:
            reasons.append(f"insufficient quota for {resource} in flavor {flavor}, previously considered podsets "
                           f"requests ({fmt(prev)}) + current podset request ({fmt(req)}) > maximum capacity "
                           f"({fmt(pot)})")
        else:
            reasons.append(f"insufficient quota for {resource} in flavor {flavor}, request > maximum capacity "
                           f"({fmt(val)} > {fmt(pot)})")
        shortfalls.append(Shortfall(flavor, resource, val, tree.available(node, fr), pot))
        return Mode.NO_FIT, False
    avail = tree.available(node, fr)
    if val <= avail:
        return Mode.FIT, node.usage.get(fr, 0) + val > nominal
    reasons.append(f"insufficient unused quota for {resource} in flavor {flavor}, {fmt(val - avail)} more needed")
    shortfalls.append(Shortfall(flavor, resource, val, avail, pot))
    if _can_preempt(cq, val, nominal):
        return Mode.PREEMPT, val > nominal
    return Mode.NO_FIT, False


def _rank(mode: Mode, borrows: bool) -> int:
    return int(mode) * 2 + (0 if borrows else 1)


def nominate(tree: QuotaTree, node: QNode, cq: ClusterQueue, flavors: Mapping[str, ResourceFlavor],
             workload: Workload, requests: list[dict[str, int]]) -> Assignment:
    """Assign a flavor to every (pod set, resource group) the workload touches; see module docstring."""
    out = Assignment(mode=Mode.FIT)
    assigned: dict[FR, int] = {}
    for ps, req in zip(workload.pod_sets, requests, strict=True):
        psa = PodSetAssignment(ps.name, ps.count, {}, {})
        covered: set[str] = set()
        for group in cq.resource_groups:
            wanted = [r for r in group.covered_resources if req.get(r, 0) > 0]
            covered.update(group.covered_resources)
            if not wanted:
                continue
            best: tuple[int, str, Mode, bool] | None = None
            reasons: list[str] = []
            shortfalls: list[Shortfall] = []
            for fq in group.flavors:
                rf = flavors.get(fq.name, ResourceFlavor(fq.name))
                if any(ps.node_selector.get(k, v) != v for k, v in rf.node_labels.items()):
                    reasons.append(f"flavor {fq.name} doesn't match node affinity")
                    continue
                taint = untolerated(rf.taints, workload.tolerations)
                if taint is not None:
                    reasons.append(f"untolerated taint {{{taint.key}: {taint.value}}} in flavor {fq.name}")
                    continue
                fmode, fborrow = Mode.FIT, False
                for r in wanted:
                    fr = (fq.name, r)
                    m, b = _classify(tree, node, cq, fr, assigned.get(fr, 0), req[r], reasons, shortfalls)
                    if (m, not b) < (fmode, not fborrow):
                        fmode, fborrow = m, b
                    if m == Mode.NO_FIT:
                        break
                if fmode == Mode.NO_FIT:
                    continue
                rank = _rank(fmode, fborrow)
                if best is None or rank > best[0]:
                    best = (rank, fq.name, fmode, fborrow)
                if fmode == Mode.FIT:
                    break  # Fit stops; Fit-with-borrowing stops too (whenCanBorrow: MayStopSearch)
            out.shortfalls.extend(shortfalls)
            if best is None:
                if not group.flavors or all("insufficient" not in x for x in reasons):
                    out.reason = R.NO_MATCHING_FLAVOR
                else:
                    out.reason = R.EXCEEDS_MAX_QUOTA if all(
                        "maximum capacity" in x for x in reasons if "insufficient" in x) else R.WAITING_FOR_QUOTA
                out.mode = Mode.NO_FIT
                out.message = R.msg_couldnt_assign(ps.name, reasons)
                return out
            _, fname, fmode, fborrow = best
            if (fmode, not fborrow) < (out.mode, not out.borrows):
                out.mode = fmode
            out.borrows = out.borrows or fborrow
            if fmode == Mode.PREEMPT and not out.message:
                out.reason = R.WAITING_FOR_QUOTA
                out.message = R.msg_couldnt_assign(ps.name, [x for x in reasons if fname in x] or reasons)
            for r in wanted:
                psa.flavors[r] = fname
                fr = (fname, r)
                psa.usage[fr] = psa.usage.get(fr, 0) + req[r]
                assigned[fr] = assigned.get(fr, 0) + req[r]
        missing = [r for r, v in req.items() if v > 0 and r not in covered]
        if missing:
            out.mode = Mode.NO_FIT
            out.reason = R.NO_MATCHING_FLAVOR
            out.message = R.msg_couldnt_assign(ps.name, [f"resource {r} unavailable in ClusterQueue"
                                                         for r in sorted(missing)])
            return out
        out.pod_sets.append(psa)
    out.usage = assigned
    return out
