"""Kueue's TAS domain tree of one flavor, and how many pods, slices and leaders fit in each domain.

Role: build the tree from the nodes' labels (one level per ``Topology.levels`` key, highest first; a leaf is a
node when the lowest level is ``kubernetes.io/hostname``, else the group of nodes sharing all level values),
then for one pod set fill each domain's counts from the free capacity the caller reports (Kueue's
``fillInCounts``): ``pods`` that fit, ``slices`` (whole groups of ``slice_size`` pods at the slice level, summed
above it), and with a leader pod set (Kueue's pod-set groups) whether a domain can take the leader and how many
workers still fit beside it (``pods_wl``/``slices_wl``).

Invariants: the tree changes only with the set of usable nodes (the caller keeps it); counts are reset on every
fill, to what counting every leaf afresh gives: given the caller's log of changed nodes, the tree keeps each
demand shape's counts and recounts only the leaves of nodes changed since and their ancestors; each kept shape
has its own domain objects (a ``_View``), so a fill rewrites only the domains recounted or changed by the last
search of that shape, not every domain when the shape differs from the last fill's; only leaves that are nodes
check taints and the node selector, as Kueue does; a pod set's excluded nodes (taugrid's retries) count as
absent at every level.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Taint, Toleration, Topology, untolerated
from .results import TopologyAssignment

HOSTNAME = "kubernetes.io/hostname"
PODS = "pods"  # one per pod, as Kueue adds to every request; a node without a pod limit has plenty
Free = Callable[[int], Mapping[str, int]]  # node index -> free capacity per resource (units, ``pods`` too)
Vals = tuple[int, int, int, int, int]  # a domain's (pods, slices, leader, pods_wl, slices_wl)
_ZERO: Vals = (0, 0, 0, 0, 0)
MAX_SHAPES = 64  # demand shapes whose counts a tree keeps (few request shapes in practice); more: start over
MAX_LOG = 1 << 14  # node changes logged before the log starts over (every kept count is then redone once)
MAX_VIEW_DOMAINS = 1 << 18  # domain objects the kept shapes' own views may hold in all (beyond: the shared view)


@dataclass(frozen=True, slots=True)
class TasNode:
    """A node as TAS sees it: its index in the caller's node list, labels and taints (what is free is asked
    through a ``Free`` callback at each placement: it changes, the tree does not)."""

    index: int
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]


@dataclass(slots=True, eq=False)
class Domain:
    values: tuple[str, ...]
    id: int = 0  # position in ``TasTree.domains``
    parent: Domain | None = None
    children: list[Domain] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # leaves only
    pods: int = 0
    slices: int = 0
    leader: int = 0  # 1 when the leader fits here
    pods_wl: int = 0  # pods that still fit with the leader here
    slices_wl: int = 0


@dataclass(slots=True)
class Stats:
    """Kueue's exclusion counts, appended to a not-fit message."""

    total: int = 0
    selector: int = 0
    taints: dict[str, int] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not (self.selector or self.taints or self.resources):
            return ""
        reasons = [f"nodeSelector: {self.selector}"] if self.selector else []
        reasons += [f'taint "{k}": {v}' for k, v in self.taints.items()]
        reasons += [f'resource "{k}": {v}' for k, v in self.resources.items()]
        return f". Total nodes: {self.total}; excluded: {', '.join(sorted(reasons))}"


@dataclass(slots=True)
class NodeChanges:
    """The nodes whose free capacity changed, in order: their owner (``placement.Cluster``) records each change,
    a tree's kept counts remember how far they have read. The log starts over (``generation``) when long."""

    log: list[int] = field(default_factory=list)
    generation: int = 0

    def touch(self, node: int) -> None:
        if len(self.log) >= MAX_LOG:
            self.log.clear()
            self.generation += 1
        self.log.append(node)


@dataclass(slots=True)
class Counts:
    """One demand shape's counts on a tree: per domain id its values, per leaf id the resource that leaves
    it no pod, the shape's static exclusions (taints, selector, totals) and the limiting-resource tally."""

    vals: list[Vals]
    limiting: dict[int, str]
    static: Stats
    resources: dict[str, int]
    generation: int = 0
    seen: int = 0  # how much of the change log these counts have taken in
    recounted: list[int] = field(default_factory=list)  # domain ids recounted since these counts were loaded
    view: _View | None = None  # this shape's own domain objects, when kept


@dataclass(slots=True, eq=False)
class _View:
    """Domain objects a search reads and rewrites: the tree's own (shared by counts not kept) or one set per kept
    demand shape. ``counts``: the counts they hold, but for ``altered`` (rewritten by a search since) and the
    counts' ``recounted`` domains."""

    domains: list[Domain]
    per_level: list[dict[tuple[str, ...], Domain]]
    altered: set[Domain] = field(default_factory=set)
    counts: Counts | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    """What one fill counts: a pod's requests (and the leader's), where it may go, and the slice shape."""

    per_pod: Mapping[str, int]
    leader_per_pod: Mapping[str, int] | None
    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    slice_size: int
    slice_idx: int
    excluded: frozenset[str] = frozenset()  # node names this pod set must avoid (a retry's excluded nodes)


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


class _Shape:
    """A demand's requests as (resource, amount) pairs, ``pods`` included, and its node selector."""

    __slots__ = ("per_pod", "leader", "selector")

    def __init__(self, demand: Demand) -> None:
        self.per_pod = [(r, v) for r, v in {**demand.per_pod, PODS: 1}.items() if v > 0]
        self.leader = ([(r, v) for r, v in {**demand.leader_per_pod, PODS: 1}.items() if v > 0]
                       if demand.leader_per_pod is not None else None)
        self.selector = list(demand.node_selector.items())


def _combine(d: Domain, vals: Sequence[Vals], demand: Demand) -> Vals:
    """Kueue ``fillInCountsHelper``: a parent sums its children; with a leader, the workers beside it are
    the sum less the smallest loss among the children that could take it."""
    with_leader = demand.leader_per_pod is not None
    pods = slices = leader = 0
    min_pods = min_slices = 1 << 40
    contributes = False
    for c in d.children:
        c_pods, c_slices, c_leader, c_pods_wl, c_slices_wl = vals[c.id]
        pods += c_pods
        slices += c_slices
        if not with_leader or c_leader > 0:
            contributes = True
            min_pods = min(min_pods, c_pods - c_pods_wl)
            min_slices = min(min_slices, c_slices - c_slices_wl)
        leader = max(leader, c_leader)
    if not contributes:
        return pods, slices, leader, 0, 0
    return pods, slices, leader, pods - min_pods, slices - min_slices


def _sliced(v: Vals, level: int, demand: Demand) -> Vals:
    """At the slice level a domain's slices are its whole groups of ``slice_size`` pods."""
    if level != demand.slice_idx:
        return v
    return v[0], v[0] // demand.slice_size, v[2], v[3], v[3] // demand.slice_size


def _count_in(free: Mapping[str, int], per_pod: Sequence[tuple[str, int]]) -> tuple[int, str]:
    count, limiting = 1 << 40, ""
    for r, v in per_pod:
        n = free.get(r, 0) // v
        if n < count:
            count, limiting = n, r
    return max(count, 0), limiting


class TasTree:
    """The domain tree of one TAS flavor over its usable nodes."""

    def __init__(self, topology: Topology, nodes: Sequence[TasNode]) -> None:
        self.name = topology.name
        self.levels = topology.levels
        self.by_node = self.levels[-1] == HOSTNAME
        self.per_level: list[dict[tuple[str, ...], Domain]] = [{} for _ in self.levels]
        self.nodes = {n.index: n for n in nodes}
        for n in nodes:
            values = tuple(n.labels.get(k) for k in self.levels)
            if any(v is None for v in values):
                continue  # Kueue: a node without every level label is not part of the topology
            key = tuple(v for v in values if v is not None)
            leaf = self.per_level[-1].get(key) or self._domain(key)
            leaf.nodes.append(n.index)
        self.roots = list(self.per_level[0].values())
        self.domains = [d for level in self.per_level for d in level.values()]
        for i, d in enumerate(self.domains):
            d.id = i
        self.leaves = list(self.per_level[-1].values())
        self._leaf_of = {ni: leaf.id for leaf in self.leaves for ni in leaf.nodes}
        self._node_set = frozenset(self.nodes)
        self._names = frozenset(n.name for n in nodes)
        self._cache: dict[Hashable, Counts] = {}  # demand shape -> its counts, brought up to date on each fill
        # The structure (``leaves``, ``_base``'s domains) is what counting walks; ``domains``/``per_level`` are
        # the view last filled, what the search reads, and ``altered`` the domains a search has rewritten in it
        # (it adds every domain it may change): the next fill of that view rewrites only those and the recounted.
        self._base = _View(self.domains, self.per_level)
        self._view_domains = 0  # domain objects held by kept shapes' own views
        self.altered: set[Domain] = self._base.altered

    def _domain(self, values: tuple[str, ...]) -> Domain:
        d = Domain(values)
        self.per_level[len(values) - 1][values] = d
        if len(values) > 1:
            parent = self.per_level[len(values) - 2].get(values[:-1]) or self._domain(values[:-1])
            d.parent = parent
            parent.children.append(d)
        return d

    def fill(self, demand: Demand, assumed: Mapping[int, Mapping[str, int]], free_of: Free, stats: Stats,
             changes: NodeChanges | None = None, source: Hashable = None) -> None:
        """Kueue ``fillInCounts``: every domain's pods, slices and leader counts for this demand.

        With ``changes`` (the log of nodes whose free capacity ``free_of`` reports differently since), the
        counts of this demand shape and ``source`` (what ``free_of`` measures) are kept between fills and only
        the leaves of changed nodes and their ancestors are counted again; a fill that sees another pod set's
        assumed usage or excluded nodes of this tree counts everything afresh."""
        if (changes is None or (assumed and not self._node_set.isdisjoint(assumed.keys()))
                or (demand.excluded and not self._names.isdisjoint(demand.excluded))):
            counts = self.count_all(demand, assumed, free_of)
        else:
            counts = self._counted(demand, free_of, changes, source)
            if counts.view is None and self._view_domains + len(self.domains) <= MAX_VIEW_DOMAINS:
                counts.view = self._clone()
                self._view_domains += len(self.domains)
        self._load(counts.view or self._base, counts)
        stats.total += counts.static.total
        stats.selector += counts.static.selector
        for k, n in counts.static.taints.items():
            stats.taints[k] = stats.taints.get(k, 0) + n
        for k, n in counts.resources.items():
            if n:
                stats.resources[k] = stats.resources.get(k, 0) + n

    def _load(self, view: _View, counts: Counts) -> None:
        """Put ``counts`` in ``view``'s domains and make it the view the search reads."""
        vals = counts.vals
        if view.counts is counts:  # the domains hold these counts but for what changed since
            view.altered.update(view.domains[i] for i in counts.recounted)
            for d in view.altered:
                d.pods, d.slices, d.leader, d.pods_wl, d.slices_wl = vals[d.id]
        else:
            for d, v in zip(view.domains, vals, strict=True):
                d.pods, d.slices, d.leader, d.pods_wl, d.slices_wl = v
        view.counts, counts.recounted = counts, []
        view.altered.clear()
        self.domains, self.per_level, self.altered = view.domains, view.per_level, view.altered

    def _clone(self) -> _View:
        """A copy of the domain structure (values, ids, links, nodes) with counts still to load."""
        base = self._base.domains
        copies = [Domain(d.values, d.id, nodes=d.nodes) for d in base]
        for d, c in zip(base, copies, strict=True):
            if d.parent is not None:
                c.parent = copies[d.parent.id]
            c.children = [copies[x.id] for x in d.children]
        return _View(copies, [{k: copies[d.id] for k, d in level.items()} for level in self._base.per_level])

    def _counted(self, demand: Demand, free_of: Free, changes: NodeChanges, source: Hashable) -> Counts:
        key = (tuple(sorted(demand.per_pod.items())),
               None if demand.leader_per_pod is None else tuple(sorted(demand.leader_per_pod.items())),
               tuple(sorted(demand.node_selector.items())), demand.tolerations, demand.slice_size,
               demand.slice_idx, source)
        counts = self._cache.get(key)
        if counts is None or counts.generation != changes.generation:
            if len(self._cache) >= MAX_SHAPES:
                self._cache.clear()
                self._view_domains = 0
            view = counts.view if counts is not None else None
            counts = self._cache[key] = self.count_all(demand, {}, free_of)
            counts.view = view  # its domains are loaded afresh (their ``counts`` is not these)
        else:
            touched = {self._leaf_of[ni] for ni in changes.log[counts.seen:] if ni in self._leaf_of}
            if len(touched) * 2 > len(self.leaves):
                view = counts.view
                counts = self._cache[key] = self.count_all(demand, {}, free_of)
                counts.view = view
            elif touched:
                self._recount(counts, touched, demand, free_of)
        counts.generation, counts.seen = changes.generation, len(changes.log)
        return counts

    def count_all(self, demand: Demand, assumed: Mapping[int, Mapping[str, int]], free_of: Free) -> Counts:
        """Every leaf counted from ``free_of`` and every domain summed: what a fill without memory computes."""
        vals = [_ZERO] * len(self.domains)
        counts = Counts(vals, {}, Stats(), {})
        shape = _Shape(demand)
        for leaf in self.leaves:
            v, limiting = self._leaf(leaf, demand, shape, assumed, free_of, counts.static)
            vals[leaf.id] = _sliced(v, len(self.levels) - 1, demand)
            if limiting:
                counts.limiting[leaf.id] = limiting
                counts.resources[limiting] = counts.resources.get(limiting, 0) + 1
        for idx in range(len(self.levels) - 2, -1, -1):
            for d in self._base.per_level[idx].values():
                vals[d.id] = _sliced(_combine(d, vals, demand), idx, demand)
        return counts

    def _recount(self, counts: Counts, touched: set[int], demand: Demand, free_of: Free) -> None:
        """Count the touched leaves again and re-sum their ancestors, lowest level first. Without a leader a
        domain's counts are sums (``pods_wl``/``slices_wl`` equal ``pods``/``slices``; slices are redone from the
        pods at the slice level), so each touched leaf's change is added up its ancestors instead."""
        vals, scratch, shape = counts.vals, Stats(), _Shape(demand)
        additive = demand.leader_per_pod is None
        last = len(self.levels) - 1
        dirty: set[Domain] = set()
        for lid in touched:
            leaf = self._base.domains[lid]
            v, limiting = self._leaf(leaf, demand, shape, {}, free_of, scratch)  # static stats are kept
            new, was = _sliced(v, last, demand), vals[lid]
            vals[lid] = new
            counts.recounted.append(lid)
            old = counts.limiting.pop(lid, "")
            if old:
                counts.resources[old] -= 1
            if limiting:
                counts.limiting[lid] = limiting
                counts.resources[limiting] = counts.resources.get(limiting, 0) + 1
            if additive:
                self._add_up(counts, leaf, new[0] - was[0], new[1] - was[1], demand)
            elif leaf.parent is not None:
                dirty.add(leaf.parent)
        for idx in range(len(self.levels) - 2, -1, -1):
            above: set[Domain] = set()
            for d in dirty:
                vals[d.id] = _sliced(_combine(d, vals, demand), idx, demand)
                counts.recounted.append(d.id)
                if d.parent is not None:
                    above.add(d.parent)
            dirty = above

    def _add_up(self, counts: Counts, leaf: Domain, pods: int, slices: int, demand: Demand) -> None:
        """Add a leaf's change of pods and slices to its ancestors (a demand without a leader)."""
        vals = counts.vals
        d, idx = leaf.parent, len(self.levels) - 2
        while d is not None and (pods or slices):
            p, sl = vals[d.id][0] + pods, vals[d.id][1] + slices
            if idx == demand.slice_idx:
                whole = p // demand.slice_size
                slices, sl = whole - vals[d.id][1], whole
            vals[d.id] = (p, sl, 0, p, sl)
            counts.recounted.append(d.id)
            d, idx = d.parent, idx - 1

    def _leaf(self, leaf: Domain, demand: Demand, shape: _Shape, assumed: Mapping[int, Mapping[str, int]],
              free_of: Free, stats: Stats) -> tuple[Vals, str]:
        """One leaf's (pods, 0, leader, pods_wl, 0) and the resource that leaves it no pod ("" otherwise)."""
        free: dict[str, int] | None = None
        for ni in leaf.nodes:
            node = self.nodes[ni]
            if node.name in demand.excluded:
                continue  # not a candidate at all, as if absent from the topology (not counted in stats)
            if self.by_node:  # Kueue checks taints and the node selector only when leaves are nodes
                stats.total += 1
                taint = untolerated(node.taints, demand.tolerations) if node.taints else None
                if taint is not None:
                    text = _taint_text(taint)
                    stats.taints[text] = stats.taints.get(text, 0) + 1
                    continue
                if shape.selector and any(node.labels.get(k) != v for k, v in shape.selector):
                    stats.selector += 1
                    continue
            here, used = free_of(ni), assumed.get(ni)
            here = {r: v - used.get(r, 0) for r, v in here.items()} if used else dict(here)
            # Several nodes in one leaf (a rack as the lowest level): their capacity adds up.
            free = here if free is None else {r: free.get(r, 0) + here.get(r, 0) for r in free.keys() | here.keys()}
        if not self.by_node:
            stats.total += 1  # Kueue counts leaves here, not nodes
        if free is None:
            return _ZERO, ""
        pods, limiting = _count_in(free, shape.per_pod)
        leader = 0
        if shape.leader is not None and _count_in(free, shape.leader)[0] > 0:
            leader = 1
            for r, v in shape.leader:
                free[r] = free.get(r, 0) - v
        return (pods, 0, leader, _count_in(free, shape.per_pod)[0], 0), limiting if pods == 0 else ""

    def assignment(self, chosen: Sequence[tuple[tuple[str, ...], int]]) -> TopologyAssignment:
        """Kueue's ``topologyAssignment``: only the hostname when the lowest level is the node."""
        start = len(self.levels) - 1 if self.by_node else 0
        return TopologyAssignment(levels=self.levels[start:],
                                  domains=tuple((values[start:], n) for values, n in chosen))
