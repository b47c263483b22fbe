"""The admission engine: Kueue's scheduling cycle with KAI's fractions, gangs and placement, as pure code.

Role: accept workloads into per-ClusterQueue heaps, and on each ``cycle(now)`` take one head per ClusterQueue,
nominate flavors, order the heads (classic: waiting preemptors, non-borrowing, priority, age; or the fair
sharing tournament), then admit, preempt or leave each pending with Kueue's reason and message.
No I/O, no clock: time is the ``now`` argument.

Invariants:
- a cycle costs O(ClusterQueues + decisions), never O(pending): heads come from each queue's sorted run or heap
  of recent pushes; parked workloads are sorted back into the run (C ``sort``) only after a capacity event in
  their cohort tree, or, for a head whose verdict read what the nodes hold now, after any release of node room
  (``CQQueue.parked_on_nodes``); a head of the same shape as one of its queue's last inadmissible heads is
  settled by that head's nomination while neither epoch (the cohort tree's quota, the nodes) has moved
  (``_memo_of``), with the reference engine's decisions (``memo=False``), and keeps no object of its own (its
  shape's number, the memo's pending reason);
- usage only grows through a fit check against the quota tree, so limits hold (see ``quota``);
- a gang is charged and placed whole or not at all;
- victims keep their quota until the end of the cycle that chose them (like Kueue, where they hold it until
  their pods are gone); the preemptor is admitted in a later cycle, ahead of other heads.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
from collections.abc import Iterable, Mapping, Sequence

from taugrid.core.errors import NotFound, PermanentError

from . import elastic as E
from . import results as R
from .fairshare import tournament
from .kai import KaiPolicy, KaiSpec
from .model import (
    GPU,
    ClusterQueue,
    Cohort,
    LocalQueue,
    Node,
    PodSet,
    ReclaimWithinCohort,
    ResourceFlavor,
    Topology,
    Workload,
    fraction_units,
    from_units,
    to_units,
)
from .nominate import Assignment, Granular, Mode, PMode, PodSetAssignment, nominate
from .placement import Cluster
from .queues import ADMITTED, PENDING, CQQueue, Memo, WState
from .quota import FR, QNode, QuotaTree
from .tas_nominate import with_topology
from .victims import DEFAULT_STRATEGIES, LedgerSim, Target, fair_targets, get_targets

_Entry = tuple[WState, CQQueue, Assignment, list[Target]]
MEMO_SLOTS = 16  # memos a queue keeps, one per shape (a queue's heads alternate between a few shapes)


# A pod set's fields, in order, read by one C getter, and the positions of those that hold a mapping (made
# hashable as sorted items): worked out once, not per head (``dataclasses.fields`` and an ABC ``isinstance`` per
# field were most of a parked head's cost).
_POD_SET_FIELDS = tuple(f.name for f in dataclasses.fields(PodSet))
_POD_SET_VALUES = operator.attrgetter(*_POD_SET_FIELDS)
_POD_SET_MAPPINGS = tuple(i for i, f in enumerate(dataclasses.fields(PodSet)) if "Mapping" in str(f.type))
SHAPES_KEPT = 4096  # distinct shapes an engine shares among its workloads before it starts afresh


def _frozen_pod_set(ps: PodSet) -> tuple[object, ...]:
    values = list(_POD_SET_VALUES(ps))
    for i in _POD_SET_MAPPINGS:
        m = values[i]
        values[i] = tuple(sorted(m.items())) if m else ()
    return tuple(values)


class _Shapes:
    """Numbers the shapes an engine meets (what a memo must match, see ``Engine._memo_of``): every field of every
    pod set, tolerations, placement, priority and preemptibility. Workloads of one shape get one number, kept on
    their state until the workload object changes, so a memo is found by an int, and 100,000 pending runs keep no
    object of their own for it that the garbage collector must walk again and again (each run's own shape once
    made a full collection, ≈ 0.35 s at that scale, land in every ~30th parked cycle)."""

    __slots__ = ("ids", "serial")

    def __init__(self) -> None:
        self.ids: dict[tuple[object, ...], int] = {}
        self.serial = 0

    def of(self, ws: WState) -> int:
        w = ws.workload
        if ws.shape_of is w:
            return ws.shape
        key = (w.priority, w.preemptible, w.placement, w.tolerations, *map(_frozen_pod_set, w.pod_sets))
        sid = self.ids.get(key)
        if sid is None:
            if len(self.ids) >= SHAPES_KEPT:
                # Many distinct shapes: numbering starts afresh rather than growing without bound. Numbers are
                # never given twice, so a memo kept under an old number merely stops matching (a nomination).
                self.ids.clear()
            self.serial += 1
            sid = self.ids[key] = self.serial
        ws.shape, ws.shape_of = sid, w
        return sid


class Engine:
    def __init__(self, cluster_queues: Iterable[ClusterQueue], cohorts: Iterable[Cohort] = (),
                 flavors: Iterable[ResourceFlavor] = (), nodes: Iterable[Node] | None = None, *,
                 local_queues: Iterable[LocalQueue] = (), fair_sharing: bool = False,
                 fair_sharing_strategies: Sequence[str] = DEFAULT_STRATEGIES,
                 recompute_on_overlap: bool = True,
                 backoff_base_s: float = 1.0, backoff_max_s: float = 3600.0, backoff_preempted: bool = False,
                 gpu_memory_mb: int = 81920, audit: bool = False, kai: KaiSpec | None = None,
                 topologies: Iterable[Topology] = (), memo: bool = True) -> None:
        cqs = list(cluster_queues)
        self.flavors = {f.name: f for f in flavors}
        self.topologies = {t.name: t for t in topologies}
        for t in self.topologies.values():
            t.validate()
        self.tree = QuotaTree(cqs, cohorts)
        self.queues = {cq.name: CQQueue(cq, self.tree.cqs[cq.name]) for cq in cqs}
        self.local_queues = {lq.name: lq.cluster_queue for lq in local_queues}
        self.cluster = Cluster(nodes, self.topologies) if nodes is not None else None
        self._tas = any(f.topology_name is not None for f in self.flavors.values())
        # Quota charge for gpu_memory pods: a share of the largest device (KAI charges the actual device later).
        self._charge_mem = (self.cluster.max_gpu_memory_mb if self.cluster else 0) or gpu_memory_mb
        self.fair_sharing = fair_sharing
        bad = [x for x in fair_sharing_strategies if x not in DEFAULT_STRATEGIES]
        if bad or not fair_sharing_strategies:
            raise PermanentError(f"fair-sharing preemption strategies {list(fair_sharing_strategies)}: use one or "
                                 f"both of {list(DEFAULT_STRATEGIES)}, in the order to try them")
        self.fair_sharing_strategies = tuple(fair_sharing_strategies)
        # Kueue's RecomputeAssignmentUponPreemptionTargetsOverlap (default on); off: a head whose targets overlap an
        # earlier head's is skipped for the cycle.
        self.recompute_on_overlap = recompute_on_overlap
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.backoff_preempted = backoff_preempted
        self.audit = audit
        self.states: dict[str, WState] = {}
        self._backoff: list[tuple[float, str, int]] = []
        self._tree_queues: dict[QNode, list[CQQueue]] = {}
        for q in self.queues.values():
            self._tree_queues.setdefault(self.tree.root(q.node), []).append(q)
        self._dirty: set[QNode] = set()
        # Node room was released since the last cycle (nodes are shared): heads whose verdict read the nodes, in
        # every cohort tree, are tried again; a head parked by quota alone waits for its own tree's event.
        self._node_event = False
        self._violations: list[str] = []
        self._admit_seq = 0
        self._reserved: list[tuple[QNode, dict[FR, int]]] = []
        self._held_nodes: list[str] = []  # Cluster allocation keys holding TAS preemptors' domains this cycle
        self._cycle_victims: dict[str, Target] = {}
        self._resized: list[R.Resize] = []  # elastic shrinks decided in this cycle
        self._by_node = {q.node: q for q in self.queues.values()}
        self.kai = KaiPolicy(kai) if kai is not None else None  # KAI department/project queues (kai.py)
        # Reuse an inadmissible head's verdict for the next head of the same shape while nothing it read changed
        # (off: every head is nominated, the reference the property tests compare against). Not with KAI,
        # whose queues read state outside the cohort tree.
        self.memo = memo and self.kai is None
        self.nominations = 0  # heads nominated, not settled by a memo (what a bench reports beside the heads)
        self._shapes = _Shapes()  # one number per shape (see ``_Shapes``)
        self._oracle_empty: set[tuple[FR, int]] = set()  # the current nomination's empty oracle answers
        self._elastic: set[str] = set()  # admitted at some point and elastic: what ``grow`` looks at
        self._awaiting: set[str] = set()  # preemptors waiting for elastic victims to shrink
        # A head parked for lack of node room passed quota on some flavor; quota or node room taken later (in
        # any cohort tree: nodes are shared, and a topology that no longer fits moves a TAS head to its next
        # flavor) can move its flavor choice to one whose nodes have room. ``_taken`` counts admissions and
        # growths; ``_node_parked`` holds, per cohort tree root with such heads, the count when the cycle that
        # parked the first began (its nominations saw that state): a change unparks the tree.
        self._taken = self._cycle_taken = 0
        self._node_parked: dict[QNode, int] = {}
        if self.flavors:  # Kueue: a ClusterQueue naming a flavor that does not exist is inactive
            for q in self.queues.values():
                missing = sorted({fq.name for g in q.spec.resource_groups for fq in g.flavors} - set(self.flavors))
                if missing:
                    q.inactive = (f"ClusterQueue {q.spec.name} is inactive: flavor(s) {', '.join(missing)} not "
                                  f"found; define the ResourceFlavor or use one of {sorted(self.flavors)}")
            for q in self.queues.values():  # Kueue: a TAS flavor whose Topology is missing makes the queue inactive
                lost = sorted({f"{f.name} (topology {f.topology_name})" for g in q.spec.resource_groups
                               for fq in g.flavors if (f := self.flavors.get(fq.name)) is not None
                               and f.topology_name is not None and f.topology_name not in self.topologies})
                if lost and not q.inactive:
                    q.inactive = (f"ClusterQueue {q.spec.name} is inactive: flavor(s) {', '.join(lost)} name a "
                                  f"topology that is not defined; define it or use one of {sorted(self.topologies)}")

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
        self._check_topology_levels(workload, cq)
        requests = self._requests(workload)
        ws = WState(workload, cq, requests, queue_ts=workload.created_at)
        old = E.replaced_slice(self, workload, cq)
        if old is not None:  # a Kueue scale-up slice: charged only the pods it adds
            ws.replaces, ws.requests = old.workload.name, E.slice_requests(self, workload, old)
        if self.memo:
            self._shapes.of(ws)  # once, as it arrives: what every cycle that meets it as a head compares
        self.states[workload.name] = ws
        q = self.queues[cq]
        q.push(ws)
        q.blocked = False  # a new arrival may outrank a blocked StrictFIFO head

    def restore(self, workload: Workload, flavors: Sequence[Mapping[str, str]], admitted_at: float, *,
                usage: Sequence[Mapping[str, float]] | None = None,
                gpus: Sequence[Sequence[int]] | None = None, nodes: Sequence[str] | None = None,
                evicted: bool = False) -> R.Admission:
        """Load a workload that is already admitted (after a restart, or a test starting from a busy cluster).

        ``flavors`` is per pod set: resource -> flavor, as the admission recorded it. ``usage`` (per pod set,
        resource -> total in user units) overrides the requests, as Kueue charges ``status.admission``'s
        ``resourceUsage``. With nodes, ``gpus`` is per pod (pods numbered across pod sets in order) the GPU
        indices it holds and ``nodes`` (optional) the node each pod runs on; without ``gpus`` the pods are
        placed afresh. The quota is charged without a fit check
        (what runs holds its resources even if the quota shrank); an unknown queue or flavor is an error.
        ``evicted``: its eviction is already under way (it keeps its quota until its pods are gone, and is the
        first preemption candidate, as Kueue prefers evicted workloads).
        """
        workload.validate()
        if workload.name in self.states:
            raise PermanentError(f"workload {workload.name} already known; names must be unique")
        cq = self.resolve_queue(workload.queue)
        q = self.queues[cq]
        if len(flavors) != len(workload.pod_sets):
            raise PermanentError(f"workload {workload.name}: {len(flavors)} flavor assignment(s) for "
                                 f"{len(workload.pod_sets)} pod set(s); give one per pod set")
        requests = self._requests(workload)
        topology: dict[str, R.TopologyAssignment] = {}
        offered = {fq.name for g in q.spec.resource_groups for fq in g.flavors}
        known = set(self.flavors) or offered
        psas: list[PodSetAssignment] = []
        total: dict[FR, int] = {}
        for i, (ps, req, flv) in enumerate(zip(workload.pod_sets, requests, flavors, strict=True)):
            amounts = ({r: to_units(v) for r, v in usage[i].items()} if usage is not None else req)
            psa = PodSetAssignment(ps.name, ps.count, dict(flv), {})
            for r, v in amounts.items():
                if not v:
                    continue
                f = flv.get(r)
                # A flavor the queue has no quota for is accepted (Kueue's cache charges it; the queue then
                # borrows it from its cohort); a flavor nobody defined is an error.
                if f is None or f not in known:
                    raise PermanentError(
                        f"workload {workload.name} pod set {ps.name}: {r} assigned to flavor {f!r}, which is not "
                        f"a known ResourceFlavor; use one of {sorted(known)}")
                psa.usage[(f, r)] = psa.usage.get((f, r), 0) + v
                total[(f, r)] = total.get((f, r), 0) + v
            psas.append(psa)
        ws = WState(workload, cq, requests, queue_ts=workload.created_at)
        placements: tuple[R.PodPlacement, ...] = ()
        if self.cluster is not None:
            flv_list = [dict(f) for f in flavors]
            placed = (self.cluster.adopt(workload, gpus, nodes) if gpus is not None
                      else self.cluster.place(workload, flv_list, self.flavors, commit=True))
            if isinstance(placed, str):
                raise PermanentError(f"workload {workload.name}: cannot restore its pods: {placed}")
            placements = tuple(placed)
            topology = self.cluster.topology_of(workload, flv_list, self.flavors, placements)
        self.states[workload.name] = ws
        a = Assignment(mode=Mode.FIT, pod_sets=psas, usage=total, topology=topology if self.cluster else {})
        adm = self._admit(ws, q, a, placements, admitted_at)
        ws.admit_seq = 0  # restored admissions at the same instant are ordered by name, as Kueue does by UID
        ws.evicting = evicted
        return adm

    def _check_topology_levels(self, workload: Workload, cq: str) -> None:
        """Refuse a topology request naming a level that none of the queue's TAS flavors' topologies has (it
        could never be placed)."""
        topos = [self.topologies[f.topology_name] for g in self.queues[cq].spec.resource_groups for fq in g.flavors
                 if (f := self.flavors.get(fq.name)) is not None and f.topology_name in self.topologies]
        if not topos:
            return
        for ps in workload.pod_sets:
            tr = ps.topology_request
            if tr is None:
                continue
            for name, key in (("required", tr.required), ("preferred", tr.preferred),
                              ("slice_required", tr.slice_required)):
                if key is not None and not any(key in t.levels for t in topos):
                    levels = sorted({lv for t in topos for lv in t.levels})
                    raise PermanentError(
                        f"workload {workload.name} pod set {ps.name}: topology_request.{name}={key!r} is not a "
                        f"level of the topology of any flavor of ClusterQueue {cq}; use one of {levels}")

    def _requests(self, workload: Workload) -> list[dict[str, int]]:
        requests = []
        for ps in workload.pod_sets:
            # Zero requests are kept: Kueue still assigns a flavor to a resource asked for with 0 when the
            # ClusterQueue covers it (and ignores it when it does not).
            req = {r: to_units(v) * ps.count for r, v in ps.requests.items()}
            if ps.shares_gpu:
                req[GPU] = fraction_units(ps, self._charge_mem) * ps.count
            requests.append(req)
        return requests

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
        held = bool(ws.held or ws.held_pods)
        ws.usage, ws.admission, ws.placements, ws.held, ws.held_pods = {}, None, (), {}, ()
        self._capacity_event(q)
        if held:
            E.notify_released(self, ws.workload.name)

    def _capacity_event(self, q: CQQueue) -> None:
        self._dirty.add(self.tree.root(q.node))
        if self.cluster is not None:
            self._node_event = True  # nodes are shared by every cohort tree (see ``_node_event``)

    def shrink(self, name: str, count: int, now: float, cause: str = R.SHRUNK) -> R.Resize:
        """Kueue's in-place scale-down of an admitted elastic workload's resizable pod set to ``count`` (e.g. a
        GPU fault on one worker). The removed pods' quota and node room stay held until ``release_removed``."""
        return E.shrink(self, self._get(name), count, now, cause)

    def release_removed(self, name: str) -> None:
        """The pods an in-place shrink removed are gone: free their quota and node room."""
        E.release_removed(self, self._get(name))

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        """Cordon (``False``) or uncordon a node; an uncordon is a capacity event for every parked head."""
        if self.cluster is None:
            return
        self.cluster.epoch += 1
        # Either way a capacity event: fewer nodes can move a topology (TAS) head to another flavor too.
        self._dirty.update(self._tree_queues)
        if schedulable:
            self.cluster.unschedulable.discard(node)
        else:
            self.cluster.unschedulable.add(node)

    def set_ready(self, node: str, ready: bool) -> None:
        """A node became NotReady (unhealthy) or Ready again: a NotReady node takes nothing new and leaves TAS
        capacity at once (what runs there keeps its allocation); Ready again is a capacity event."""
        if self.cluster is None:
            return
        self.cluster.epoch += 1
        self._dirty.update(self._tree_queues)  # either way, as for a cordon
        if ready:
            self.cluster.not_ready.discard(node)
        else:
            self.cluster.not_ready.add(node)

    def finish(self, name: str, now: float) -> None:
        """The workload completed (or was deleted): free its quota and forget it."""
        ws = self._get(name)
        if ws.status == ADMITTED:
            self._release(ws)
        ws.status = "finished"
        ws.version += 1
        del self.states[name]
        self._elastic.discard(name)

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
            ws.why = (R.BACKOFF, f"Requeued after eviction ({reason}); retry at t={ws.requeue_at:g}", ())
        else:
            ws.why = (R.PENDING, f"Requeued after eviction ({reason})", ())
            q.push(ws)

    # -- the cycle ---------------------------------------------------------------------------------------

    def cycle(self, now: float) -> R.CycleResult:
        """One Kueue scheduling cycle: nominate every head against the same snapshot (flavors and preemption
        targets), order them, then process each: a head fits if its usage fits once every victim chosen so far
        in the cycle (and its own) is set aside; a head that fits or preempts takes its usage for the rest of
        the cycle; victims are evicted when the cycle ends."""
        while self._backoff and self._backoff[0][0] <= now:
            _, name, version = heapq.heappop(self._backoff)
            ws = self.states.get(name)
            if ws is not None and ws.version == version:
                ws.requeue_at = None
                ws.version += 1
                self.queues[ws.cq].push(ws)
                self.queues[ws.cq].blocked = False
        if self.kai is not None:
            self._dirty.update(self.kai.refresh(self))
        for root, taken in list(self._node_parked.items()):
            if self._taken != taken:
                self._dirty.add(root)
        self._cycle_taken = self._taken
        for root in self._dirty:
            self._node_parked.pop(root, None)
            for q in self._tree_queues[root]:
                q.unpark(self.states)
        if self._node_event:
            for root, queues in self._tree_queues.items():
                if root not in self._dirty:
                    for q in queues:
                        q.unpark_on_nodes(self.states)
        self._dirty.clear()
        self._node_event = False
        self._violations = []
        entries: list[_Entry] = []
        classic, settled, cluster = not self.fair_sharing, 0, self.cluster
        for q in self.queues.values():
            ws = q.pop_head(self.states)
            if ws is None:
                continue
            if q.inactive:
                self._set_pending(ws, R.INADMISSIBLE, q.inactive)
                q.park(ws)
                continue
            if ws.awaiting:  # its elastic victims are shrinking: their pods still hold what it needs
                ws.parked = True
                q.parked.append((-ws.workload.priority, ws.queue_ts, ws.seq, ws.workload.name, ws.version))
                continue
            quota_epoch, nodes_epoch = q.root.epoch, cluster.epoch if cluster is not None else 0  # ``_epochs``
            if q.head_epochs != (quota_epoch, nodes_epoch):  # a new tuple only when they moved (none kept)
                q.head_epochs = (quota_epoch, nodes_epoch)
            memo = self._memo_of(ws, q) if q.memos else None
            if memo is not None:
                # Its nomination would repeat the memo's (no victims either).
                ws.on_nodes = memo.on_nodes
                if classic:
                    # Settled here, as ``_process`` would (its pending record, parked; a PREEMPT verdict of a
                    # queue that may reclaim ``Any`` holds nothing): that has no effect on any other head and
                    # reads nothing another head's processing changes, and taking an entry out of the classical
                    # order leaves the others' order as it was, so the cycle decides as if it were sorted and
                    # processed in its place (the fair-sharing tournament is not so: a head scores its queue's
                    # subtree, so it stays an entry there).
                    ws.why = memo.why
                    q.park(ws)
                    settled += 1
                else:
                    entries.append((ws, q, memo.assignment, []))
                continue
            reads = self._reads()
            self.nominations += 1
            self._oracle_empty.clear()
            a = self._nominate(ws, q)
            targets: list[Target] = []
            if a.mode == Mode.PREEMPT and not self._oracle_found_none(ws, a):
                targets = self._targets(ws, q, a)
            ws.on_nodes = self._reads() != reads
            entries.append((ws, q, a, targets))
        admitted: list[R.Admission] = []
        preempted: list[R.Preemption] = []
        self._cycle_victims = {}
        self._reserved = []
        self._resized = []
        for entry in self._ordered(entries):
            self._process(entry, now, admitted, preempted)
        for node, usage in self._reserved:
            self.tree.charge(node, usage, -1)
        if self.cluster is not None:
            for key in self._held_nodes:
                self.cluster.release(key)
        self._held_nodes = []
        for p in preempted:
            victim = self.states[p.victim]
            self._requeue_evicted(victim, now, "Preempted", backoff=self.backoff_preempted)
        resized = self._resized + self._grow(now)
        return R.CycleResult(now=now, admitted=admitted, preempted=preempted, heads=len(entries) + settled,
                             violations=self._violations, resized=resized)

    def _grow(self, now: float) -> list[R.Resize]:
        """Elastic growth into capacity no active pending head of the cohort tree wants (nodes are shared, so
        with nodes any active head anywhere holds growth back). Nothing to look at without an elastic workload:
        the scan of every queue for an active head is skipped (it was half an idle cycle at 1,000 queues)."""
        self._awaiting = {n for n in self._awaiting if (ws := self.states.get(n)) is not None and ws.awaiting}
        if not self._elastic:
            return []
        busy = {self.tree.root(q.node) for q in self.queues.values() if q.has_active(self.states)}
        busy |= {self.tree.root(self.queues[self.states[n].cq].node) for n in self._awaiting}
        if busy and self.cluster is not None:
            return []
        return E.grow(self, now, busy)

    def preemption_targets(self, name: str, flavors: Sequence[Mapping[str, str]],
                           preempt: Sequence[Iterable[str]]) -> list[tuple[str, str]]:
        """Victims (name, Preempted reason) a pending workload would evict with the given flavor assignment.

        ``flavors`` is per pod set resource -> flavor, ``preempt`` per pod set the resources whose flavor needs
        preemption (Kueue's ``Preempt`` mode). Kueue's ``GetTargets``: nothing is changed.
        """
        ws = self._get(name)
        q = self.queues[ws.cq]
        psas = []
        total: dict[FR, int] = {}
        for ps, req, flv, pre in zip(ws.workload.pod_sets, ws.requests, flavors, preempt, strict=True):
            need = set(pre)
            psa = PodSetAssignment(ps.name, ps.count, dict(flv), {},
                                   {r: (Mode.PREEMPT if r in need else Mode.FIT) for r in flv})
            for r, v in req.items():
                fr = (flv[r], r)
                psa.usage[fr] = psa.usage.get(fr, 0) + v
                total[fr] = total.get(fr, 0) + v
            psas.append(psa)
        a = Assignment(mode=Mode.PREEMPT, pod_sets=psas, usage=total)
        return [(t.name, t.reason) for t in self._targets(ws, q, a)]

    def _nominate(self, ws: WState, q: CQQueue, sticky: Mapping[tuple[str, str], str] | None = None
                  ) -> Assignment:
        def oracle(fr: FR, val: int) -> Granular:
            return self._simulate_preemption(ws, q, fr, val)

        old = self.states.get(ws.replaces) if ws.replaces else None
        original = E.original_flavors(old) if old is not None and old.admission is not None else None

        def run(excluded: Mapping[tuple[str, str], str] | None = None) -> Assignment:
            return nominate(self.tree, q.node, q.spec, self.flavors, ws.workload, ws.requests, oracle,
                            known_flavors_only=bool(self.flavors), fair_sharing=self.fair_sharing, sticky=sticky,
                            topologies=self.topologies if self._tas else None, excluded=excluded,
                            original=original)

        a = run()
        if self._tas:
            a = with_topology(a, workload=ws.workload, cluster=self.cluster, flavors=self.flavors,
                              when_can_preempt=q.spec.flavor_fungibility.when_can_preempt, renominate=run)
        return self.kai.nominated(self, ws, q, a) if self.kai is not None else a

    def _sim(self, ws: WState, q: CQQueue, usage: Mapping[FR, int],
             pod_set_flavors: list[dict[str, str]] | None) -> LedgerSim:
        return LedgerSim(tree=self.tree, cluster=self.cluster, states=self.states, queues=self.queues,
                         workload=E.delta_workload(ws, self), node=q.node, usage=usage,
                         pod_set_flavors=pod_set_flavors,
                         flavors=self.flavors)

    def _find(self, ws: WState, q: CQQueue, requests: Mapping[FR, int], frs_need: set[FR],
              flv: list[dict[str, str]] | None) -> list[Target]:
        """Kueue ``getTargets``: fair-sharing preemption when fair sharing is on, else classical. A scale-up
        slice never counts its own old slice as a victim (Kueue ``FindReplacedSliceTarget``)."""
        old = self.states.get(ws.replaces) if ws.replaces else None
        if old is None or old.status != ADMITTED:
            return self._find_targets(ws, q, requests, frs_need, flv)
        old.status = "replacing"
        try:
            return self._find_targets(ws, q, requests, frs_need, flv)
        finally:
            old.status = ADMITTED

    def _find_targets(self, ws: WState, q: CQQueue, requests: Mapping[FR, int], frs_need: set[FR],
                      flv: list[dict[str, str]] | None) -> list[Target]:
        if self.fair_sharing:
            return fair_targets(tree=self.tree, states=self.states, queues=self.queues, preemptor=ws,
                                requests=requests, frs_need=frs_need,
                                sim_factory=lambda usage: self._sim(ws, q, usage, flv), by_node=self._by_node,
                                strategies=self.fair_sharing_strategies)
        return get_targets(tree=self.tree, states=self.states, queues=self.queues, preemptor=ws, requests=requests,
                           frs_need=frs_need, sim_factory=lambda usage: self._sim(ws, q, usage, flv),
                           by_node=self._by_node)

    def _targets(self, ws: WState, q: CQQueue, a: Assignment) -> list[Target]:
        flv = [p.flavors for p in a.pod_sets]
        if self.kai is not None and self.kai.owns(ws.cq):  # KAI's reclaim, not Kueue's classical preemption
            return self.kai.targets(self, ws, self._sim(ws, q, a.usage, flv), set(self._cycle_victims), a)
        targets = self._find(ws, q, a.usage, a.frs_need_preemption, flv)
        if targets and self.audit:
            self._audit(ws, q, a, targets)
        return targets

    def _simulate_preemption(self, ws: WState, q: CQQueue, fr: FR, val: int) -> Granular:
        """Kueue's preemption oracle: could preempting make ``val`` of ``fr`` fit, and by reclaim only?"""
        usage = {fr: val}
        targets = self._find(ws, q, usage, {fr}, None)
        if not targets:
            self._oracle_empty.add((fr, val))
            return PMode.NO_CANDIDATES, self.tree.borrow_height(q.node, fr, val)[0]
        sim = self._sim(ws, q, usage, None)
        for t in targets:
            sim.remove(t.name)
        borrow = self.tree.borrow_height(q.node, fr, val)[0]
        for t in targets:
            sim.restore(t.name)
        return (PMode.PREEMPT if any(t.cluster_queue == ws.cq for t in targets) else PMode.RECLAIM), borrow

    def _oracle_found_none(self, ws: WState, a: Assignment) -> bool:
        """The nomination's preemption oracle already searched for exactly these victims and found none: a head
        asking for one (flavor, resource) whose oracle came back empty for that amount. The search for its
        targets (Kueue asks ``GetTargets`` again) would repeat it with the same requests, contested resources and
        state, so it finds none either, unless a node placement is part of it (the flavors it is given then
        matter, and the oracle passes none) or KAI's reclaim answers instead of the classical search. Only with
        the memo: the reference engine searches again, as Kueue does (the property tests compare the two)."""
        if not self.memo or len(a.usage) != 1 or self.cluster is not None:
            return False
        (fr, val), = a.usage.items()
        return (fr, val) in self._oracle_empty and a.frs_need_preemption == {fr}

    @staticmethod
    def _classic_key(e: _Entry) -> tuple[bool, int, int, float]:
        # Kueue's classical order: preemptors whose victims are gone, then by borrowing level (how far up the
        # cohort tree the head must borrow; 0 first), then priority, then FIFO.
        return (not e[0].preempting, e[2].borrowing, -e[0].workload.priority, e[0].queue_ts)

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
                pick = tournament(self.tree, root, heads, lambda e: e[1].node, lambda e: e[2].usage,
                                  lambda e: (-e[0].workload.priority, e[0].queue_ts))
                assert pick is not None
                del heads[pick[1].spec.name]
                yield pick

    @staticmethod
    def _set_pending(ws: WState, reason: str, message: str, waiting_for: tuple[str, ...] = ()) -> None:
        ws.why = (reason, message, waiting_for)

    def quota_taken(self, q: CQQueue) -> None:
        """Quota and node room were taken in ``q`` (an admission, an elastic growth): see ``_node_parked``."""
        self._taken += 1

    def _reads(self) -> int:
        """How many placement questions have read what the nodes hold now (see ``WState.on_nodes``)."""
        return self.cluster.reads if self.cluster is not None else 0

    def _park(self, ws: WState, q: CQQueue, reads: int) -> None:
        """Park a head whose processing began at ``reads``: on the nodes' list if its verdict read them."""
        ws.on_nodes = ws.on_nodes or self._reads() != reads
        q.park(ws)

    def _epochs(self, q: CQQueue) -> tuple[int, int]:
        """What a nomination reads, as two counters: the cohort tree's quota epoch and the nodes' epoch."""
        return q.root.epoch, self.cluster.epoch if self.cluster is not None else 0

    def _remember(self, ws: WState, q: CQQueue, a: Assignment) -> None:
        """Keep the nomination of a head that it alone made inadmissible (see ``_memo_of``)."""
        if self.memo and self._memo_shape_ok(ws):
            if q.memo_epochs != q.head_epochs:
                q.memos.clear()  # memos of other epochs can never hit again (epochs only grow)
                q.memo_epochs = q.head_epochs
            shape = self._shapes.of(ws)
            q.memos.pop(shape, None)
            reason = a.reason if a.mode == Mode.NO_FIT else a.reason or R.WAITING_FOR_QUOTA  # as ``_process``
            q.memos[shape] = Memo(ws.workload, ws.queue_ts, q.head_epochs, a, (reason, a.message, ()), ws.on_nodes)
            if len(q.memos) > MEMO_SLOTS:
                del q.memos[next(iter(q.memos))]

    @staticmethod
    def _memo_shape_ok(ws: WState) -> bool:
        # Preemptors, scale-up slices and elastic workloads read more than their shape (their victims, the old
        # slice, their own admitted pods): never memoized.
        return not ws.preempting and ws.replaces is None and ws.workload.elastic is None

    def _memo_of(self, ws: WState, q: CQQueue) -> Memo | None:
        """The queue's memo whose verdict nominating ``ws`` now would give, or None. One does when nothing a
        nomination reads changed since the memo's head was nominated (both epochs equal: no usage, admitted
        workload or node changed in its cohort tree or on the nodes, simulations aside) and ``ws`` asks for the
        same thing (``_Shapes``): the same pod sets (requests, counts, selectors, excluded nodes, topology),
        tolerations, placement, priority and preemptibility. Its preemption candidates are then the same too:
        they depend on the preemptor's priority and, under ``LowerOrNewerEqualPriority`` only, on its queue
        timestamp, which must then be equal."""
        if not q.memos or q.memo_epochs != q.head_epochs or ws.preempting or ws.replaces is not None:
            return None  # every memo of the queue has the epochs ``memo_epochs`` (``_remember``)
        w = ws.workload
        if w.elastic is not None:
            return None  # as ``_memo_shape_ok``, inline: this runs once per head of every cycle
        memo = q.memos.get(ws.shape if ws.shape_of is w else self._shapes.of(ws))
        if memo is None:
            return None
        if ws.queue_ts == memo.queue_ts or not q.newer_equal:
            return memo
        return None

    def _node_targets(self, ws: WState, q: CQQueue, a: Assignment) -> list[Target]:
        """Victims that free node room for a head whose quota fits (none overlapping this cycle's victims)."""
        targets = self._find(ws, q, a.usage, set(a.usage), [p.flavors for p in a.pod_sets])
        if any(t.name in self._cycle_victims for t in targets):
            return []
        return targets

    def _fits_after(self, ws: WState, q: CQQueue, a: Assignment, targets: list[Target]) -> bool:
        """Kueue ``fits`` (quota only): does the head fit with every victim of this cycle so far, and its own,
        set aside?"""
        names = set(self._cycle_victims) | {t.name for t in targets}
        sim = self._sim(ws, q, a.usage, None)
        for n in names:
            sim.remove(n)
        try:
            return sim.fits()
        finally:
            for n in names:
                sim.restore(n)

    def _recompute_without_victims(self, ws: WState, q: CQQueue, first: Assignment
                                   ) -> tuple[Assignment, list[Target]]:
        """Nominate and find targets again with this cycle's victims set aside (quota, nodes, candidacy),
        keeping every resource on the flavor the first nomination chose."""
        sticky = {(p.name, r): f for p in first.pod_sets for r, f in p.flavors.items()}
        hidden = [self.states[n] for n in self._cycle_victims]
        sim = self._sim(ws, q, {}, None)
        for v in hidden:
            sim.remove(v.workload.name)
            v.status = "set-aside"  # not a candidate while set aside
        try:
            a = self._nominate(ws, q, sticky)
            targets = self._targets(ws, q, a) if a.mode == Mode.PREEMPT else []
        finally:
            for v in hidden:
                v.status = ADMITTED
                sim.restore(v.workload.name)
        return a, targets

    def _reserve(self, q: CQQueue, usage: dict[FR, int]) -> None:
        self.tree.charge(q.node, usage)
        self._reserved.append((q.node, usage))

    def _process(self, entry: _Entry, now: float, admitted: list[R.Admission], preempted: list[R.Preemption]
                 ) -> None:
        ws, q, a, targets = entry
        reads = self._reads()  # a verdict reached below may read the nodes too (recomputed, placed)
        # A verdict of its nomination alone is remembered, unless it came from a memo (a PREEMPT head of a queue
        # that cannot always reclaim holds capacity for the cycle: a verdict with a side effect, not memoized).
        alone = a.mode == Mode.NO_FIT or (a.mode == Mode.PREEMPT and not targets and q.spec.preemption.
                                          reclaim_within_cohort == ReclaimWithinCohort.ANY)
        if alone and not (q.memos and (m := q.memos.get(self._shapes.of(ws))) is not None
                          and m.assignment is a):
            self._remember(ws, q, a)
        if a.mode == Mode.NO_FIT:
            self._set_pending(ws, a.reason, a.message)
            self._park(ws, q, reads)
            return
        if a.mode == Mode.PREEMPT and not targets:
            self._set_pending(ws, a.reason or R.WAITING_FOR_QUOTA, a.message)
            self._reserve_unreclaimable(ws, q, a)
            self._park(ws, q, reads)
            return
        if self.recompute_on_overlap and any(t.name in self._cycle_victims for t in targets):
            # Kueue (RecomputeAssignmentUponPreemptionTargetsOverlap, on by default): assign again as if this
            # cycle's victims were gone; if it then fits, it waits for them (DeferredFit) holding its usage.
            a, targets = self._recompute_without_victims(ws, q, a)
            if a.mode == Mode.FIT:
                self._set_pending(ws, R.WAITING_FOR_PREEMPTED, R.MSG_DEFERRED_FIT)
                self._reserve(q, a.usage)
                q.push(ws)
                return
            if a.mode == Mode.NO_FIT:
                self._set_pending(ws, a.reason, a.message)
                self._park(ws, q, reads)
                return
            if not targets:
                self._set_pending(ws, a.reason or R.WAITING_FOR_QUOTA, a.message)
                self._reserve_unreclaimable(ws, q, a)
                self._park(ws, q, reads)
                return
        if any(t.name in self._cycle_victims for t in targets):
            self._set_pending(ws, R.WAITING_FOR_QUOTA, R.MSG_OVERLAPPING_TARGETS)
            q.push(ws)
            return
        if not self._fits_after(ws, q, a, targets):
            self._set_pending(ws, R.WAITING_FOR_QUOTA, R.MSG_NO_LONGER_FITS)
            q.push(ws)
            return
        if a.mode == Mode.FIT:
            placements: tuple[R.PodPlacement, ...] = ()
            if self.cluster is not None:
                placed = self.cluster.place(E.delta_workload(ws, self), [p.flavors for p in a.pod_sets],
                                            self.flavors, commit=True)
                if isinstance(placed, str):
                    # Quota fits but the nodes do not: preempt for node room where the policy allows (KAI).
                    targets = self._node_targets(ws, q, a)
                    if not targets:
                        self._set_pending(ws, R.UNSCHEDULABLE, placed)
                        if self._held_nodes:
                            # Room held for a preemptor until the cycle ends may be what it lacks: it comes back
                            # when the hold does, with no capacity event to unpark it, so it is tried next cycle.
                            q.push(ws)
                        else:
                            self._park(ws, q, reads)
                            self._node_parked.setdefault(self.tree.root(q.node), self._cycle_taken)
                        return
                else:
                    placements = tuple(placed)
                    a.topology = placed.topology
            if not targets:
                admitted.append(self._admit(ws, q, a, placements, now))
                return
        if targets and ws.workload.preemption_gated:  # every way to preempt ends here (quota, nodes, recomputed)
            self._set_pending(ws, R.PREEMPTION_GATED, R.MSG_PREEMPTION_GATED)
            self._park(ws, q, reads)
            return
        plan = E.shrink_plan(self, ws, lambda evicted: self._fits_after(ws, q, a, evicted), targets)
        if plan is not None:  # elastic victims give up pods instead of being evicted whole
            targets, shrinks = plan
            for vs, count in shrinks:
                self._resized.append(E.shrink(self, vs, count, now, R.SHRUNK_FOR_PREEMPTOR, ws.workload.name))
                ws.awaiting |= {vs.workload.name}
                self._awaiting.add(ws.workload.name)
        names = [t.name for t in targets] + sorted(ws.awaiting)
        for t in targets:
            self._cycle_victims[t.name] = t
            self.states[t.name].evicting = True
            preempted.append(R.Preemption(
                victim=t.name, preemptor=ws.workload.name, reason=t.reason,
                victim_cluster_queue=t.cluster_queue, preemptor_cluster_queue=ws.cq,
                message=f"Preempted to accommodate a workload ({ws.workload.name}) due to "
                        f"{R.HUMAN_REASONS.get(t.reason, t.reason)}"))
        ws.preempting = True
        q.waiting = ws
        self._hold_topology(ws, a, targets)
        # The preemptor takes its usage for the rest of the cycle (Kueue adds it to the snapshot), so a later
        # head cannot take what the victims free; dropped when the cycle ends.
        self._reserve(q, a.usage)
        self._set_pending(ws, R.WAITING_FOR_PREEMPTED, R.msg_pending_preemption(len(names), a.message),
                          tuple(names))
        q.push(ws)

    def _hold_topology(self, ws: WState, a: Assignment, targets: list[Target]) -> None:
        """Kueue ``updateAssignmentForTAS``: a preempting TAS workload holds the domains it will take for the rest
        of the cycle: found with its victims set aside, or as if the nodes were empty when it has none."""
        if self.cluster is None or not self._tas:
            return
        key = f"\0held:{ws.workload.name}"
        flv = [p.flavors for p in a.pod_sets]
        sim = self._sim(ws, self.queues[ws.cq], {}, None)
        for t in targets:
            sim.remove(t.name)
        try:
            if self.cluster.reserve_tas(key, ws.workload, flv, self.flavors, empty=not targets):
                self._held_nodes.append(key)
        finally:
            for t in targets:
                sim.restore(t.name)

    def _reserve_unreclaimable(self, ws: WState, q: CQQueue, a: Assignment) -> None:
        """Kueue ``reserveCapacityForUnreclaimablePreempt``: a head that needs preemption, found no victims and
        whose queue cannot always reclaim (``reclaimWithinCohort`` is not ``Any``) holds what it could use for
        the rest of the cycle, so a lower head of the cohort does not take it."""
        if q.spec.preemption.reclaim_within_cohort == ReclaimWithinCohort.ANY:
            return
        self._hold_topology(ws, a, [])
        node = q.node
        usage: dict[FR, int] = {}
        for fr, v in a.usage.items():
            used = node.usage.get(fr, 0)
            if a.borrowing > 0:
                lim = node.blimit.get(fr)
                usage[fr] = v if lim is None else min(v, node.nominal.get(fr, 0) + lim - used)
            else:
                usage[fr] = max(0, min(v, node.nominal.get(fr, 0) - used))
        usage = {fr: v for fr, v in usage.items() if v > 0}
        if usage:
            self._reserve(q, usage)

    def _admit(self, ws: WState, q: CQQueue, a: Assignment, placements: tuple[R.PodPlacement, ...],
               now: float) -> R.Admission:
        node = q.node
        borrowing = any(node.usage.get(fr, 0) + v > node.nominal.get(fr, 0) for fr, v in a.usage.items())
        self.tree.charge(node, a.usage)
        self.quota_taken(q)
        merged: dict[str, str] = {}
        for p in a.pod_sets:
            for r, f in p.flavors.items():
                merged.setdefault(r, f)
        adm = R.Admission(
            workload=ws.workload.name, cluster_queue=ws.cq, flavors=merged, borrowing=borrowing,
            pod_sets=tuple(R.PodSetAdmission(name=p.name, count=p.count, flavors=dict(p.flavors),
                                             resource_usage={fr[1]: from_units(v) for fr, v in p.usage.items()})
                           for p in a.pod_sets),
            placements=placements, admitted_at=now, topology_assignments=dict(a.topology))
        ws.status, ws.usage, ws.admission, ws.placements = ADMITTED, dict(a.usage), adm, placements
        ws.admitted_at, ws.why, ws.preempting = now, None, False
        ws.pod_set_usage = [dict(p.usage) for p in a.pod_sets]
        ws.last_resize = now  # an elastic workload's cooldown runs from its admission
        self._admit_seq += 1
        ws.admit_seq = self._admit_seq
        q.admitted[ws.workload.name] = ws
        if ws.workload.elastic is not None:
            self._elastic.add(ws.workload.name)
        if ws.replaces is not None:  # a Kueue scale-up slice takes over the old slice's usage and pods
            E.merge_slice(self, ws, q)
            assert ws.admission is not None
            return ws.admission
        return adm

    def _audit(self, ws: WState, q: CQQueue, a: Assignment, targets: list[Target]) -> None:
        from .invariants import check_targets
        self._violations.extend(check_targets(
            policy=q.spec.preemption, preemptor=ws, targets=targets, states=self.states,
            sim=self._sim(ws, q, a.usage, [p.flavors for p in a.pod_sets])))

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
        reason, message, waiting = ws.why or (R.PENDING, R.MSG_QUEUED, ())
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

    def settle_idle(self) -> int:
        """After a backlog drained: each queue with nothing waiting forgets its stale entries and memos
        (``CQQueue.settle_empty``); how many queues were empty. Walks every queue's entries: not per cycle."""
        return sum(q.settle_empty(self.states) for q in self.queues.values())

    def quiescent(self) -> bool:
        """True when a cycle would consider no head (everything admitted, parked, blocked or backing off)."""
        if self._dirty or any(taken != self._taken for taken in self._node_parked.values()):
            return False  # a capacity event (or an admission after a head parked for node room) is pending
        if self._node_event and any(q.parked_on_nodes or q.blocked for q in self.queues.values()):
            return False  # node room was released and some head waits for it
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
        placed = self.cluster.place(E.delta_workload(ws, self), [p.flavors for p in a.pod_sets], self.flavors,
                                    commit=False)
        return not isinstance(placed, str)

    def explain(self, name: str) -> str:
        from .explain import explain
        return explain(self, name)
