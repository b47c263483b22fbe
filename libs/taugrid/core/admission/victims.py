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

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import IntEnum

from . import results as R
from .fairshare import DrsKey, drs_key
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
        self.tree.charge(self.queues[ws.cq].node, ws.usage, -1, quiet=True)  # undone by ``restore``
        if self.cluster is not None:
            self._saved[name] = self.cluster.release(name, quiet=True)

    def restore(self, name: str) -> None:
        ws = self.states[name]
        self.tree.charge(self.queues[ws.cq].node, ws.usage, +1, quiet=True)
        if self.cluster is not None:
            self.cluster.restore(name, self._saved.pop(name), quiet=True)

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
        return ws.status == ADMITTED and ws.workload.preemptible and not frs_need.isdisjoint(ws.usage)

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

    if not hierarchy and not priority and not same:
        return []  # nobody to preempt (the common answer when a queue and its cohort are full)
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


# -- fair-sharing preemption (Kueue ``fairPreemptions``, ``preemption/fairsharing``) ------------------------

LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"
DEFAULT_STRATEGIES = (LESS_THAN_OR_EQUAL_TO_FINAL_SHARE, LESS_THAN_INITIAL_SHARE)


class _FairOrdering:
    """Kueue ``TargetClusterQueueOrdering``: which queue gives up a workload next (the highest DRS first,
    descending the cohort tree; queues and cohorts that do not borrow are pruned)."""

    def __init__(self, tree: QuotaTree, preemptor_node: QNode, by_node: Mapping[QNode, CQQueue],
                 candidates: list[_Elem]) -> None:
        self.tree, self.pnode, self.by_node = tree, preemptor_node, by_node
        self.ancestors: set[QNode] = set()
        p = preemptor_node.parent
        while p is not None:
            self.ancestors.add(p)
            p = p.parent
        self.targets: dict[str, list[_Elem]] = {}
        for e in candidates:
            self.targets.setdefault(e.ws.cq, []).append(e)
        self.pruned: set[QNode] = set()

    def drs(self, node: QNode) -> DrsKey:
        return drs_key(self.tree, node)

    def has(self, node: QNode) -> bool:
        return bool(self.targets.get(node.name))

    def pop(self, node: QNode) -> _Elem:
        return self.targets[node.name].pop(0)

    def __iter__(self) -> Iterator[QNode]:
        if self.pnode.parent is None:
            while self.pnode not in self.pruned and self.has(self.pnode):
                yield self.pnode
            return
        root = self.tree.root(self.pnode)
        while root not in self.pruned:
            target = self._next(root)
            if target is not None:
                yield target

    def _borrowing(self, node: QNode) -> bool:
        return any(v > node.subtree.get(fr, 0) for fr, v in node.usage.items())

    def _next(self, cohort: QNode) -> QNode | None:
        best_cq: QNode | None = None
        best_cq_drs: DrsKey = (False, -1.0)
        best_cohort: QNode | None = None
        best_cohort_drs: DrsKey = (False, -1.0)
        for child in cohort.children:
            if child in self.pruned:
                continue
            d = self.drs(child)
            if child.is_cq:
                if (not self._borrowing(child) and child is not self.pnode) or not self.has(child):
                    self.pruned.add(child)
                elif best_cq is not None and d == best_cq_drs:
                    if _order(self.targets[child.name][0]) < _order(self.targets[best_cq.name][0]):
                        best_cq = child
                elif d > best_cq_drs:
                    best_cq, best_cq_drs = child, d
            elif not self._borrowing(child) and child not in self.ancestors:
                self.pruned.add(child)
            elif d >= best_cohort_drs:
                best_cohort, best_cohort_drs = child, d
        if best_cq is None and best_cohort is None:
            self.pruned.add(cohort)
            return None
        if best_cohort is not None and best_cohort_drs >= best_cq_drs:
            return self._next(best_cohort)
        return best_cq

    def _almost_lca(self, node: QNode, lca: QNode) -> QNode:
        a = node
        p = node.parent
        while p is not None and p is not lca:
            a = p
            p = p.parent
        return a

    def shares(self, target: QNode) -> tuple[DrsKey, DrsKey, QNode]:
        """(preemptor's new share, target's old share, the target's almost-LCA) at their least common ancestor."""
        lca = target.parent
        while lca is not None and lca not in self.ancestors:
            lca = lca.parent
        assert lca is not None
        t_alca = self._almost_lca(target, lca)
        return self.drs(self._almost_lca(self.pnode, lca)), self.drs(t_alca), t_alca


def fair_targets(*, tree: QuotaTree, states: Mapping[str, WState], queues: Mapping[str, CQQueue],
                 preemptor: WState, requests: Mapping[FR, int], frs_need: set[FR],
                 sim_factory: Callable[[Mapping[FR, int]], LedgerSim], by_node: Mapping[QNode, CQQueue],
                 strategies: tuple[str, ...] = DEFAULT_STRATEGIES) -> list[Target]:
    """Kueue ``fairPreemptions``: victims chosen so that the preemptor's dominant resource share after admission
    does not end above the share the victim's queue keeps (``LessThanOrEqualToFinalShare``) or had
    (``LessThanInitialShare``), queue by queue from the highest share down."""
    q = queues[preemptor.cq]
    node, pol, w = q.node, q.spec.preemption, preemptor.workload

    def uses(ws: WState) -> bool:
        return ws.status == ADMITTED and ws.workload.preemptible and any(fr in frs_need for fr in ws.usage)

    candidates: list[_Elem] = []
    if pol.within_cluster_queue != "Never":
        candidates += [_Elem(ws, _candidate(ws, preemptor.cq), None, Variant.WITHIN_CQ)
                       for ws in q.admitted.values()
                       if uses(ws) and within_allows(pol.within_cluster_queue, ws.workload.priority, ws.queue_ts,
                                                     w.priority, preemptor.queue_ts)]
    if node.parent is not None and pol.reclaim_within_cohort != ReclaimWithinCohort.NEVER:
        stack = [tree.root(node)]
        while stack:
            n = stack.pop()
            stack.extend(c for c in n.children if not c.is_cq)
            for c in n.children:
                if not c.is_cq or c is node or not any(c.borrowed(fr) > 0 for fr in frs_need):
                    continue
                candidates += [_Elem(ws, _candidate(ws, preemptor.cq), None, Variant.RECLAIM_WITHOUT_BORROWING)
                               for ws in by_node[c].admitted.values()
                               if uses(ws) and reclaim_allows(pol.reclaim_within_cohort, ws.workload.priority,
                                                              w.priority)]
    if not candidates:
        return []
    candidates.sort(key=_order)
    sim = sim_factory(requests)
    chosen: list[Target] = []

    def take(e: _Elem, reason: str) -> bool:
        sim.remove(e.ws.workload.name)
        chosen.append(Target(e.ws.workload.name, e.ws.cq, reason))
        tree.charge(node, dict(requests), -1)  # the fit check sees the preemptor's usage removed again
        try:
            return sim.fits()
        finally:
            tree.charge(node, dict(requests), +1)

    tree.charge(node, dict(requests), +1)  # shares are computed with the preemptor admitted
    within_nominal = not any(tree.borrowing_with(node, fr, 0) for fr in frs_need)
    fits = False
    retry: list[_Elem] = []
    try:
        first = _less_than_or_equal if strategies[0] == LESS_THAN_OR_EQUAL_TO_FINAL_SHARE else _less_than
        order = _FairOrdering(tree, node, by_node, candidates)
        for target in order:
            if target is node:
                if take(order.pop(target), R.IN_CLUSTER_QUEUE):
                    fits = True
                    break
                continue
            if within_nominal:
                if take(order.pop(target), R.IN_COHORT_RECLAMATION):
                    fits = True
                    break
                continue
            new_share, old_share, alca = order.shares(target)
            if new_share[0] and not old_share[0]:  # weight 0 and borrowing: no candidate can pass
                while order.has(target):
                    retry.append(order.pop(target))
                continue
            while order.has(target):
                e = order.pop(target)
                tree.charge(target, e.ws.usage, -1)
                target_new = order.drs(alca)
                tree.charge(target, e.ws.usage, +1)
                if first(new_share, old_share, target_new):
                    if take(e, R.IN_COHORT_FAIR_SHARING):
                        fits = True
                    break
                retry.append(e)
            if fits:
                break
        if not fits and len(strategies) > 1 and retry:
            retry.sort(key=_order)
            order = _FairOrdering(tree, node, by_node, retry)
            for target in order:
                new_share, old_share, _ = order.shares(target) if target is not node else ((False, 0.0),
                                                                                           (False, 0.0), node)
                e = order.pop(target)
                if new_share < old_share and take(e, R.IN_COHORT_FAIR_SHARING):
                    fits = True
                    break
                order.pruned.add(target)
    finally:
        tree.charge(node, dict(requests), -1)
    if not fits:
        for t in chosen:
            sim.restore(t.name)
        return []
    kept = [chosen[-1]]  # fill back, borrowing allowed
    for back in reversed(chosen[:-1]):
        sim.restore(back.name)
        if sim.fits():
            continue
        sim.remove(back.name)
        kept.append(back)
    for t in kept:
        sim.restore(t.name)
    return list(reversed(kept))


def _less_than_or_equal(preemptor_new: DrsKey, target_old: DrsKey, target_new: DrsKey) -> bool:
    return preemptor_new <= target_new


def _less_than(preemptor_new: DrsKey, target_old: DrsKey, target_new: DrsKey) -> bool:
    return preemptor_new < target_old
