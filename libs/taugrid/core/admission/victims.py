"""Preemption targets for classic (priority-based) preemption, as Kueue's ``classicalPreemptions`` computes them.

Role: given a preemptor, the (flavor, resource) pairs that need preemption and its full request, find the
workloads to evict. A port of Kueue's ``preemption.go`` + ``classical/candidate_generator.go`` +
``classical/hierarchical_preemption.go``:

- candidates come in three lists: *hierarchy* candidates (workloads of queues the preemptor has a hierarchical
  advantage over: its request fits the quota of a subtree they borrow from), *priority* candidates (other
  borrowing queues of the cohort tree, allowed by ``reclaimWithinCohort``; ``borrowWithinCohort`` decides
  whether the preemptor may still borrow after evicting them) and *same-queue* candidates
  (``withinClusterQueue``). Each list is sorted by Kueue's ``CandidatesOrdering`` (evicted first, other queues
  first, lower priority first, most recently admitted first), evicted ones of all lists go first;
- a candidate of another queue stays valid only while its queue, and every cohort between it and the common
  ancestor, is still above its quota in a contested resource (victims are removed one by one, so a queue
  that dropped back to nominal stops yielding victims: no over-preemption);
- candidates are removed in order until the preemptor fits (borrowing allowed or not, per attempt), then the
  list is walked backwards putting back every victim that is not needed (minimal set).

Invariants: the ledger and node view are unchanged when planning returns; a non-preemptible workload is never
a candidate; every victim uses a contested (flavor, resource).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from . import results as R
from .model import BorrowWithinCohortPolicy, ReclaimWithinCohort, ResourceFlavor, Workload
from .placement import Alloc, Cluster
from .preemption import Candidate, reclaim_allows, within_allows
from .queues import ADMITTED, CQQueue, WState
from .quota import FR, QNode, QuotaTree


class Variant(IntEnum):
    NEVER = 0
    WITHIN_CQ = 1
    HIERARCHICAL_RECLAIM = 2
    RECLAIM_WITHOUT_BORROWING = 3
    RECLAIM_WHILE_BORROWING = 4


REASON = {Variant.WITHIN_CQ: R.IN_CLUSTER_QUEUE, Variant.HIERARCHICAL_RECLAIM: R.IN_COHORT_RECLAMATION,
          Variant.RECLAIM_WITHOUT_BORROWING: R.IN_COHORT_RECLAMATION,
          Variant.RECLAIM_WHILE_BORROWING: R.IN_COHORT_RECLAIM_WHILE_BORROWING}


class LedgerSim:
    """Remove/restore admitted workloads on the live ledger (and nodes) to ask "would the preemptor fit?"."""

    def __init__(self, *, tree: QuotaTree, cluster: Cluster | None, states: Mapping[str, WState],
                 queues: Mapping[str, CQQueue], workload: Workload, node: QNode, usage: Mapping[FR, int],
                 pod_set_flavors: list[dict[str, str]] | None, flavors: Mapping[str, ResourceFlavor]) -> None:
        self.tree, self.cluster, self.states, self.queues = tree, cluster, states, queues
        self.workload, self.node, self.usage = workload, node, usage
        self.pod_set_flavors, self.flavors = pod_set_flavors, flavors
        self._saved: dict[str, list[Alloc]] = {}

    def remove(self, name: str) -> None:
        ws = self.states[name]
        self.tree.charge(self.queues[ws.cq].node, ws.usage, -1)
        if self.cluster is not None:
            self._saved[name] = self.cluster.release(name)

    def restore(self, name: str) -> None:
        ws = self.states[name]
        self.tree.charge(self.queues[ws.cq].node, ws.usage, +1)
        if self.cluster is not None:
            self.cluster.restore(name, self._saved.pop(name))

    def fits(self, allow_borrow: bool = True) -> bool:
        for fr, val in self.usage.items():
            if not allow_borrow and self.tree.borrowing_with(self.node, fr, val):
                return False
            if val > max(0, self.tree.available(self.node, fr)):
                return False
        if self.cluster is None or self.pod_set_flavors is None:
            return True
        return not isinstance(self.cluster.place(self.workload, self.pod_set_flavors, self.flavors, commit=False),
                              str)


@dataclass(slots=True)
class Target:
    name: str
    cluster_queue: str
    reason: str


@dataclass(slots=True)
class _Elem:
    ws: WState
    cand: Candidate
    lca: QNode | None
    variant: Variant


def _candidate(ws: WState, preemptor_cq: str) -> Candidate:
    return Candidate(ws.workload.name, ws.cq, ws.workload.priority, ws.queue_ts, ws.admitted_at,
                     ws.cq != preemptor_cq, 0, ws.evicting, ws.workload.preemptible, ws.admit_seq)


def _order(e: _Elem) -> tuple[int, int, int, float, int, str]:
    c = e.cand
    return (0 if c.evicting else 1, 0 if c.other_cq else 1, c.priority, -c.admitted_at, -c.admit_seq, c.name)


def get_targets(*, tree: QuotaTree, states: Mapping[str, WState], queues: Mapping[str, CQQueue],
                preemptor: WState, requests: Mapping[FR, int], frs_need: set[FR],
                sim_factory: Callable[[Mapping[FR, int]], LedgerSim],
                by_node: Mapping[QNode, CQQueue]) -> list[Target]:
    """Kueue ``classicalPreemptions``: the victims, or an empty list when preempting cannot make room."""
    q = queues[preemptor.cq]
    node, pol, w = q.node, q.spec.preemption, preemptor.workload
    if not frs_need or (pol.within_cluster_queue == "Never" and (
            node.parent is None or pol.reclaim_within_cohort == ReclaimWithinCohort.NEVER)):
        return []
    bwc = pol.borrow_within_cohort
    bwc_forbidden = bwc.policy == BorrowWithinCohortPolicy.NEVER

    def uses(ws: WState) -> bool:
        return (ws.status == ADMITTED and ws.workload.preemptible
                and any(fr in frs_need for fr in ws.usage))

    def classify(ws: WState, advantage: bool) -> Variant:
        if not uses(ws):
            return Variant.NEVER
        if ws.cq == preemptor.cq:
            if not within_allows(pol.within_cluster_queue, ws.workload.priority, ws.queue_ts, w.priority,
                                 preemptor.queue_ts):
                return Variant.NEVER
            return Variant.WITHIN_CQ
        if not reclaim_allows(pol.reclaim_within_cohort, ws.workload.priority, w.priority):
            return Variant.NEVER
        if advantage:
            return Variant.HIERARCHICAL_RECLAIM
        if bwc_forbidden:
            return Variant.RECLAIM_WITHOUT_BORROWING
        cp = ws.workload.priority
        above = cp >= w.priority or (bwc.max_priority_threshold is not None and cp > bwc.max_priority_threshold)
        return Variant.RECLAIM_WITHOUT_BORROWING if above else Variant.RECLAIM_WHILE_BORROWING

    def from_cq(cq: CQQueue, lca: QNode | None, advantage: bool) -> list[_Elem]:
        out = []
        for ws in cq.admitted.values():
            v = classify(ws, advantage)
            if v != Variant.NEVER:
                out.append(_Elem(ws, _candidate(ws, preemptor.cq), lca, v))
        return out

    same: list[_Elem] = [] if pol.within_cluster_queue == "Never" else from_cq(q, None, False)
    hierarchy: list[_Elem] = []
    priority: list[_Elem] = []
    if node.parent is not None and pol.reclaim_within_cohort != ReclaimWithinCohort.NEVER:
        def collect(current: QNode, subtree_root: QNode, skip: QNode | None, advantage: bool,
                    result: list[_Elem]) -> None:
            for child in current.children:
                if child.is_cq or child is skip or tree.within_nominal(child, frs_need):
                    continue
                collect(child, subtree_root, skip, advantage, result)
            for child in current.children:
                if not child.is_cq or child is node or tree.within_nominal(child, frs_need):
                    continue
                result.extend(from_cq(by_node[child], subtree_root, advantage))

        advantage, remaining = tree.fit_in_quota(node, dict(requests))
        previous: QNode | None = None
        current: QNode | None = node.parent
        while current is not None:
            collect(current, current, previous, advantage, hierarchy if advantage else priority)
            fits, remaining = tree.fit_in_quota(current, remaining)
            advantage = advantage or fits
            previous, current = current, current.parent

    def evicted_first(lists: Iterable[list[_Elem]]) -> list[_Elem]:
        ordered = [sorted(lst, key=_order) for lst in lists]
        return ([e for lst in ordered for e in lst if e.cand.evicting]
                + [e for lst in ordered for e in lst if not e.cand.evicting])

    candidates = evicted_first((hierarchy, priority, same))
    no_other = not hierarchy and not priority
    under_nominal = all(node.nominal.get(fr, 0) > node.usage.get(fr, 0) for fr in frs_need)
    if no_other or (bwc_forbidden and not under_nominal):
        attempts = [True]
    elif bwc_forbidden and not hierarchy:
        attempts = [False, True]
    else:
        attempts = [True, False]

    def valid(e: _Elem, borrow: bool) -> bool:
        if e.ws.cq == preemptor.cq:
            return True
        if borrow and e.variant == Variant.RECLAIM_WITHOUT_BORROWING:
            return False
        cq_node = queues[e.ws.cq].node
        if tree.within_nominal(cq_node, frs_need):
            return False
        p = cq_node.parent
        while p is not None and p is not e.lca:
            if tree.within_nominal(p, frs_need):
                return False
            p = p.parent
        return True

    sim = sim_factory(requests)
    for borrow in attempts:
        chosen: list[_Elem] = []
        for e in candidates:
            if not valid(e, borrow):
                continue
            sim.remove(e.ws.workload.name)
            chosen.append(e)
            if sim.fits(borrow):
                # Fill back: in reverse, put back every victim the preemptor does not need.
                kept = [chosen[-1]]
                for back in reversed(chosen[:-1]):
                    sim.restore(back.ws.workload.name)
                    if sim.fits(borrow):
                        continue
                    sim.remove(back.ws.workload.name)
                    kept.append(back)
                for k in kept:
                    sim.restore(k.ws.workload.name)
                return [Target(k.ws.workload.name, k.ws.cq, REASON[k.variant]) for k in reversed(kept)]
        for e in chosen:
            sim.restore(e.ws.workload.name)
    return []
