"""Kueue's TAS domain tree of one flavor, and how many pods, slices and leaders fit in each domain.

Role: build the tree from the nodes' labels (one level per ``Topology.levels`` key, highest first; a leaf is a
node when the lowest level is ``kubernetes.io/hostname``, else the group of nodes sharing all level values),
then for one pod set fill each domain's counts from the free capacity the caller reports (Kueue's
``fillInCounts``): ``pods`` that fit, ``slices`` (whole groups of ``slice_size`` pods at the slice level, summed
above it), and with a leader pod set (Kueue's pod-set groups) whether a domain can take the leader and how many
workers still fit beside it (``pods_wl``/``slices_wl``).

Invariants: the tree changes only with the set of usable nodes (the caller keeps it); counts are reset on every
fill; only leaves that are nodes check taints and the node selector, as Kueue does; a pod set's excluded
nodes (taugrid's retries) count as absent at every level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Taint, Toleration, Topology, untolerated
from .results import TopologyAssignment

HOSTNAME = "kubernetes.io/hostname"
PODS = "pods"  # one per pod, as Kueue adds to every request; a node without a pod limit has plenty
Free = Callable[[int], Mapping[str, int]]  # node index -> free capacity per resource (units, ``pods`` too)


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

    def _domain(self, values: tuple[str, ...]) -> Domain:
        d = Domain(values)
        self.per_level[len(values) - 1][values] = d
        if len(values) > 1:
            parent = self.per_level[len(values) - 2].get(values[:-1]) or self._domain(values[:-1])
            d.parent = parent
            parent.children.append(d)
        return d

    def fill(self, demand: Demand, assumed: Mapping[int, Mapping[str, int]], free_of: Free, stats: Stats) -> None:
        """Kueue ``fillInCounts``: every domain's pods, slices and leader counts for this demand."""
        per_pod = [(r, v) for r, v in {**demand.per_pod, PODS: 1}.items() if v > 0]
        leader = ([(r, v) for r, v in {**demand.leader_per_pod, PODS: 1}.items() if v > 0]
                  if demand.leader_per_pod is not None else None)
        for level in self.per_level:
            for d in level.values():
                d.pods = d.slices = d.leader = d.pods_wl = d.slices_wl = 0
        selector = list(demand.node_selector.items())
        for leaf in self.per_level[-1].values():
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
                    if selector and any(node.labels.get(k) != v for k, v in selector):
                        stats.selector += 1
                        continue
                here, used = free_of(ni), assumed.get(ni)
                here = {r: v - used.get(r, 0) for r, v in here.items()} if used else dict(here)
                # Several nodes in one leaf (a rack as the lowest level): their capacity adds up.
                free = here if free is None else {r: free.get(r, 0) + here.get(r, 0) for r in free.keys() | here.keys()}
            if not self.by_node:
                stats.total += 1  # Kueue counts leaves here, not nodes
            if free is None:
                continue
            leaf.pods, limiting = _count_in(free, per_pod)
            if leaf.pods == 0 and limiting:
                stats.resources[limiting] = stats.resources.get(limiting, 0) + 1
            if leader is not None and _count_in(free, leader)[0] > 0:
                leaf.leader = 1
                for r, v in leader:
                    free[r] = free.get(r, 0) - v
            leaf.pods_wl = _count_in(free, per_pod)[0]
        for root in self.roots:
            self._roll_up(root, demand, 0)

    def _roll_up(self, d: Domain, demand: Demand, level: int) -> None:
        """Kueue ``fillInCountsHelper``: a parent sums its children; with a leader, the workers beside it are
        the sum less the smallest loss among the children that could take it."""
        if d.children:
            min_pods = min_slices = 1 << 40
            contributes = False
            for c in d.children:
                self._roll_up(c, demand, level + 1)
                if demand.leader_per_pod is None or c.leader > 0:
                    contributes = True
                    min_pods = min(min_pods, c.pods - c.pods_wl)
                    min_slices = min(min_slices, c.slices - c.slices_wl)
                d.leader = max(d.leader, c.leader)
            d.pods = sum(c.pods for c in d.children)
            d.slices = sum(c.slices for c in d.children)
            d.pods_wl = d.pods - min_pods if contributes else 0
            d.slices_wl = d.slices - min_slices if contributes else 0
        if level == demand.slice_idx:
            d.slices = d.pods // demand.slice_size
            d.slices_wl = d.pods_wl // demand.slice_size

    def assignment(self, chosen: Sequence[tuple[tuple[str, ...], int]]) -> TopologyAssignment:
        """Kueue's ``topologyAssignment``: only the hostname when the lowest level is the node."""
        start = len(self.levels) - 1 if self.by_node else 0
        return TopologyAssignment(levels=self.levels[start:],
                                  domains=tuple((values[start:], n) for values, n in chosen))
