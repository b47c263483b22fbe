"""The admission engine: Kueue's scheduling cycle with KAI's fractions, gangs and placement, as pure code.

Role: accept workloads into per-ClusterQueue heaps, and on each ``cycle(now)`` take one head per ClusterQueue,
nominate flavors, order the heads (classic: waiting preemptors, non-borrowing, priority, age; or the fair
sharing tournament), then admit, preempt or leave each pending with Kueue's reason and message.
No I/O, no clock: time is the ``now`` argument.

Invariants:
- a cycle costs O(ClusterQueues + decisions), never O(pending): heads come from heaps; parked workloads are
  re-heaped (C ``heapify``) only after a capacity event in their cohort tree;
- usage only grows through a fit check against the quota tree, so limits hold (see ``quota``);
- a gang is charged and placed whole or not at all;
- victims keep their quota until the end of the cycle that chose them (like Kueue, where they hold it until
  their pods are gone); the preemptor is admitted in a later cycle, ahead of other heads.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from taugrid.core.errors import NotFound, PermanentError

from . import results as R
from .fairshare import tournament
from .model import (
    GPU,
    ClusterQueue,
    Cohort,
    LocalQueue,
    Node,
    ResourceFlavor,
    Workload,
    fraction_units,
    from_units,
    to_units,
)
from .nominate import Assignment, Mode, nominate
from .placement import Cluster
from .preemption import Candidate
from .queues import ADMITTED, PENDING, CQQueue, WState
from .quota import FR, QNode, QuotaTree
from .victims import LedgerSim, plan_preemption

_Entry = tuple[WState, CQQueue, Assignment]


class Engine:
    def __init__(self, cluster_queues: Iterable[ClusterQueue], cohorts: Iterable[Cohort] = (),
                 flavors: Iterable[ResourceFlavor] = (), nodes: Iterable[Node] | None = None, *,
                 local_queues: Iterable[LocalQueue] = (), fair_sharing: bool = False,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 3600.0, backoff_preempted: bool = False,
                 gpu_memory_mb: int = 81920, audit: bool = False) -> None:
        cqs = list(cluster_queues)
        self.flavors = {f.name: f for f in flavors}
        self.tree = QuotaTree(cqs, cohorts)
        self.queues = {cq.name: CQQueue(cq, self.tree.cqs[cq.name]) for cq in cqs}
        self.local_queues = {lq.name: lq.cluster_queue for lq in local_queues}
        self.cluster = Cluster(nodes) if nodes is not None else None
        # Quota charge for gpu_memory pods: a share of the largest device (KAI charges the actual device later).
        self._charge_mem = (self.cluster.max_gpu_memory_mb if self.cluster else 0) or gpu_memory_mb
        self.fair_sharing = fair_sharing
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.backoff_preempted = backoff_preempted
        self.audit = audit
        self.states: dict[str, WState] = {}
        self._backoff: list[tuple[float, str, int]] = []
        self._tree_queues: dict[QNode, list[CQQueue]] = {}
        for q in self.queues.values():
            self._tree_queues.setdefault(self.tree.root(q.node), []).append(q)
        self._dirty: set[QNode] = set()
        self._violations: list[str] = []
        self._admit_seq = 0
        self._reserved: list[tuple[QNode, dict[FR, int]]] = []

    # -- inputs ------------------------------------------------------------------------------------------

    def resolve_queue(self, queue: str) -> str:
        cq = self.local_queues.get(queue, queue)
        if cq not in self.queues:
            raise PermanentError(f"queue {queue!r} names no LocalQueue or ClusterQueue; use one of "
                                 f"{sorted(set(self.local_queues) | set(self.queues))}")
        return cq

    def submit(self, workload: Workload, now: float) -> None:
        workload.validate()
        if workload.name in self.states:
            raise PermanentError(f"workload {workload.name} already submitted; names must be unique")
        cq = self.resolve_queue(workload.queue)
        requests = []
        for ps in workload.pod_sets:
            req = {r: to_units(v) * ps.count for r, v in ps.requests.items() if v}
            if ps.shares_gpu:
                req[GPU] = fraction_units(ps, self._charge_mem) * ps.count
            requests.append(req)
        ws = WState(workload, cq, requests, queue_ts=workload.created_at)
        self.states[workload.name] = ws
        q = self.queues[cq]
        q.push(ws)
        q.blocked = False  # a new arrival may outrank a blocked StrictFIFO head

    def _get(self, name: str) -> WState:
        ws = self.states.get(name)
        if ws is None:
            raise NotFound(f"workload {name} is not known to the admission engine")
        return ws

    def _release(self, ws: WState) -> None:
        q = self.queues[ws.cq]
        self.tree.charge(q.node, ws.usage, -1)
        if self.cluster is not None:
            self.cluster.release(ws.workload.name)
        q.admitted.pop(ws.workload.name, None)
        ws.usage, ws.admission, ws.placements = {}, None, ()
        self._dirty.add(self.tree.root(q.node))
        if self.cluster is not None:
            self._dirty.update(self._tree_queues)  # nodes are shared by every cohort tree

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        """Cordon (``False``) or uncordon a node; an uncordon is a capacity event for every parked head."""
        if self.cluster is None:
            return
        if schedulable:
            self.cluster.unschedulable.discard(node)
            self._dirty.update(self._tree_queues)
        else:
            self.cluster.unschedulable.add(node)

    def finish(self, name: str, now: float) -> None:
        """The workload completed (or was deleted): free its quota and forget it."""
        ws = self._get(name)
        if ws.status == ADMITTED:
            self._release(ws)
        ws.status = "finished"
        ws.version += 1
        del self.states[name]

    def evict(self, name: str, now: float, reason: str = "Evicted") -> None:
        """Evict an admitted workload (e.g. PodsReadyTimeout); it requeues with exponential backoff."""
        ws = self._get(name)
        if ws.status != ADMITTED:
            return
        self._requeue_evicted(ws, now, reason, backoff=True)

    def _requeue_evicted(self, ws: WState, now: float, reason: str, *, backoff: bool) -> None:
        self._release(ws)
        ws.status, ws.evicting, ws.preempting = PENDING, False, False
        ws.version += 1
        ws.queue_ts = now  # Kueue's default requeuing timestamp is the eviction time
        ws.seq = 0  # it re-enters FIFO order behind workloads already waiting at the same timestamp
        ws.requeue_count += 1
        q = self.queues[ws.cq]
        if backoff:
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (ws.requeue_count - 1))
            ws.requeue_at = now + delay
            heapq.heappush(self._backoff, (ws.requeue_at, ws.workload.name, ws.version))
            ws.pending = R.Pending(workload=ws.workload.name, cluster_queue=ws.cq, reason=R.BACKOFF,
                                   message=f"Requeued after eviction ({reason}); retry at t={ws.requeue_at:g}",
                                   position=0, ahead=0, requeue_at=ws.requeue_at)
        else:
            ws.pending = R.Pending(workload=ws.workload.name, cluster_queue=ws.cq, reason=R.PENDING,
                                   message=f"Requeued after eviction ({reason})", position=0, ahead=0)
            q.push(ws)

    # -- the cycle ---------------------------------------------------------------------------------------

    def cycle(self, now: float) -> R.CycleResult:
        while self._backoff and self._backoff[0][0] <= now:
            _, name, version = heapq.heappop(self._backoff)
            ws = self.states.get(name)
            if ws is not None and ws.version == version:
                ws.requeue_at = None
                ws.version += 1
                self.queues[ws.cq].push(ws)
                self.queues[ws.cq].blocked = False
        for root in self._dirty:
            for q in self._tree_queues[root]:
                q.unpark(self.states)
        self._dirty.clear()
        self._violations = []
        entries: list[_Entry] = []
        for q in self.queues.values():
            ws = q.pop_head(self.states)
            if ws is not None:
                entries.append((ws, q, self._nominate(ws, q)))
        admitted: list[R.Admission] = []
        preempted: list[R.Preemption] = []
        claimed: set[str] = set()
        self._reserved = []
        for entry in self._ordered(entries):
            self._process(entry, now, admitted, preempted, claimed)
        for node, usage in self._reserved:
            self.tree.charge(node, usage, -1)
        for p in preempted:
            victim = self.states[p.victim]
            self._requeue_evicted(victim, now, "Preempted", backoff=self.backoff_preempted)
        return R.CycleResult(now=now, admitted=admitted, preempted=preempted, heads=len(entries),
                             violations=self._violations)

    def _nominate(self, ws: WState, q: CQQueue) -> Assignment:
        return nominate(self.tree, q.node, q.spec, self.flavors, ws.workload, ws.requests)

    @staticmethod
    def _classic_key(e: _Entry) -> tuple[bool, bool, int, float]:
        return (not e[0].preempting, e[2].borrows, -e[0].workload.priority, e[0].queue_ts)

    def _ordered(self, entries: list[_Entry]) -> Iterable[_Entry]:
        if not self.fair_sharing:
            yield from sorted(entries, key=self._classic_key)
            return
        first = [e for e in entries if e[0].preempting]  # their victims are gone: they go first
        rest = [e for e in entries if not e[0].preempting]  # split before processing flips the flag
        yield from first
        # Fair sharing: per cohort tree, re-run the tournament after each decision (DRS changes with usage).
        by_root: dict[QNode, dict[str, _Entry]] = {}
        for e in sorted(rest, key=self._classic_key):
            by_root.setdefault(self.tree.root(e[1].node), {})[e[1].spec.name] = e
        for root, heads in by_root.items():
            while heads:
                pick = tournament(self.tree, root, heads, lambda e: e[2].usage,
                                  lambda e: (-e[0].workload.priority, e[0].queue_ts))
                assert pick is not None
                del heads[pick[1].spec.name]
                yield pick

    def _set_pending(self, ws: WState, reason: str, message: str, waiting_for: tuple[str, ...] = ()) -> None:
        ws.pending = R.Pending(workload=ws.workload.name, cluster_queue=ws.cq, reason=reason, message=message,
                               position=0, ahead=0, waiting_for=waiting_for)

    def _process(self, entry: _Entry, now: float, admitted: list[R.Admission], preempted: list[R.Preemption],
                 claimed: set[str]) -> None:
        ws, q, a = entry
        if a.mode == Mode.NO_FIT:
            self._set_pending(ws, a.reason, a.message)
            q.park(ws)
            return
        if a.mode == Mode.FIT:
            if not self.tree.fits(q.node, a.usage):
                self._set_pending(ws, R.PENDING, R.MSG_NO_LONGER_FITS)
                q.push(ws)
                return
            placements: tuple[R.PodPlacement, ...] = ()
            if self.cluster is not None:
                placed = self.cluster.place(ws.workload, [p.flavors for p in a.pod_sets], self.flavors, commit=True)
                if isinstance(placed, str):
                    a.reason, a.message = R.UNSCHEDULABLE, placed
                else:
                    placements = tuple(placed)
            if self.cluster is None or placements:
                admitted.append(self._admit(ws, q, a, placements, now))
                return
        plan = plan_preemption(tree=self.tree, cluster=self.cluster, states=self.states, queues=self.queues,
                               tree_queues=self._tree_queues[self.tree.root(q.node)], preemptor=ws,
                               assignment=a, flavors=self.flavors, audit=self._audit if self.audit else None)
        if plan is None:
            self._set_pending(ws, a.reason, a.message)
            q.park(ws)
            return
        names = [v.name for v in plan.victims]
        if claimed.intersection(names):
            self._set_pending(ws, R.PENDING, R.MSG_OVERLAPPING_TARGETS)
            q.push(ws)
            return
        claimed.update(names)
        for v in plan.victims:
            self.states[v.name].evicting = True
            preempted.append(R.Preemption(
                victim=v.name, preemptor=ws.workload.name, reason=plan.reasons[v.name],
                victim_cluster_queue=v.cluster_queue, preemptor_cluster_queue=ws.cq,
                message=f"Preempted to accommodate a workload ({ws.workload.name}) due to "
                        f"{plan.reasons[v.name]}"))
        ws.preempting = True
        q.waiting = ws
        # Hold the preemptor's quota for the rest of the cycle, so a later head cannot take what the victims
        # free (Kueue keeps such heads out of the cohort in the cycle); dropped when the cycle ends.
        self.tree.charge(q.node, a.usage)
        self._reserved.append((q.node, a.usage))
        self._set_pending(ws, R.WAITING_FOR_PREEMPTED, R.msg_pending_preemption(len(names)), tuple(names))
        q.push(ws)

    def _admit(self, ws: WState, q: CQQueue, a: Assignment, placements: tuple[R.PodPlacement, ...],
               now: float) -> R.Admission:
        node = q.node
        borrowing = any(node.usage.get(fr, 0) + v > node.nominal.get(fr, 0) for fr, v in a.usage.items())
        self.tree.charge(node, a.usage)
        merged: dict[str, str] = {}
        for p in a.pod_sets:
            for r, f in p.flavors.items():
                merged.setdefault(r, f)
        adm = R.Admission(
            workload=ws.workload.name, cluster_queue=ws.cq, flavors=merged, borrowing=borrowing,
            pod_sets=tuple(R.PodSetAdmission(name=p.name, count=p.count, flavors=dict(p.flavors),
                                             resource_usage={fr[1]: from_units(v) for fr, v in p.usage.items()})
                           for p in a.pod_sets),
            placements=placements, admitted_at=now)
        ws.status, ws.usage, ws.admission, ws.placements = ADMITTED, dict(a.usage), adm, placements
        ws.admitted_at, ws.pending, ws.preempting = now, None, False
        self._admit_seq += 1
        ws.admit_seq = self._admit_seq
        q.admitted[ws.workload.name] = ws
        return adm

    def _audit(self, preemptor: WState, victims: list[Candidate], sim: LedgerSim) -> None:
        from .invariants import check_preemption
        pol = self.queues[preemptor.cq].spec.preemption
        self._violations.extend(check_preemption(
            policy=pol, preemptor_priority=preemptor.workload.priority, preemptor_ts=preemptor.queue_ts,
            victims=victims, sim=sim))

    # -- queries -----------------------------------------------------------------------------------------

    def pending_info(self, name: str) -> R.Pending | None:
        ws = self._get(name)
        if ws.status != PENDING:
            return None
        q = self.queues[ws.cq]
        order = q.ordered(self.states)
        pos = next((i for i, x in enumerate(order) if x is ws), len(order)) + 1
        return self._pending_at(ws, q, order, pos)

    def pending_all(self) -> dict[str, R.Pending]:
        """``pending_info`` for every pending workload at once: one sort per queue, not one per workload."""
        out: dict[str, R.Pending] = {}
        for q in self.queues.values():
            order = q.ordered(self.states)
            for i, ws in enumerate(order):
                out[ws.workload.name] = self._pending_at(ws, q, order, i + 1)
        return out

    def _pending_at(self, ws: WState, q: CQQueue, order: list[WState], pos: int) -> R.Pending:
        name = ws.workload.name
        base = ws.pending or R.Pending(workload=name, cluster_queue=ws.cq, reason=R.PENDING, message=R.MSG_QUEUED,
                                       position=0, ahead=0)
        reason, message, waiting = base.reason, base.message, base.waiting_for
        if q.strict and q.blocked and pos > 1 and ws.requeue_at is None:
            head = order[0].workload.name
            reason, message, waiting = R.PENDING, R.msg_strict_fifo(head, ws.cq), (head,)
        return R.Pending(workload=name, cluster_queue=ws.cq, reason=reason, message=message, position=pos,
                         ahead=pos - 1, requeue_at=ws.requeue_at, waiting_for=waiting)

    def queue_order(self, cluster_queue: str, now: float) -> list[tuple[str, int, float]]:
        """(name, priority, queue timestamp) of the queue's pending workloads eligible at ``now``."""
        return [(ws.workload.name, ws.workload.priority, ws.queue_ts) for ws in self.states.values()
                if ws.cq == cluster_queue and ws.status == PENDING
                and (ws.requeue_at is None or ws.requeue_at <= now)]

    def admission(self, name: str) -> R.Admission | None:
        return self._get(name).admission

    def next_requeue(self) -> float | None:
        """When the earliest backed-off workload returns to its queue (a cycle then has work), or None."""
        return self._backoff[0][0] if self._backoff else None

    def is_admitted(self, name: str) -> bool:
        ws = self.states.get(name)
        return ws is not None and ws.status == ADMITTED

    def pending_names(self) -> list[str]:
        return [n for n, ws in self.states.items() if ws.status == PENDING]

    def admitted_names(self) -> list[str]:
        return [n for n, ws in self.states.items() if ws.status == ADMITTED]

    def usage(self, cluster_queue: str) -> dict[FR, int]:
        """Usage per (flavor, resource) in m-units (cpu millicores, milli-GPU, memory milli-bytes)."""
        return {fr: v for fr, v in self.queues[cluster_queue].node.usage.items() if v}

    def quiescent(self) -> bool:
        """True when a cycle would consider no head (everything admitted, parked, blocked or backing off)."""
        if self._dirty:
            return False
        return not any(q.has_active(self.states) for q in self.queues.values())

    def would_fit(self, name: str) -> bool:
        """Would this pending workload fit free capacity right now (quota and nodes), without preemption?"""
        ws = self._get(name)
        q = self.queues[ws.cq]
        a = self._nominate(ws, q)
        if a.mode != Mode.FIT:
            return False
        if self.cluster is None:
            return True
        placed = self.cluster.place(ws.workload, [p.flavors for p in a.pod_sets], self.flavors, commit=False)
        return not isinstance(placed, str)

    def explain(self, name: str) -> str:
        from .explain import explain
        return explain(self, name)
