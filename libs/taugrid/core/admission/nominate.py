"""Flavor assignment ("nominate"): which flavor each pod set takes, and whether that fits, borrows or preempts.

Role: Kueue's flavor assigner (``flavorassigner.go``, FlavorFungibility on, as by default). Per pod set and per
resource group, flavors are tried in the ClusterQueue's order; a flavor is eligible only when it exists, its node
labels agree with the pod set's node selector and its taints are tolerated. Each (flavor, resource) gets a
*granular mode*: a preemption mode (NoFit < NoCandidates < Preempt < Reclaim < Fit; Preempt/Reclaim/NoCandidates
come from simulating preemption for that resource alone, Reclaim when every victim is in another queue) and a
borrowing level (how far up the cohort tree it must borrow; 0 = not at all). A flavor's mode is its worst
resource's; the search stops at a flavor unless ``flavorFungibility`` says to try the next one
(``whenCanBorrow``/``whenCanPreempt: TryNextFlavor``, or no candidates / no fit), and keeps the preferred flavor
seen (``preference``: BorrowingOverPreemption compares preemption mode then borrowing level, PreemptionOverBorrowing
the other way round).

Invariant: the returned usage is what the workload would add to its ClusterQueue, per (flavor, resource),
summed over all pods of all pod sets (a gang is charged whole).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from . import results as R
from .model import (
    BorrowWithinCohortPolicy,
    ClusterQueue,
    FlavorFungibility,
    FungibilityPreference,
    PodSet,
    ReclaimWithinCohort,
    ResourceFlavor,
    Topology,
    WhenCanBorrow,
    WhenCanPreempt,
    Workload,
    from_units,
    untolerated,
)
from .quota import FR, QNode, QuotaTree
from .results import TopologyAssignment


class Mode(IntEnum):
    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


class PMode(IntEnum):
    """Kueue's ``preemptionMode`` for one (flavor, resource)."""

    NO_FIT = 0
    NO_CANDIDATES = 1
    PREEMPT = 2
    RECLAIM = 3
    FIT = 4

    @property
    def mode(self) -> Mode:
        if self == PMode.NO_FIT:
            return Mode.NO_FIT
        return Mode.FIT if self == PMode.FIT else Mode.PREEMPT


Granular = tuple[PMode, int]  # (preemption mode, borrowing level)
WORST: Granular = (PMode.NO_FIT, 1 << 30)
BEST: Granular = (PMode.FIT, 0)

# Simulates preemption for one (flavor, resource) needing ``val`` in total: (mode, borrowing level after it).
Oracle = Callable[[FR, int], Granular]


def is_preferred(a: Granular, b: Granular, fung: FlavorFungibility) -> bool:
    """Kueue ``isPreferred``: is ``a`` strictly better than ``b``?"""
    if a[0] == PMode.NO_FIT:
        return False
    if b[0] == PMode.NO_FIT:
        return True
    a_none, b_none = a[0] == PMode.NO_CANDIDATES, b[0] == PMode.NO_CANDIDATES
    if a_none != b_none:
        return not a_none
    if fung.preference == FungibilityPreference.PREEMPTION_OVER_BORROWING:
        if a[1] != b[1]:
            return a[1] < b[1]
        return a[0] > b[0]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] < b[1]


def try_next_flavor(mode: Granular, fung: FlavorFungibility) -> bool:
    """Kueue ``shouldTryNextFlavor``."""
    if mode[0] in (PMode.NO_FIT, PMode.NO_CANDIDATES):
        return True
    if mode[0] in (PMode.PREEMPT, PMode.RECLAIM) and fung.when_can_preempt == WhenCanPreempt.TRY_NEXT_FLAVOR:
        return True
    return mode[1] > 0 and fung.when_can_borrow == WhenCanBorrow.TRY_NEXT_FLAVOR


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
    modes: dict[str, Mode] = field(default_factory=dict)  # resource -> Fit or Preempt


@dataclass(slots=True)
class Assignment:
    mode: Mode
    borrows: bool = False
    borrowing: int = 0  # Kueue's Assignment.Borrowing: height of the smallest cohort subtree it fits in
    pod_sets: list[PodSetAssignment] = field(default_factory=list)
    usage: dict[FR, int] = field(default_factory=dict)
    reason: str = ""
    message: str = ""
    shortfalls: list[Shortfall] = field(default_factory=list)
    topology: dict[str, TopologyAssignment] = field(default_factory=dict)  # TAS pod sets, when it fits

    @property
    def frs_need_preemption(self) -> set[FR]:
        return {(f, r) for p in self.pod_sets for r, f in p.flavors.items() if p.modes.get(r) == Mode.PREEMPT}


def fmt(units: int) -> str:
    return str(from_units(units))


def _classify(tree: QuotaTree, node: QNode, cq: ClusterQueue, fr: FR, prev: int, req: int,
              reasons: list[str], shortfalls: list[Shortfall], oracle: Oracle | None,
              fair_sharing: bool) -> Granular:
    """Kueue ``fitsResourceQuota``."""
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
        return PMode.NO_FIT, 0
    borrow, may_reclaim = tree.borrow_height(node, fr, val)
    avail = max(0, tree.available(node, fr))
    if val <= avail:
        return PMode.FIT, borrow
    reasons.append(f"insufficient unused quota for {resource} in flavor {flavor}, {fmt(val - avail)} more needed")
    shortfalls.append(Shortfall(flavor, resource, val, avail, pot))
    p = cq.preemption
    while_borrowing = (p.borrow_within_cohort.policy != BorrowWithinCohortPolicy.NEVER
                       or (fair_sharing and p.reclaim_within_cohort != ReclaimWithinCohort.NEVER))
    if nominal >= val or may_reclaim or while_borrowing:
        if oracle is None:
            return PMode.NO_CANDIDATES, borrow
        return oracle(fr, val)
    return PMode.NO_FIT, borrow


def tas_only(cq: ClusterQueue, flavors: Mapping[str, ResourceFlavor]) -> bool:
    """Kueue ``IsTASOnly``: every flavor of the ClusterQueue has a topology (pod sets without a request are then
    placed by TAS as if unconstrained: Kueue's implied TAS)."""
    names = [fq.name for g in cq.resource_groups for fq in g.flavors]
    return bool(names) and all(flavors.get(n) is not None and flavors[n].topology_name is not None for n in names)


def _tas_mismatch(ps: PodSet, rf: ResourceFlavor, covered: tuple[str, ...], implied: bool,
                  topologies: Mapping[str, Topology]) -> str | None:
    """Kueue ``checkPodSetAndFlavorMatchForTAS``: why this flavor cannot serve this pod set's topology needs."""
    tr = ps.topology_request
    if tr is not None:
        if rf.topology_name is None:
            if not any(r in ps.requests for r in covered):
                return None
            return f'Flavor "{rf.name}" does not support TopologyAwareScheduling'
        topo = topologies.get(rf.topology_name)
        if topo is None:
            return f'Flavor "{rf.name}" information missing in TAS cache'
        if any(k is not None and k not in topo.levels for k in (tr.required, tr.preferred, tr.slice_required)):
            return f'Flavor "{rf.name}" does not contain the requested level'
        return None
    if rf.topology_name is not None and not implied:
        return f'Flavor "{rf.name}" supports only TopologyAwareScheduling'
    return None


@functools.lru_cache(maxsize=256)
def _plain_flavor(name: str) -> ResourceFlavor:
    """A flavor the engine was given no definition of: no labels, no taints (one object per name, not one per
    nomination)."""
    return ResourceFlavor(name)


def nominate(tree: QuotaTree, node: QNode, cq: ClusterQueue, flavors: Mapping[str, ResourceFlavor],
             workload: Workload, requests: list[dict[str, int]], oracle: Oracle | None = None, *,
             known_flavors_only: bool = False, fair_sharing: bool = False,
             sticky: Mapping[tuple[str, str], str] | None = None,
             topologies: Mapping[str, Topology] | None = None,
             excluded: Mapping[tuple[str, str], str] | None = None,
             original: Mapping[tuple[str, str], str] | None = None) -> Assignment:
    """Assign a flavor to every (pod set, resource group) the workload touches; see module docstring.

    ``topologies`` turns on Kueue's TAS flavor checks; ``excluded`` maps (pod set, flavor) to why that flavor's
    topology cannot hold the pod set (the engine's TAS pass), so the search moves on to the next flavor.
    ``original`` maps (pod set, resource) to the flavor of the slice a scale-up slice replaces: no other flavor
    may take that resource (Kueue's ElasticJobsViaWorkloadSlices keeps a resized workload on its flavors)."""
    fung = cq.flavor_fungibility
    implied = topologies is not None and tas_only(cq, flavors)
    out = Assignment(mode=Mode.FIT)
    assigned: dict[FR, int] = {}
    counts_pods = any("pods" in g.covered_resources for g in cq.resource_groups)
    for ps, req in zip(workload.pod_sets, requests, strict=True):
        if counts_pods:  # Kueue charges one "pods" per pod when the ClusterQueue has a quota for pods
            req = {**req, "pods": ps.count * 1000}
        psa = PodSetAssignment(ps.name, ps.count, {}, {})
        covered: set[str] = set()
        for group in cq.resource_groups:
            # A resource belongs to the first group covering it (Kueue ``RGByResource``).
            wanted = [r for r in group.covered_resources if r in req and r not in psa.flavors]
            covered.update(group.covered_resources)
            if not wanted:
                continue
            best: tuple[Granular, str, dict[str, PMode]] | None = None
            reasons: list[str] = []
            shortfalls: list[Shortfall] = []
            for fq in group.flavors:
                # A recomputation keeps each resource on the flavor it was nominated (Kueue's nomination mapping).
                stuck = (next((r for r in wanted if sticky.get((ps.name, r), fq.name) != fq.name), None)
                         if sticky else None)
                if stuck is not None:
                    reasons.append(f"skipping flavor {fq.name} as it is not found in the nomination mapping for "
                                   f"resource {stuck}")
                    continue
                moved = [r for r in wanted if original.get((ps.name, r), fq.name) != fq.name] if original else None
                if moved:
                    reasons.extend(f"could not assign {fq.name} flavor since the original workload is assigned: "
                                   f"{original[(ps.name, r)]}" for r in moved if original)
                    continue
                rf = flavors.get(fq.name)
                if rf is None:
                    if known_flavors_only:
                        reasons.append(f"flavor {fq.name} not found")
                        continue
                    rf = _plain_flavor(fq.name)
                if topologies is not None:
                    mismatch = _tas_mismatch(ps, rf, group.covered_resources, implied, topologies)
                    if mismatch is not None:
                        reasons.append(mismatch)
                        continue
                if ps.node_selector and any(ps.node_selector.get(k, v) != v for k, v in rf.node_labels.items()):
                    reasons.append(f"flavor {fq.name} doesn't match node affinity")
                    continue
                taint = untolerated(rf.taints, workload.tolerations + ps.tolerations) if rf.taints else None
                if taint is not None:
                    reasons.append(f"untolerated taint {{{taint.key}: {taint.value}}} in flavor {fq.name}")
                    continue
                if excluded and (ps.name, fq.name) in excluded:
                    reasons.append(excluded[(ps.name, fq.name)])
                    continue
                rep: Granular = BEST
                modes: dict[str, PMode] = {}
                for r in wanted:
                    fr = (fq.name, r)
                    m = _classify(tree, node, cq, fr, assigned.get(fr, 0), req[r], reasons, shortfalls, oracle,
                                  fair_sharing)
                    if is_preferred(rep, m, fung):
                        rep = m
                    modes[r] = m[0]
                    if rep[0] == PMode.NO_FIT:
                        break
                if rep[0] == PMode.NO_FIT:
                    continue
                if not try_next_flavor(rep, fung):
                    best = (rep, fq.name, modes)
                    break
                if best is None or is_preferred(rep, best[0], fung):
                    best = (rep, fq.name, modes)
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
            (pmode, borrow), fname, modes = best
            fmode = pmode.mode
            if fmode < out.mode:
                out.mode = fmode
            out.borrowing = max(out.borrowing, borrow)
            out.borrows = out.borrowing > 0
            if fmode == Mode.PREEMPT and not out.message:
                out.reason = R.WAITING_FOR_QUOTA
                out.message = R.msg_couldnt_assign(ps.name, [x for x in reasons if fname in x] or reasons)
            for r in wanted:
                psa.flavors[r] = fname
                psa.modes[r] = modes.get(r, PMode.FIT).mode
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
