"""KAI's queue model on the engine: department → project queues with deserved quota, limit and over-quota
weight; fair shares (``proportion``) and reclaim of over-quota use by preemption.

Role: the engine consults a ``KaiPolicy`` for the ClusterQueues that are KAI projects (and only those):
* ``refresh`` (each cycle) computes every department's fair share of ``capacity`` and every project's fair share
  of its department's, from what each uses and what its pending workloads ask for (KAI's proportion plugin);
* ``nominated`` keeps non-preemptible workloads inside their project's deserved quota (KAI's
  ``NonPreemptibleOverQuota``) and turns "insufficient unused quota" into a reclaim attempt;
* ``plan`` picks victims as KAI's reclaim action would: the reclaimer's project must stay within its fair share
  with the workload (``CanReclaimResources``); a victim's queue — compared at the level where the two
  hierarchies part (sibling projects, or sibling departments) — must be above what it may keep
  (``MaintainFairShare``: above max(deserved, fair share) capped by its limit) or, while the reclaimer stays within
  its deserved quota, above its deserved quota (``GuaranteeDeservedQuota``); queues most over their share lose
  their lowest-priority, newest workloads first; after the reclaim, the reclaimer's saturation (allocated / fair
  share) must stay below each affected sibling's. Failing a reclaim, lower-priority workloads of the project
  itself are preempted (KAI's preempt action).

Invariants: only resources some KAI queue writes are governed (the others are not compared, like KAI's
unlimited quota); a department deserves at least the sum of its projects' deserved quota; non-preemptible and
already-evicting workloads are never victims; the ledger is left as found when ``plan`` returns None.
Not modelled: time-based fair share (usage history), ``reclaimerUtilizationMultiplier`` other than 1, min-runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import results as R
from .model import GPU, UNIT, to_units
from .nominate import Assignment, Mode, PodSetAssignment
from .preemption import Candidate, select_victims
from .proportion import Share, divide
from .queues import PENDING, CQQueue, WState
from .quota import QNode
from .victims import LedgerSim, Target

if TYPE_CHECKING:
    from .engine import Engine

RESOURCES = ("cpu", "memory", GPU)
_STEP = {GPU: UNIT, "cpu": 1, "memory": UNIT}  # fair shares move in whole GPUs, millicores, bytes
Units = dict[str, int]


@dataclass(frozen=True, slots=True)
class KaiQueue:
    """A department (``parent`` None) or a project (``parent`` = its department; its name is a ClusterQueue)."""

    name: str
    parent: str | None = None
    deserved: Mapping[str, float] = field(default_factory=dict)  # user units; absent = 0 for a governed resource
    limit: Mapping[str, float] = field(default_factory=dict)  # absent = no limit
    over_quota_weight: float = 1.0
    priority: int = 100


@dataclass(frozen=True, slots=True)
class KaiSpec:
    queues: tuple[KaiQueue, ...]
    capacity: Mapping[str, float] = field(default_factory=dict)  # what departments divide, per resource


class KaiPolicy:
    def __init__(self, spec: KaiSpec) -> None:
        self.departments = {q.name: q for q in spec.queues if q.parent is None}
        self.projects = {q.name: q for q in spec.queues if q.parent is not None}
        self.children: dict[str, list[str]] = {d: [] for d in self.departments}
        for p in self.projects.values():
            self.children.setdefault(p.parent or "", []).append(p.name)
        self.governed = tuple(r for r in RESOURCES if any(r in q.deserved or r in q.limit for q in spec.queues))
        self.deserved: dict[str, Units] = {q: self._units(spec_q.deserved) for q, spec_q in self.projects.items()}
        for d, dq in self.departments.items():
            own = self._units(dq.deserved)
            self.deserved[d] = {r: max(own[r], sum(self.deserved[p][r] for p in self.children[d]))
                                for r in self.governed}
        self.limit: dict[str, dict[str, int | None]] = {
            q.name: {r: (to_units(q.limit[r]) if r in q.limit else None) for r in self.governed}
            for q in spec.queues}
        self.capacity = {r: to_units(spec.capacity[r]) if r in spec.capacity
                         else sum(self.deserved[d][r] for d in self.departments) for r in self.governed}
        self.fair: dict[str, Units] = {}

    def _units(self, amounts: Mapping[str, float]) -> Units:
        return {r: to_units(amounts.get(r, 0)) for r in self.governed}

    def owns(self, cluster_queue: str) -> bool:
        return cluster_queue in self.projects

    # -- fair shares -------------------------------------------------------------------------------------

    def allocated(self, engine: Engine, queue: str) -> Units:
        if queue in self.departments:
            parts = [self.allocated(engine, p) for p in self.children[queue]]
            return {r: sum(x[r] for x in parts) for r in self.governed}
        out = dict.fromkeys(self.governed, 0)
        for (_flavor, r), v in engine.queues[queue].node.usage.items():
            if r in out:
                out[r] += v
        return out

    def refresh(self, engine: Engine) -> set[QNode]:
        """Recompute fair shares; returns the cohort roots to re-examine when any share changed."""
        requested: dict[str, Units] = {p: self.allocated(engine, p) for p in self.projects}
        for ws in engine.states.values():
            if ws.status == PENDING and ws.cq in self.projects:
                for r, v in need_of(ws).items():
                    if r in requested[ws.cq]:
                        requested[ws.cq][r] += v
        for d in self.departments:
            requested[d] = {r: sum(requested[p][r] for p in self.children[d]) for r in self.governed}
        fair: dict[str, Units] = {q: {} for q in requested}
        for r in self.governed:
            top = divide(self.capacity[r], (self._share(d, r, requested) for d in self.departments), step=_STEP[r])
            for d, amount in top.items():
                fair[d][r] = amount
                below = divide(amount, (self._share(p, r, requested) for p in self.children[d]), step=_STEP[r])
                for p, share in below.items():
                    fair[p][r] = share
        changed = fair != self.fair
        self.fair = fair
        if not changed or not self.projects:
            return set()
        return {engine.tree.root(engine.queues[p].node) for p in self.projects if p in engine.queues}

    def _share(self, queue: str, r: str, requested: Mapping[str, Units]) -> Share:
        spec = self.projects.get(queue) or self.departments[queue]
        return Share(queue, self.deserved[queue][r], requested[queue][r], spec.over_quota_weight, spec.priority,
                     self.limit[queue][r])

    def allocatable(self, queue: str) -> Units:
        """What a queue may keep before others reclaim from it: max(deserved, fair share), capped by its limit."""
        out: Units = {}
        for r in self.governed:
            keep = max(self.deserved[queue][r], self.fair.get(queue, {}).get(r, 0))
            lim = self.limit[queue][r]
            out[r] = keep if lim is None else min(lim, keep)
        return out

    # -- hooks -------------------------------------------------------------------------------------------

    def nominated(self, engine: Engine, ws: WState, q: CQQueue, a: Assignment) -> Assignment:
        if not self.owns(q.spec.name):
            return a
        need = need_of(ws)
        if not ws.workload.preemptible:
            held = dict.fromkeys(self.governed, 0)
            for u in q.admitted.values():
                if not u.workload.preemptible:
                    for r, v in need_of(u).items():
                        if r in held:
                            held[r] += v
            over = [r for r in self.governed if need.get(r, 0) and held[r] + need[r] > self.deserved[q.spec.name][r]]
            if over:
                return Assignment(Mode.NO_FIT, reason=R.WAITING_FOR_QUOTA, message=(
                    f"NonPreemptibleOverQuota: non-preemptible workloads of project {q.spec.name} may use only its "
                    f"deserved quota of {over[0]} ({self.deserved[q.spec.name][over[0]] / UNIT:g})"))
        if a.mode != Mode.NO_FIT or a.reason != R.WAITING_FOR_QUOTA:
            return a
        # Kueue would not preempt above nominal quota; KAI reclaims up to the fair share (in the one flavor a
        # project has), so the head goes on to ``targets``.
        flavor = q.spec.resource_groups[0].flavors[0].name if q.spec.resource_groups else ""
        pod_sets = [PodSetAssignment(ps.name, ps.count, {r: flavor for r, v in req.items() if v},
                                     {(flavor, r): v for r, v in req.items() if v},
                                     {r: Mode.PREEMPT for r, v in req.items() if v})
                    for ps, req in zip(ws.workload.pod_sets, ws.requests, strict=True)]
        usage: dict[tuple[str, str], int] = {}
        for psa in pod_sets:
            for fr, v in psa.usage.items():
                usage[fr] = usage.get(fr, 0) + v
        borrowing = max((engine.tree.borrow_height(q.node, fr, v)[0] for fr, v in usage.items()), default=0)
        return Assignment(Mode.PREEMPT, borrows=borrowing > 0, borrowing=borrowing, pod_sets=pod_sets, usage=usage,
                          reason=a.reason, message=a.message, shortfalls=a.shortfalls)

    def targets(self, engine: Engine, ws: WState, sim: LedgerSim, taken: set[str],
                a: Assignment | None = None) -> list[Target]:
        """Victims for a KAI project's head (reclaim first, then in-project preemption); [] when none work, and
        then ``a``'s message says why in KAI's terms. ``taken``: victims already chosen this cycle."""
        q = engine.queues[ws.cq]
        found = self._reclaim(engine, ws, sim, taken) or self._preempt_within(ws, q, sim, taken)
        if not found and a is not None:
            a.message = f"{a.message}; {self.why_not(engine, ws)}" if a.message else self.why_not(engine, ws)
        return found

    def why_not(self, engine: Engine, ws: WState) -> str:
        """Why a project's head cannot reclaim: it would pass its fair share, or nobody is above theirs."""
        need, alloc, fair = need_of(ws), self.allocated(engine, ws.cq), self.fair.get(ws.cq, {})
        for r in self.governed:
            lim = self.limit[ws.cq][r]
            if need.get(r, 0) and lim is not None and alloc[r] + need[r] > lim:
                return (f"project {ws.cq} uses {alloc[r] / UNIT:g} {r} of its limit of {lim / UNIT:g} and this "
                        f"workload asks for {need[r] / UNIT:g} more")
        for r in self.governed:
            if need.get(r, 0) and alloc[r] + need[r] > fair.get(r, 0):
                return (f"project {ws.cq} uses {alloc[r] / UNIT:g} {r} of its fair share of {fair.get(r, 0) / UNIT:g}"
                        f" and this workload asks for {need[r] / UNIT:g} more, so it waits for idle resources")
        return (f"project {ws.cq} is within its fair share, but no workload of another project is above what "
                "that project may keep, so there is nothing to reclaim")

    def _reclaim(self, engine: Engine, ws: WState, sim: LedgerSim, taken: set[str]) -> list[Target]:
        project, need = ws.cq, need_of(ws)
        alloc = {name: self.allocated(engine, name) for name in (*self.projects, *self.departments)}
        fair = self.fair.get(project, {})
        if any(alloc[project][r] + need.get(r, 0) > fair.get(r, 0) for r in self.governed if need.get(r, 0)):
            return []  # CanReclaimResources: the reclaimer would end above its fair share
        involved = [r for r in self.governed if need.get(r, 0)]
        candidates: list[tuple[tuple[float, int, float, int, str], WState, str, str]] = []
        for other in self.projects:
            if other == project or other not in engine.queues:
                continue
            mine, theirs = self._levelled(project, other)
            ratio = max((_ratio(alloc[theirs][r], self.fair.get(theirs, {}).get(r, 0)) for r in involved), default=0)
            for u in engine.queues[other].admitted.values():
                if (u.workload.preemptible and not u.evicting and u.workload.name not in taken
                        and any(need_of(u).get(r, 0) for r in involved)):
                    key = (-ratio, u.workload.priority, -u.admitted_at, -u.admit_seq, u.workload.name)
                    candidates.append((key, u, mine, theirs))
        remaining: dict[str, Units] = {}
        chosen: list[WState] = []
        for _, u, mine, theirs in sorted(candidates, key=lambda c: c[0]):
            rest = remaining.setdefault(theirs, dict(alloc[theirs]))
            if not self._strategy_allows(mine, theirs, rest, alloc[mine], need):
                continue
            sim.remove(u.workload.name)
            chosen.append(u)
            for level in (u.cq, self.projects[u.cq].parent or ""):
                left = remaining.setdefault(level, dict(alloc[level]))
                for r, v in need_of(u).items():
                    if r in left:
                        left[r] -= v
            if sim.fits():
                ok = self._saturation_ok(project, need, alloc, remaining, involved)
                for c in chosen:
                    sim.restore(c.workload.name)
                if not ok:
                    return []
                return [Target(c.workload.name, c.cq, R.IN_COHORT_RECLAMATION) for c in chosen]
        for c in chosen:
            sim.restore(c.workload.name)
        return []

    def _preempt_within(self, ws: WState, q: CQQueue, sim: LedgerSim, taken: set[str]) -> list[Target]:
        cands = [Candidate(u.workload.name, u.cq, u.workload.priority, u.queue_ts, u.admitted_at, False, 0,
                           u.evicting, True, u.admit_seq)
                 for u in q.admitted.values() if u.workload.preemptible
                 and u.workload.priority < ws.workload.priority and u.workload.name not in taken]
        victims = select_victims(cands, sim) if cands else None
        return [Target(v.name, v.cluster_queue, R.IN_CLUSTER_QUEUE) for v in victims or []]

    def _levelled(self, reclaimer: str, reclaimee: str) -> tuple[str, str]:
        """The two queues at the level where the hierarchies part: sibling projects or sibling departments."""
        mine, theirs = self.projects[reclaimer].parent or "", self.projects[reclaimee].parent or ""
        return (reclaimer, reclaimee) if mine == theirs else (mine, theirs)

    def _strategy_allows(self, mine: str, theirs: str, rest: Units, mine_alloc: Units, need: Units) -> bool:
        keep = self.allocatable(theirs)
        if any(rest[r] > keep[r] for r in self.governed):  # MaintainFairShare
            return True
        within = all(mine_alloc[r] + need.get(r, 0) <= self.deserved[mine][r] for r in self.governed)
        return within and any(rest[r] > self.deserved[theirs][r] for r in self.governed)  # GuaranteeDeservedQuota

    def _saturation_ok(self, project: str, need: Units, alloc: Mapping[str, Units],
                       remaining: Mapping[str, Units], involved: list[str]) -> bool:
        chain = [project, self.projects[project].parent or ""]
        for level in chain:
            parent = self.projects[level].parent if level in self.projects else None
            after = {r: remaining.get(level, alloc[level])[r] + need.get(r, 0) for r in self.governed}
            for sibling, left in remaining.items():
                sib_parent = self.projects[sibling].parent if sibling in self.projects else None
                if sibling == level or sib_parent != parent:
                    continue
                for r in involved:
                    mine = _ratio(after[r], self.fair.get(level, {}).get(r, 0))
                    sib_fair = self.fair.get(sibling, {}).get(r, 0)
                    if mine > 1 and sib_fair > 0 and mine >= _ratio(left[r], sib_fair):
                        return False
        return True


def need_of(ws: WState) -> Units:
    """What a workload asks for in total, per resource (m-units), over all its pod sets."""
    out: Units = {}
    for req in ws.requests:
        for r, v in req.items():
            out[r] = out.get(r, 0) + v
    return out


def _ratio(allocated: int, fair: int) -> float:
    if fair == 0:
        return math.inf if allocated > 0 else 0.0
    return allocated / fair
