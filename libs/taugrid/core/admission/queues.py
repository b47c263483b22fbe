"""Per-ClusterQueue pending heaps and the engine's record of each workload.

Role: keep pending workloads ordered by (priority desc, queue timestamp asc) per ClusterQueue so a cycle pops
one head per queue in amortized O(log n) (from a sorted run, popped from its end, or a heap of what was pushed
since the run was last sorted), never scanning all pending workloads.

Invariants:
- an entry (in the heap or the run) is live only while its ``version`` equals the workload's ``version`` and the
  workload is pending and not parked; anything else is a stale entry skipped on pop (lazy deletion);
- BestEffortFIFO parks a head that did not fit (``parked``) until a capacity event in its cohort tree, or, when
  its verdict read what the nodes hold now (``WState.on_nodes``: a TAS assignment or a placement on the live
  nodes), in ``parked_on_nodes`` until such an event or any release of node room (nodes are shared by every
  cohort tree); StrictFIFO keeps the head in place and marks the queue ``blocked`` until either or a new
  arrival;
- ``memos`` are only a shortcut: each holds the verdict of a head whose fate was decided by its nomination alone,
  stamped with the epochs it was nominated at, one per shape seen at those epochs (a queue's heads alternate
  between a few shapes); the engine reuses one only while both epochs are unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .model import ClusterQueue, QueueingStrategy, WithinClusterQueue, Workload
from .quota import FR, QNode
from .results import Admission, PodPlacement

if TYPE_CHECKING:
    from .nominate import Assignment

PENDING = "pending"
ADMITTED = "admitted"

HeapEntry = tuple[int, float, int, str, int]  # (-priority, queue_ts, seq, name, version)
MERGE_AT = 16  # pushed entries a queue keeps in its heap at least before sorting them into its run
Why = tuple[str, str, tuple[str, ...]]  # a pending workload's (reason, message, workloads it waits for)


@dataclass(frozen=True, slots=True)
class Memo:
    """An inadmissible head's verdict, reusable for a head of the same shape while nothing it read changed."""

    workload: Workload
    queue_ts: float
    epochs: tuple[int, int]  # (its cohort tree's quota epoch, the nodes' epoch) when it was nominated
    assignment: Assignment  # NO_FIT, or PREEMPT without victims; never changed after
    why: Why  # the pending record it gives every head it settles (one tuple shared by all of them)
    on_nodes: bool = False  # its nomination read what the nodes hold now (see ``WState.on_nodes``)


@dataclass(slots=True, eq=False)
class WState:
    workload: Workload
    cq: str
    requests: list[dict[str, int]]  # per pod set, resource -> m-units for all pods of the set
    queue_ts: float
    status: str = PENDING
    version: int = 0
    seq: int = 0  # FIFO tie-break, kept across re-pushes so a head keeps its place (0 = not yet given)
    parked: bool = False
    # Its last verdict read what the nodes hold now (``placement.Cluster.reads`` moved while it was nominated or
    # processed): parked, it waits in ``parked_on_nodes`` for any release of node room, not only its tree's.
    on_nodes: bool = False
    preempting: bool = False  # victims were evicted for it; it goes first next cycle
    evicting: bool = False  # chosen as a victim this cycle; released at the end of the cycle
    requeue_at: float | None = None
    requeue_count: int = 0
    admitted_at: float = 0.0
    admit_seq: int = 0
    usage: dict[FR, int] = field(default_factory=dict)
    admission: Admission | None = None
    placements: tuple[PodPlacement, ...] = ()
    # Why it is pending, as its last verdict said (``Engine._set_pending``); the record a query returns is built
    # from it (``Engine._pending_at``), so settling a head costs no allocation (a memo's heads share its tuple).
    why: Why | None = None
    pod_set_usage: list[dict[FR, int]] = field(default_factory=list)  # admitted: usage per pod set
    # Elastic (elastic.py): usage and pods taken off by an in-place shrink, held until the pods are gone;
    # for a preemptor, the shrinks it waits for; the last resize time (cooldown).
    held: dict[FR, int] = field(default_factory=dict)
    held_pods: tuple[PodPlacement, ...] = ()
    # one empty set shared by every workload (a set of its own was 216 bytes a waiting workload, issue 27): a new
    # one is made for each change, which only an elastic preemption's shrinks make
    awaiting: frozenset[str] = frozenset()
    last_resize: float = float("-inf")
    replaces: str | None = None  # a Kueue scale-up slice: the admitted workload it replaces
    shape: int = 0  # the number of what a memo must match (``engine._Shapes``), for ``shape_of``
    shape_of: Workload | None = None


class CQQueue:
    __slots__ = ("spec", "node", "root", "strict", "heap", "run", "parked", "parked_on_nodes", "admitted", "blocked",
                 "waiting", "inactive", "memos", "memo_epochs", "head_epochs", "newer_equal", "_popped", "_seq")

    def __init__(self, spec: ClusterQueue, node: QNode) -> None:
        self.spec = spec
        self.node = node
        root = node
        while root.parent is not None:
            root = root.parent
        self.root = root  # its cohort tree's root (the tree is fixed for an engine's life), read every cycle
        # Preemption candidates depend on the preemptor's queue timestamp (a memo must match it too).
        self.newer_equal = spec.preemption.within_cluster_queue == WithinClusterQueue.LOWER_OR_NEWER_EQUAL_PRIORITY
        self.strict = spec.queueing_strategy == QueueingStrategy.STRICT_FIFO
        # Pending entries in two parts: ``heap``, those pushed since the last merge, and ``run``, the others
        # sorted with the next to pop last, so that popping a head (every queue, every cycle) is a list pop, not
        # a sift through a heap of everything pending (``_pop``); the heap is merged into the run once it holds
        # a quarter as many (``MERGE_AT``), and parked entries return into the run (``_back``).
        self.heap: list[HeapEntry] = []
        self.run: list[HeapEntry] = []
        self.parked: list[HeapEntry] = []  # verdicts of quota alone: back on a capacity event in the cohort tree
        self.parked_on_nodes: list[HeapEntry] = []  # verdicts that read the nodes: back on any node release too
        self.admitted: dict[str, WState] = {}
        self.blocked = False
        self.waiting: WState | None = None  # preemptor whose victims were evicted: this queue's next entry
        self.inactive = ""  # why the queue admits nothing (Kueue: an inactive ClusterQueue), or ""
        # The heads whose nomination alone made them inadmissible, latest first, one per shape, all nominated at
        # the same epochs (see ``Engine._memo_of``): a later head of one of these shapes meets the same fate
        # while the epochs hold.
        self.memos: dict[int, Memo] = {}  # by the number of the head's shape (``engine._Shapes``), oldest first
        self.memo_epochs: tuple[int, int] | None = None  # the epochs of every memo in ``memos``
        self.head_epochs: tuple[int, int] = (0, 0)  # epochs this cycle's head was nominated at
        # The entry ``pop_head`` last took, which ``park`` files as it is: a parked head allocates nothing (new
        # entries for 1,000 parked heads a cycle went to the youngest generation, which the popped ones leaving
        # the oldest kept from ever filling, so the collector met them all at once, once, ≈ 13 ms at 100k).
        self._popped: HeapEntry | None = None
        self._seq = 0

    @property
    def memo(self) -> Memo | None:
        """The latest memo, if any."""
        return next(reversed(self.memos.values())) if self.memos else None

    def push(self, ws: WState) -> None:
        if not ws.seq:
            self._seq += 1
            ws.seq = self._seq
        ws.parked = False
        heapq.heappush(self.heap, (-ws.workload.priority, ws.queue_ts, ws.seq, ws.workload.name, ws.version))

    @staticmethod
    def live(entry: HeapEntry, states: dict[str, WState]) -> WState | None:
        ws = states.get(entry[3])
        if ws is None or ws.version != entry[4] or ws.status != PENDING or ws.requeue_at is not None:
            return None
        return ws

    def _merge(self) -> None:
        """Sort the pushed entries into the run (the run is one sorted stretch already: C's sort merges it with
        the pushed ones in about their number of steps beside one pass over it)."""
        self.run.extend(self.heap)
        self.run.sort(reverse=True)
        self.heap = []

    def _first(self) -> HeapEntry | None:
        """The entry that comes first (lowest) among the run's last and the heap's top, or None."""
        heap, run = self.heap, self.run
        if run and (not heap or run[-1] < heap[0]):
            return run[-1]
        return heap[0] if heap else None

    def _pop(self) -> HeapEntry:
        """Remove and return ``_first()`` (there is one)."""
        heap, run = self.heap, self.run
        if run and (not heap or run[-1] < heap[0]):
            return run.pop()
        return heapq.heappop(heap)

    def pop_head(self, states: dict[str, WState]) -> WState | None:
        waiting, self.waiting = self.waiting, None
        if waiting is not None and waiting.status == PENDING and waiting.preempting:
            return waiting  # Kueue processes a preemptor whose victims are gone before new heads
        if self.blocked:
            return None
        if len(self.heap) >= MERGE_AT and 4 * len(self.heap) >= len(self.run):
            self._merge()
        while self.heap or self.run:
            entry = self._pop()
            ws = states.get(entry[3])  # ``live``, inline: this runs once per queue of every cycle
            if (ws is not None and ws.version == entry[4] and ws.status == PENDING and ws.requeue_at is None
                    and not ws.parked):
                self._popped = entry
                return ws
        return None

    def park(self, ws: WState) -> None:
        """BestEffortFIFO: set the head aside until capacity frees up; StrictFIFO: keep it and block."""
        if self.strict:
            self.push(ws)
            self.blocked = True
            return
        ws.parked = True
        entry = self._popped
        if entry is None or entry[3] != ws.workload.name or entry[4] != ws.version:
            entry = (-ws.workload.priority, ws.queue_ts, ws.seq, ws.workload.name, ws.version)
        (self.parked_on_nodes if ws.on_nodes else self.parked).append(entry)

    def unpark(self, states: dict[str, WState]) -> None:
        """A capacity event in the cohort tree: every parked head is back (and a StrictFIFO queue unblocked)."""
        self.blocked = False
        self._back(self.parked, states)
        self._back(self.parked_on_nodes, states)
        self.parked, self.parked_on_nodes = [], []

    def unpark_on_nodes(self, states: dict[str, WState]) -> None:
        """Node room was released in another cohort tree: the heads whose verdict read the nodes are back; a
        StrictFIFO queue is unblocked whatever its head's verdict read (it has one head, tried again)."""
        self.blocked = False
        self._back(self.parked_on_nodes, states)
        self.parked_on_nodes = []

    def _back(self, entries: list[HeapEntry], states: dict[str, WState]) -> None:
        if not entries:
            return
        for entry in entries:
            ws = states.get(entry[3])
            if ws is not None and ws.version == entry[4]:
                ws.parked = False
        self.run.extend(entries)
        self.run.sort(reverse=True)  # two sorted stretches and the parked entries, merged in about linear time

    def ordered(self, states: dict[str, WState]) -> list[WState]:
        """Pending workloads of this queue in admission order (for positions; O(n log n), on request only)."""
        seen: set[str] = set()
        out: list[tuple[HeapEntry, WState]] = []
        for entry in sorted(self.heap + self.run + self.parked + self.parked_on_nodes):
            ws = states.get(entry[3])
            if ws is None or ws.version != entry[4] or ws.status != PENDING or entry[3] in seen:
                continue
            seen.add(entry[3])
            out.append((entry, ws))
        return [ws for _, ws in out]

    def settle_empty(self, states: dict[str, WState]) -> bool:
        """Forget what only waiting workloads needed once none waits here (nothing live in any list, no
        preemptor): the stale entries lazy deletion left and the memos, a shortcut only, each holding a head that
        may have ended long ago (its Workload, assignment and reason: small objects made during the backlog,
        kept for the engine's life, up to ``engine.MEMO_SLOTS`` a queue). Decisions do not change: a stale entry is
        skipped when popped, and a head without a memo is nominated. Whether it was empty."""
        if self.waiting is not None or any(
                self.live(entry, states) is not None
                for entries in (self.heap, self.run, self.parked, self.parked_on_nodes) for entry in entries):
            return False
        self.heap, self.run, self.parked, self.parked_on_nodes = [], [], [], []
        self.memos, self.memo_epochs, self._popped = {}, None, None
        return True

    def has_active(self, states: dict[str, WState]) -> bool:
        if self.waiting is not None:
            return True
        if self.blocked:
            return False
        while (entry := self._first()) is not None:
            ws = self.live(entry, states)
            if ws is not None and not ws.parked:
                return True
            self._pop()
        return False
