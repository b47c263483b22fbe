"""Preemption planning against the live ledger: candidate lists per Kueue's heuristics, and the simulator.

Role: build the candidate sets a ClusterQueue's preemption policy allows and run ``select_victims`` over them,
trying Kueue's heuristics in order and keeping the first that works:
1. with ``borrowWithinCohort`` and a preemptor that must borrow: own-queue candidates + lower-priority
   workloads (<= ``max_priority_threshold``) of borrowing queues in the cohort tree, borrowing allowed;
2. with ``reclaimWithinCohort`` and a preemptor that need not borrow: own-queue candidates + workloads of
   borrowing queues in the tree allowed by the policy, borrowing *not* allowed (reclaim up to nominal);
3. own-queue candidates only, borrowing allowed.

Invariants: a non-preemptible workload is never a candidate; every candidate uses at least one contested
(flavor, resource); the ledger and node view are unchanged when planning returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from . import results as R
from .model import BorrowWithinCohortPolicy, ReclaimWithinCohort, ResourceFlavor
from .nominate import Assignment
from .placement import Alloc, Cluster
from .preemption import Candidate, reclaim_allows, select_victims, within_allows
from .queues import ADMITTED, CQQueue, WState
from .quota import FR, QuotaTree


class LedgerSim:
    """Remove/restore admitted workloads on the live ledger (and nodes) to ask "would the preemptor fit?"."""

    def __init__(self, *, tree: QuotaTree, cluster: Cluster | None, states: Mapping[str, WState],
                 queues: Mapping[str, CQQueue], preemptor: WState, assignment: Assignment,
                 flavors: Mapping[str, ResourceFlavor], allow_borrow: bool) -> None:
        self.tree, self.cluster, self.states, self.queues = tree, cluster, states, queues
        self.preemptor, self.assignment, self.flavors = preemptor, assignment, flavors
        self.allow_borrow = allow_borrow
        self._saved: dict[str, list[Alloc]] = {}
        self.node = queues[preemptor.cq].node

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

    def fits(self) -> bool:
        if not self.tree.fits(self.node, self.assignment.usage, allow_borrow=self.allow_borrow):
            return False
        if self.cluster is None:
            return True
        flv = [ps.flavors for ps in self.assignment.pod_sets]
        return not isinstance(self.cluster.place(self.preemptor.workload, flv, self.flavors, commit=False), str)


@dataclass(slots=True)
class Plan:
    victims: list[Candidate]
    reasons: dict[str, str]  # victim -> Preempted reason
    sim: LedgerSim


def _candidate(ws: WState, *, other: bool, borrowed: int) -> Candidate:
    return Candidate(ws.workload.name, ws.cq, ws.workload.priority, ws.queue_ts, ws.admitted_at, other,
                     borrowed, ws.evicting, ws.workload.preemptible, ws.admit_seq)


def plan_preemption(*, tree: QuotaTree, cluster: Cluster | None, states: Mapping[str, WState],
                    queues: Mapping[str, CQQueue], tree_queues: Iterable[CQQueue], preemptor: WState,
                    assignment: Assignment, flavors: Mapping[str, ResourceFlavor],
                    audit: Callable[[WState, list[Candidate], LedgerSim], None] | None = None) -> Plan | None:
    q = queues[preemptor.cq]
    pol = q.spec.preemption
    w = preemptor.workload
    frs = set(assignment.usage)

    def uses(ws: WState, contested: set[FR]) -> bool:
        return ws.status == ADMITTED and ws.workload.preemptible and any(fr in contested for fr in ws.usage)

    same = [_candidate(u, other=False, borrowed=0) for u in q.admitted.values()
            if uses(u, frs) and within_allows(pol.within_cluster_queue, u.workload.priority, u.queue_ts,
                                              w.priority, preemptor.queue_ts)]

    def cohort(allowed: Callable[[WState], bool]) -> list[Candidate]:
        out: list[Candidate] = []
        for other in tree_queues:
            if other is q:
                continue
            borrowing = {fr for fr in frs if other.node.borrowed(fr) > 0}
            if not borrowing:
                continue
            amount = sum(other.node.borrowed(fr) for fr in borrowing)
            out.extend(_candidate(u, other=True, borrowed=amount) for u in other.admitted.values()
                       if uses(u, borrowing) and allowed(u))
        return out

    attempts: list[tuple[list[Candidate], bool, str]] = []
    bwc = pol.borrow_within_cohort
    if assignment.borrows and bwc.policy == BorrowWithinCohortPolicy.LOWER_PRIORITY:
        limit = bwc.max_priority_threshold
        extra = cohort(lambda u: u.workload.priority < w.priority
                       and (limit is None or u.workload.priority <= limit))
        attempts.append((same + extra, True, R.IN_COHORT_RECLAIM_WHILE_BORROWING))
    if not assignment.borrows and pol.reclaim_within_cohort != ReclaimWithinCohort.NEVER:
        extra = cohort(lambda u: reclaim_allows(pol.reclaim_within_cohort, u.workload.priority, w.priority))
        attempts.append((same + extra, False, R.IN_COHORT_RECLAMATION))
    attempts.append((same, True, R.IN_CLUSTER_QUEUE))
    for cands, allow_borrow, cohort_reason in attempts:
        if not cands:
            continue
        sim = LedgerSim(tree=tree, cluster=cluster, states=states, queues=queues, preemptor=preemptor,
                        assignment=assignment, flavors=flavors, allow_borrow=allow_borrow)
        victims = select_victims(cands, sim)
        if victims is None:
            continue
        if audit is not None:
            audit(preemptor, victims, sim)
        reasons = {v.name: (cohort_reason if v.other_cq else R.IN_CLUSTER_QUEUE) for v in victims}
        return Plan(victims, reasons, sim)
    return None
