"""Policy predicates (``within_allows``, ``reclaim_allows``) and a minimal-victim-set search over a candidate list.

Role: given the candidates a policy allows, pick the smallest set whose removal lets the preemptor fit. Kueue's
own preemption (hierarchical candidates, attempts with and without borrowing, fair sharing) lives in
``victims.py``; this simpler search serves KAI's reclaim (``kai.py``) and the invariant checks.

Order (Kueue ``candidatesOrdering``, plus our tie-break for reclamation): workloads already being evicted
first, then workloads of *other* ClusterQueues, then lower priority, then (cohort reclamation) those of the
queue borrowing the most, then the most recently admitted.
Algorithm: add candidates in that order until the preemptor fits, then walk the chosen list backwards and
put back every victim whose return still leaves a fit.

Invariants: only candidates passed in can be victims (callers filter by policy and ``preemptible``);
the result is minimal: removing the preemptor's need for any one victim makes it not fit (fit is monotone in
the set of removed workloads, so a victim needed when checked stays needed after later put-backs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .model import ReclaimWithinCohort, WithinClusterQueue


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    cluster_queue: str
    priority: int
    queue_ts: float
    admitted_at: float
    other_cq: bool  # belongs to another ClusterQueue of the cohort tree
    cq_borrowed: int = 0  # how much its ClusterQueue borrows on the contested resources (m-units)
    evicting: bool = False
    preemptible: bool = True
    admit_seq: int = 0  # breaks ties between admissions at the same instant: later admission = more recent


def order_key(c: Candidate) -> tuple[int, int, int, int, float, int, str]:
    return (0 if c.evicting else 1, 0 if c.other_cq else 1, c.priority, -c.cq_borrowed, -c.admitted_at,
            -c.admit_seq, c.name)


def within_allows(policy: WithinClusterQueue, cand_priority: int, cand_ts: float, priority: int,
                  ts: float) -> bool:
    if policy == WithinClusterQueue.LOWER_PRIORITY:
        return cand_priority < priority
    if policy == WithinClusterQueue.LOWER_OR_NEWER_EQUAL_PRIORITY:
        return cand_priority < priority or (cand_priority == priority and cand_ts > ts)
    return False


def reclaim_allows(policy: ReclaimWithinCohort, cand_priority: int, priority: int) -> bool:
    if policy == ReclaimWithinCohort.ANY:
        return True
    if policy == ReclaimWithinCohort.LOWER_PRIORITY:
        return cand_priority < priority
    return False


class Simulator(Protocol):
    """Removes/restores a candidate's usage on the live ledger and asks whether the preemptor fits now."""

    def remove(self, name: str) -> None: ...

    def restore(self, name: str) -> None: ...

    def fits(self) -> bool: ...


def select_victims(candidates: list[Candidate], sim: Simulator) -> list[Candidate] | None:
    """Minimal victim set in Kueue order, or ``None`` when even all candidates are not enough.

    The simulator is left exactly as it was found.
    """
    ordered = sorted(candidates, key=order_key)
    removed: list[Candidate] = []
    for cand in ordered:
        sim.remove(cand.name)
        removed.append(cand)
        if sim.fits():
            break
    else:
        for cand in removed:
            sim.restore(cand.name)
        return None
    kept = [removed[-1]]
    for cand in reversed(removed[:-1]):
        sim.restore(cand.name)
        if sim.fits():
            continue
        sim.remove(cand.name)
        kept.append(cand)
    for cand in kept:
        sim.restore(cand.name)
    return sorted(kept, key=order_key)
