"""Elastic workloads: Kueue's workload slices (ElasticJobsViaWorkloadSlices) and taugrid's resizing on top.

Role: the size changes of an admitted workload, as pure functions over the engine's state.
- *Scale-up slice* (Kueue): a workload with ``replaces`` is a new slice of an admitted one; it is charged only the
  pods it adds, on the flavors the old slice has (``original_flavors``), it may preempt others but never its own
  old slice, and on admission it takes the old slice's usage and pods and the old slice is finished (Kueue's
  ``WorkloadSliceReplaced``).
- *In-place shrink* (Kueue's scale-down, ``shrink``): the resizable pod set's count drops at once (nothing new is
  charged for the removed pods) but their quota and node room stay held until ``release_removed`` says the pods
  are gone, so nothing else is admitted onto capacity still in use (Kueue issue #15661).
- *Shrink for a preemptor* (taugrid; Kueue #975, KAI's semi-preemptible ``minMember``): among a preemptor's
  classical targets, an elastic workload above its minimum is shrunk instead of evicted, only as far as needed;
  non-elastic targets are put back when the shrinks suffice. The preemptor waits until the pods are gone.
- *Growth* (taugrid): after the heads of a cycle, an elastic workload below its maximum whose cooldown has passed
  grows by a slice of ``step`` pods if the slice fits free quota and nodes without preemption and its cohort tree
  has no active pending head (of any priority) and no preemptor waiting for shrinks (with nodes, any such head
  anywhere stops all growth: nodes are shared); candidates go by priority, then dominant resource share (fair
  sharing), then age.

Invariant: ``ws.usage`` is always what the tree is charged for the workload (held quota included).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import msgspec

from taugrid.core.errors import PermanentError

from . import results as R
from .fairshare import drs
from .model import ResourceFlavor, Workload, from_units
from .nominate import Mode
from .queues import ADMITTED, PENDING, WState
from .quota import FR, QNode

if TYPE_CHECKING:
    from .nominate import Assignment
    from .placement import Cluster
    from .queues import CQQueue
    from .quota import QuotaTree
    from .victims import Target


class Engine(Protocol):
    """What these functions use of ``engine.Engine`` (a protocol, so the engine can import this module)."""

    states: dict[str, WState]
    queues: dict[str, CQQueue]
    tree: QuotaTree
    cluster: Cluster | None
    flavors: dict[str, ResourceFlavor]
    fair_sharing: bool
    _elastic: set[str]  # names of elastic workloads admitted at some point (growth candidates)

    def quota_taken(self, q: CQQueue) -> None: ...
    def _requests(self, workload: Workload) -> list[dict[str, int]]: ...
    def _nominate(self, ws: WState, q: CQQueue) -> Assignment: ...
    def _capacity_event(self, q: CQQueue) -> None: ...


def with_counts(w: Workload, counts: list[int], name: str | None = None) -> Workload:
    pod_sets = tuple(dataclasses.replace(ps, count=c) for ps, c in zip(w.pod_sets, counts, strict=True))
    return dataclasses.replace(w, pod_sets=pod_sets, name=name or w.name)


def counts_of(w: Workload) -> list[int]:
    return [ps.count for ps in w.pod_sets]


def replaced_slice(engine: Engine, w: Workload, cq: str) -> WState | None:
    """Kueue ``ReplacedWorkloadSlice``: the admitted workload of the same ClusterQueue this slice replaces."""
    if w.replaces is None:
        return None
    old = engine.states.get(w.replaces)
    if old is None or old.status != ADMITTED or old.cq != cq:
        return None
    if [ps.name for ps in old.workload.pod_sets] != [ps.name for ps in w.pod_sets]:
        raise PermanentError(f"workload {w.name}: its pod sets {[ps.name for ps in w.pod_sets]} differ from those "
                             f"of {old.workload.name}, which it replaces; a slice keeps the pod sets")
    return old


def delta_workload(ws: WState, engine: Engine) -> Workload:
    """What a slice adds: its pod counts minus the old slice's (the pods to place)."""
    old = engine.states.get(ws.replaces or "")
    if old is None:
        return ws.workload
    return with_counts(ws.workload, [max(0, n - o) for n, o in zip(counts_of(ws.workload), counts_of(old.workload),
                                                                     strict=True)])


def original_flavors(old: WState) -> dict[tuple[str, str], str]:
    assert old.admission is not None
    return {(p.name, r): f for p in old.admission.pod_sets for r, f in p.flavors.items()}


def per_pod(ws: WState, i: int) -> dict[FR, int]:
    count = ws.workload.pod_sets[i].count
    return {fr: v // count for fr, v in ws.pod_set_usage[i].items()} if count else {}


def _sorted(pl: list[R.PodPlacement], w: Workload) -> tuple[R.PodPlacement, ...]:
    order = {ps.name: i for i, ps in enumerate(w.pod_sets)}
    return tuple(sorted(pl, key=lambda p: (order[p.pod_set], p.index)))


def _readopt(engine: Engine, name: str, w: Workload, placements: tuple[R.PodPlacement, ...]) -> None:
    """Give the named allocation exactly these pods (they keep their nodes and devices)."""
    if engine.cluster is None or not placements:
        return
    engine.cluster.release(name)
    got = engine.cluster.adopt(w, [p.gpus for p in placements], [p.node for p in placements])
    assert not isinstance(got, str), got


def _readmit(ws: WState, placements: tuple[R.PodPlacement, ...], replaced: str = "") -> None:
    """Rewrite the admission for the workload's current counts and usage."""
    assert ws.admission is not None
    pod_sets = tuple(msgspec.structs.replace(
        p, count=ps.count,
        resource_usage={fr[1]: from_units(v) for fr, v in ws.pod_set_usage[i].items()})
        for i, (p, ps) in enumerate(zip(ws.admission.pod_sets, ws.workload.pod_sets, strict=True)))
    ws.admission = msgspec.structs.replace(ws.admission, workload=ws.workload.name, pod_sets=pod_sets,
                                           placements=placements, replaced=replaced or ws.admission.replaced)
    ws.placements = placements


def _retopology(engine: Engine, ws: WState) -> None:
    """A resized TAS workload's topology assignment: rebuilt from the nodes its pods are on."""
    if engine.cluster is None or ws.admission is None or not ws.admission.topology_assignments:
        return
    flv = [dict(p.flavors) for p in ws.admission.pod_sets]
    topo = engine.cluster.topology_of(ws.workload, flv, engine.flavors, ws.placements)
    ws.admission = msgspec.structs.replace(ws.admission, topology_assignments=dict(topo))


def merge_slice(engine: Engine, new: WState, q: CQQueue) -> None:
    """Kueue: the admitted slice replaces the old one. ``new`` was charged only the pods it adds; it takes the
    old slice's usage and pods, and the old slice is finished."""
    old = engine.states.get(new.replaces or "")
    if old is None:
        return
    old_counts = counts_of(old.workload)
    new.usage = {fr: old.usage.get(fr, 0) + new.usage.get(fr, 0) for fr in set(old.usage) | set(new.usage)}
    new.pod_set_usage = [{fr: a.get(fr, 0) + b.get(fr, 0) for fr in set(a) | set(b)}
                         for a, b in zip(old.pod_set_usage, new.pod_set_usage, strict=True)]
    new.held, new.held_pods = old.held, old.held_pods
    moved = [msgspec.structs.replace(p, index=p.index + old_counts[i])
             for p in new.placements for i, ps in enumerate(new.workload.pod_sets) if ps.name == p.pod_set]
    placements = _sorted(list(old.placements) + moved, new.workload)
    if engine.cluster is not None:
        engine.cluster.release(old.workload.name)
        _readopt(engine, new.workload.name, new.workload, placements)
    q.admitted.pop(old.workload.name, None)
    old.status, old.usage = "finished", {}
    old.version += 1
    del engine.states[old.workload.name]
    new.replaces = None
    new.requests = engine._requests(new.workload)  # it was charged the delta; from now on it holds the whole
    new.last_resize = new.admitted_at
    _readmit(new, placements, replaced=old.workload.name)
    _retopology(engine, new)


def shrink(engine: Engine, ws: WState, count: int, now: float, cause: str, preemptor: str = "") -> R.Resize:
    """Kueue's in-place scale-down of the resizable pod set to ``count``; the removed pods' quota and node room
    stay held until ``release_removed``."""
    w = ws.workload
    i = w.elastic_index()
    if ws.status != ADMITTED or i is None or w.elastic is None:
        raise PermanentError(f"workload {w.name} is not an admitted elastic workload; only those shrink in place")
    ps = w.pod_sets[i]
    if not w.elastic.min_count <= count < ps.count:
        raise PermanentError(f"workload {w.name}: cannot shrink pod set {ps.name} from {ps.count} to {count}; use "
                             f"{w.elastic.min_count} <= count < {ps.count}")
    one = per_pod(ws, i)
    gone = ps.count - count
    removed = tuple(p for p in ws.placements if p.pod_set == ps.name and p.index >= count)
    ws.held = {fr: ws.held.get(fr, 0) + v * gone for fr, v in one.items()} | {
        fr: v for fr, v in ws.held.items() if fr not in one}
    ws.held_pods = ws.held_pods + removed
    ws.pod_set_usage[i] = {fr: v - one.get(fr, 0) * gone for fr, v in ws.pod_set_usage[i].items()}
    counts = counts_of(w)
    counts[i] = count
    ws.workload = with_counts(w, counts)
    ws.requests = engine._requests(ws.workload)
    ws.last_resize = now
    kept = tuple(p for p in ws.placements if not (p.pod_set == ps.name and p.index >= count))
    _readmit(ws, kept)
    _retopology(engine, ws)
    return R.Resize(workload=w.name, cluster_queue=ws.cq, pod_set=ps.name, old_count=ps.count, new_count=count,
                    cause=cause, preemptor=preemptor, placements=removed, at=now)


def release_removed(engine: Engine, ws: WState) -> None:
    """The pods a shrink removed are gone: their quota and node room are free (a capacity event)."""
    if not ws.held and not ws.held_pods:
        return
    q = engine.queues[ws.cq]
    engine.tree.charge(q.node, ws.held, -1)
    ws.usage = {fr: v - ws.held.get(fr, 0) for fr, v in ws.usage.items() if v - ws.held.get(fr, 0)}
    ws.held, ws.held_pods = {}, ()
    _readopt(engine, ws.workload.name, ws.workload, ws.placements)
    engine._capacity_event(q)
    notify_released(engine, ws.workload.name)


def notify_released(engine: Engine, name: str) -> None:
    """Preemptors waiting on this workload's shrink may go again (first in their queue)."""
    for other in engine.states.values():  # in submission order (an event, not every cycle: O(pending) is fine)
        if name in other.awaiting:
            other.awaiting -= {name}
            if not other.awaiting and other.status == PENDING:
                engine.queues[other.cq].waiting = other


def _surplus(ws: WState, count: int) -> dict[FR, int]:
    i = ws.workload.elastic_index()
    assert i is not None
    gone = ws.workload.pod_sets[i].count - count
    return {fr: v * gone for fr, v in per_pod(ws, i).items()}


def shrinkable(ws: WState) -> bool:
    w = ws.workload
    i = w.elastic_index()
    return (i is not None and w.elastic is not None and ws.status == ADMITTED and not ws.evicting
            and w.pod_sets[i].count > w.elastic.min_count)


class _Shrunk:
    """Temporarily take surplus pods off the ledger and nodes (to ask whether a preemptor fits)."""

    def __init__(self, engine: Engine, ws: WState, count: int) -> None:
        self.engine, self.ws, self.count = engine, ws, count
        self.usage = _surplus(ws, count)
        self.saved: list[tuple[int, int, int, tuple[tuple[int, int], ...]]] = []

    def __enter__(self) -> _Shrunk:
        e, ws = self.engine, self.ws
        e.tree.charge(e.queues[ws.cq].node, self.usage, -1)
        if e.cluster is not None and ws.placements:
            i = ws.workload.elastic_index()
            assert i is not None
            name = ws.workload.pod_sets[i].name
            kept = tuple(p for p in ws.placements if not (p.pod_set == name and p.index >= self.count))
            counts = counts_of(ws.workload)
            counts[i] = self.count
            self.saved = e.cluster.release(ws.workload.name)
            got = e.cluster.adopt(with_counts(ws.workload, counts), [p.gpus for p in kept], [p.node for p in kept])
            assert not isinstance(got, str), got
        return self

    def __exit__(self, *exc: object) -> None:
        e, ws = self.engine, self.ws
        e.tree.charge(e.queues[ws.cq].node, self.usage, +1)
        if e.cluster is not None and ws.placements:
            e.cluster.release(ws.workload.name)
            e.cluster.restore(ws.workload.name, self.saved)


def shrink_plan(engine: Engine, preemptor: WState, fits: object, targets: list[Target]
                ) -> tuple[list[Target], list[tuple[WState, int]]] | None:
    """Replace evictions of elastic targets by shrinks, as small as the preemptor needs: returns the targets
    still evicted and (workload, new count) shrinks, or None when shrinking cannot make room.

    ``fits(evicted)`` answers whether the preemptor fits with those targets removed (and the current ledger)."""
    assert callable(fits)
    elastic = [t for t in targets if shrinkable(engine.states[t.name])]
    if not elastic:
        return None
    rest = [t for t in targets if t not in elastic]
    counts = {t.name: engine.states[t.name].workload.elastic.min_count for t in elastic}  # type: ignore[union-attr]

    def fits_with(evicted: list[Target], sizes: dict[str, int]) -> bool:
        stack = [_Shrunk(engine, engine.states[n], c) for n, c in sizes.items()
                 if c < engine.states[n].workload.pod_sets[engine.states[n].workload.elastic_index() or 0].count]
        for s in stack:
            s.__enter__()
        try:
            return bool(fits(evicted))
        finally:
            for s in reversed(stack):
                s.__exit__()

    if not fits_with(rest, counts):
        return None
    for t in list(reversed(rest)):  # put back whole workloads the shrinks make unnecessary
        trial = [x for x in rest if x is not t]
        if fits_with(trial, counts):
            rest = trial
    for t in reversed(elastic):  # then shrink each as little as needed (whole steps of one pod)
        ws = engine.states[t.name]
        i = ws.workload.elastic_index()
        assert i is not None
        full = ws.workload.pod_sets[i].count
        while counts[t.name] < full:
            trial_sizes = {**counts, t.name: counts[t.name] + 1}
            if not fits_with(rest, trial_sizes):
                break
            counts = trial_sizes
    shrinks = [(engine.states[t.name], counts[t.name]) for t in elastic
               if counts[t.name] < engine.states[t.name].workload.pod_sets[
                   engine.states[t.name].workload.elastic_index() or 0].count]
    return rest, shrinks


def grow(engine: Engine, now: float, busy_roots: set[QNode]) -> list[R.Resize]:
    """Grow elastic workloads into free capacity (see the module docstring); ``busy_roots``: cohort trees that
    still have an active pending head (growth leaves their capacity to it)."""
    cands: list[WState] = []
    for ws in [engine.states[n] for n in engine._elastic if n in engine.states]:  # not every pending run
        w = ws.workload
        i = w.elastic_index()
        if (i is None or w.elastic is None or ws.status != ADMITTED or ws.evicting or ws.held
                or now - ws.last_resize < w.elastic.cooldown_s):
            continue
        high = w.elastic.max_count
        if high is None or w.pod_sets[i].count >= high:
            continue
        if engine.tree.root(engine.queues[ws.cq].node) in busy_roots:
            continue
        cands.append(ws)
    if engine.fair_sharing:
        cands.sort(key=lambda ws: (-ws.workload.priority, drs(engine.tree, engine.queues[ws.cq].node, {}),
                                   ws.admitted_at, ws.workload.name))
    else:
        cands.sort(key=lambda ws: (-ws.workload.priority, ws.admitted_at, ws.workload.name))
    out: list[R.Resize] = []
    for ws in cands:
        r = _grow_one(engine, ws, now)
        if r is not None:
            out.append(r)
    return out


def _grow_one(engine: Engine, ws: WState, now: float) -> R.Resize | None:
    w = ws.workload
    i = w.elastic_index()
    assert i is not None and w.elastic is not None and w.elastic.max_count is not None
    old = w.pod_sets[i].count
    new = min(w.elastic.max_count, old + w.elastic.step)
    counts = counts_of(w)
    counts[i] = new
    slice_w = dataclasses.replace(with_counts(w, counts, name=f"{w.name}\0slice"), replaces=w.name)
    s = WState(slice_w, ws.cq, [], queue_ts=now, replaces=w.name)
    q = engine.queues[ws.cq]
    s.requests = slice_requests(engine, slice_w, ws)
    a = engine._nominate(s, q)
    if a.mode != Mode.FIT:
        return None
    placements: tuple[R.PodPlacement, ...] = ()
    delta = with_counts(w, [c - o for c, o in zip(counts, counts_of(w), strict=True)], name=slice_w.name)
    if engine.cluster is not None:
        placed = engine.cluster.place(delta, [p.flavors for p in a.pod_sets], engine.flavors, commit=True)
        if isinstance(placed, str):
            return None
        engine.cluster.release(slice_w.name)
        placements = tuple(msgspec.structs.replace(p, index=p.index + old) for p in placed
                           if p.pod_set == w.pod_sets[i].name)
    engine.tree.charge(q.node, a.usage)
    engine.quota_taken(q)
    ws.usage = {fr: ws.usage.get(fr, 0) + a.usage.get(fr, 0) for fr in set(ws.usage) | set(a.usage)}
    for p, psa in zip(range(len(w.pod_sets)), a.pod_sets, strict=True):
        ws.pod_set_usage[p] = {fr: ws.pod_set_usage[p].get(fr, 0) + psa.usage.get(fr, 0)
                               for fr in set(ws.pod_set_usage[p]) | set(psa.usage)}
    ws.workload = with_counts(w, counts)
    ws.requests = engine._requests(ws.workload)
    ws.last_resize = now
    full = _sorted(list(ws.placements) + list(placements), ws.workload)
    _readopt(engine, w.name, ws.workload, full)
    _readmit(ws, full)
    _retopology(engine, ws)
    return R.Resize(workload=w.name, cluster_queue=ws.cq, pod_set=w.pod_sets[i].name, old_count=old,
                    new_count=new, cause=R.GROWN, placements=placements, at=now)


def slice_requests(engine: Engine, w: Workload, old: WState) -> list[dict[str, int]]:
    """Kueue's flavor assigner for a slice: each pod set requests its total minus the old slice's (never below
    zero; a resource asked for with 0 still gets a flavor)."""
    return [{r: max(0, v - before.get(r, 0)) for r, v in now.items()}
            for now, before in zip(engine._requests(w), old.requests, strict=True)]
