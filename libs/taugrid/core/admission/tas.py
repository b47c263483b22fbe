"""Topology Aware Scheduling (Kueue's TAS): which topology domains a pod set's pods go to.

Role: for one TAS flavor, build Kueue's domain tree from the nodes' labels (one level per ``Topology.levels``
key, highest first; a leaf is a node when the lowest level is ``kubernetes.io/hostname``, else the group of
nodes sharing all level values), count how many pods (and slices) fit in each domain from the free capacity
the caller passes, and choose domains the way Kueue's ``TASFlavorSnapshot.findTopologyAssignment`` does:

- find the level to place at: the requested level (``required``/``preferred``; the highest level for a
  slice-only request; the lowest for ``unconstrained`` or an implied request), climbing up for ``preferred``
  when no single domain fits, and failing for ``required``;
- BestFit (Kueue's default profile): domains by most slices first, the last one chosen as the smallest domain
  that still fits the remainder; LeastFreeCapacity for unconstrained/implied requests (Kueue's
  ``TASProfileMixed``, on by default): the domain with the fewest slices that fits, else fill fewest first;
- descend level by level to the leaves, keeping the number of domains minimal;
- report per leaf domain how many pods it takes, domains in level-value order (pods fill them in that order).

Invariants: pure (no engine state); a pod set's pods never exceed a leaf's count of what fits; pod sets of one
workload placed on the same flavor see each other's usage (Kueue's assumed usage). Not modelled: leader/worker
pod-set groups, multi-layer slice constraints, balanced placement, node-affinity preferences (all behind
Kueue feature gates or annotations taugrid does not expose).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Taint, Toleration, Topology, TopologyRequest, untolerated
from .results import TopologyAssignment

HOSTNAME = "kubernetes.io/hostname"
PODS = "pods"  # one per pod, as Kueue adds to every request; a node without a pod limit has plenty


@dataclass(frozen=True, slots=True)
class TasNode:
    """A node as TAS sees it: its index in the caller's node list, labels and taints (what is free is asked
    through the ``free`` callback at each placement: it changes, the tree does not)."""

    index: int
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]

    def value(self, key: str) -> str | None:
        return self.labels.get(key)


Free = Callable[[int], Mapping[str, int]]  # node index -> free capacity per resource (units, ``pods`` too)


@dataclass(frozen=True, slots=True)
class TasPodSet:
    name: str
    count: int
    per_pod: Mapping[str, int]  # one pod's requests in units (without ``pods``)
    request: TopologyRequest | None  # None: implied (a TAS-only ClusterQueue), placed as unconstrained
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class DomainPlacement:
    """One chosen leaf domain: its values (all levels), how many pods, and the node indices it holds."""

    values: tuple[str, ...]
    count: int
    nodes: tuple[int, ...]


@dataclass(slots=True, eq=False)
class _Domain:
    values: tuple[str, ...]
    parent: _Domain | None = None
    children: list[_Domain] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)  # leaves only
    pods: int = 0
    slices: int = 0


@dataclass(slots=True)
class _Stats:
    total: int = 0
    selector: int = 0
    taints: dict[str, int] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        if not (self.selector or self.taints or self.resources):
            return ""
        reasons = [f"nodeSelector: {self.selector}"] if self.selector else []
        reasons += [f"taint {k!r}: {v}".replace("'", '"') for k, v in self.taints.items()]
        reasons += [f'resource "{k}": {v}' for k, v in self.resources.items()]
        return f". Total nodes: {self.total}; excluded: {', '.join(sorted(reasons))}"


def level_of(request: TopologyRequest | None, levels: tuple[str, ...]) -> str:
    """Kueue ``levelKey``: the level a request places at."""
    if request is None or request.unconstrained:
        return levels[-1]
    if request.required is not None:
        return request.required
    if request.preferred is not None:
        return request.preferred
    if request.slice_required is not None:
        return levels[0]
    return levels[-1]


def missing_level(request: TopologyRequest, topology: Topology) -> str | None:
    """The first level the request names that the topology lacks, or None (Kueue ``HasLevel``)."""
    for key in (request.required, request.preferred, request.slice_required):
        if key is not None and key not in topology.levels:
            return key
    return None


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


class TasTree:
    """Kueue's domain tree of one TAS flavor (built once per set of usable nodes, reused across placements)."""

    def __init__(self, topology: Topology, nodes: Sequence[TasNode]) -> None:
        self.name = topology.name
        self.levels = topology.levels
        self.by_node = self.levels[-1] == HOSTNAME
        self.per_level: list[dict[tuple[str, ...], _Domain]] = [{} for _ in self.levels]
        self.nodes = {n.index: n for n in nodes}
        for n in nodes:
            values = tuple(n.value(k) for k in self.levels)
            if any(v is None for v in values):
                continue  # Kueue: a node without every level label is not part of the topology
            key = tuple(v for v in values if v is not None)
            leaf = self.per_level[-1].get(key)
            if leaf is None:
                leaf = self._domain(key)
            leaf.nodes.append(n.index)
        self.roots = list(self.per_level[0].values())

    def _domain(self, values: tuple[str, ...]) -> _Domain:
        d = _Domain(values)
        self.per_level[len(values) - 1][values] = d
        if len(values) > 1:
            parent = self.per_level[len(values) - 2].get(values[:-1]) or self._domain(values[:-1])
            d.parent = parent
            parent.children.append(d)
        return d

    # -- phase 1: how many pods and slices fit where --------------------------------------------------

    def _fill(self, ps: TasPodSet, assumed: Mapping[int, Mapping[str, int]], free_of: Free, slice_size: int,
              slice_idx: int, stats: _Stats) -> None:
        per_pod = [(r, v) for r, v in {**ps.per_pod, PODS: 1}.items() if v > 0]
        for level in self.per_level[:-1]:
            for d in level.values():
                d.pods = d.slices = 0
        selector = list(ps.node_selector.items())
        for leaf in self.per_level[-1].values():
            leaf.pods = leaf.slices = 0
            free: Mapping[str, int] | None = None
            for ni in leaf.nodes:
                node = self.nodes[ni]
                if self.by_node:  # Kueue checks taints and the node selector only when leaves are nodes
                    stats.total += 1
                    taint = untolerated(node.taints, ps.tolerations) if node.taints else None
                    if taint is not None:
                        text = _taint_text(taint)
                        stats.taints[text] = stats.taints.get(text, 0) + 1
                        continue
                    if selector and any(node.labels.get(k) != v for k, v in selector):
                        stats.selector += 1
                        continue
                here, used = free_of(ni), assumed.get(ni)
                if used:
                    here = {r: v - used.get(r, 0) for r, v in here.items()}
                # Several nodes in one leaf (a rack as the lowest level): their capacity adds up.
                free = here if free is None else {r: free.get(r, 0) + here.get(r, 0) for r in free.keys() | here.keys()}
            if not self.by_node:
                stats.total += 1  # Kueue counts leaves here, not nodes
            if free is None:
                continue
            count, limiting = 1 << 40, ""
            for r, v in per_pod:
                n = free.get(r, 0) // v
                if n < count:
                    count, limiting = n, r
            leaf.pods = max(count, 0)
            if leaf.pods == 0 and limiting:
                stats.resources[limiting] = stats.resources.get(limiting, 0) + 1
        for root in self.roots:
            self._roll_up(root, slice_size, slice_idx, 0)

    def _roll_up(self, d: _Domain, slice_size: int, slice_idx: int, level: int) -> None:
        if d.children:
            for c in d.children:
                self._roll_up(c, slice_size, slice_idx, level + 1)
            d.pods = sum(c.pods for c in d.children)
            d.slices = sum(c.slices for c in d.children)
        if level == slice_idx:
            d.slices = d.pods // slice_size

    # -- phase 2: choose domains ----------------------------------------------------------------------

    @staticmethod
    def _sorted(domains: Sequence[_Domain], least_free: bool) -> list[_Domain]:
        # BestFit: most slices first; LeastFreeCapacity: fewest first; then fewest pods, then by values.
        return sorted(domains, key=lambda d: (d.slices if least_free else -d.slices, d.pods, d.values))

    @staticmethod
    def _best_fit(domains: Sequence[_Domain], needed: int, slices: bool) -> _Domain:
        """The first domain with the smallest count that still holds ``needed``; else the first."""
        best: _Domain | None = None
        for d in domains:
            n = d.slices if slices else d.pods
            if n >= needed and (best is None or n < (best.slices if slices else best.pods)):
                best = d
        return best or domains[0]

    def _not_fit(self, fit: int, total: int, slice_size: int, stats: _Stats) -> str:
        unit = "pod" if slice_size == 1 else "slice"
        head = (f'topology "{self.name}" doesn\'t allow to fit any of {total} {unit}(s)' if fit == 0 else
                f'topology "{self.name}" allows to fit only {fit} out of {total} {unit}(s)')
        return head + stats.describe()

    def _fit_level(self, idx: int, count: int, slice_size: int, required: bool, least_free: bool,
                   stats: _Stats) -> tuple[int, list[_Domain]] | str:
        domains = list(self.per_level[idx].values())
        if not domains:
            return f"no topology domains at level: {self.levels[idx]}"
        ordered = self._sorted(domains, least_free)
        top = ordered[0]
        needed = count // slice_size
        if not least_free and top.slices >= needed:
            top = self._best_fit(ordered, needed, True)
        if least_free:
            for d in ordered:
                if d.slices >= needed:
                    return idx, [d]
            if required:
                return self._not_fit(ordered[-1].pods, needed, slice_size, stats)
        if top.slices >= needed:
            return idx, [top]
        if required:
            return self._not_fit(top.slices, needed, slice_size, stats)
        if idx > 0 and not least_free:
            return self._fit_level(idx - 1, count, slice_size, required, least_free, stats)
        chosen: list[_Domain] = []
        remaining = needed
        ordered = self._sorted(ordered, least_free)
        for i, d in enumerate(ordered):
            if remaining <= 0:
                break
            if not least_free and d.slices >= remaining:
                d = self._best_fit(ordered[i:], remaining, True)
            chosen.append(d)
            remaining -= d.slices
        if remaining > 0:
            return self._not_fit(needed - remaining, needed, slice_size, stats)
        return idx, chosen

    def _minimum(self, domains: list[_Domain], count: int, slice_size: int, least_free: bool, slices: bool
                 ) -> list[_Domain]:
        """Kueue ``updateCountsToMinimum``: take domains in order until ``count`` pods are covered, the last
        one chosen by BestFit; each chosen domain's ``pods`` becomes what it takes."""
        out: list[_Domain] = []
        remaining = count // slice_size if slices else count
        for i, d in enumerate(domains):
            have = d.slices if slices else d.pods
            if not least_free and have >= remaining:
                d = self._best_fit(domains[i:], remaining, slices)
                have = d.slices if slices else d.pods
            if have >= remaining:
                d.pods = remaining * slice_size if slices else remaining
                if slices:
                    d.slices = remaining
                out.append(d)
                return out
            if slices:
                d.pods = have * slice_size
            remaining -= have
            out.append(d)
        raise AssertionError(f"{remaining} pods left after every domain (Kueue: assumptions violated)")

    def find(self, ps: TasPodSet, assumed: Mapping[int, Mapping[str, int]], free: Free
             ) -> list[DomainPlacement] | str:
        tr = ps.request
        key = level_of(tr, self.levels)
        if key not in self.levels:
            return f"no requested topology level: {key}"
        level_idx = self.levels.index(key)
        slice_size = tr.slice_size or 1 if tr is not None and tr.slice_required is not None else 1
        slice_key = tr.slice_required if tr is not None and tr.slice_required is not None else self.levels[-1]
        if slice_key not in self.levels:
            return f"no requested topology level for slices: {slice_key}"
        slice_idx = self.levels.index(slice_key)
        if level_idx > slice_idx:
            return f"podset slice topology {slice_key} is above the podset topology {key}"
        required = tr is not None and tr.required is not None
        least_free = tr is None or tr.unconstrained or (
            tr.required is None and tr.preferred is None and tr.slice_required is not None)
        stats = _Stats()
        self._fill(ps, assumed, free, slice_size, slice_idx, stats)
        found = self._fit_level(level_idx, ps.count, slice_size, required, least_free, stats)
        if isinstance(found, str):
            return found
        idx, fit = found
        fit = self._minimum(fit, ps.count, slice_size, least_free, True)
        while idx < min(len(self.levels) - 1, slice_idx):
            lower = self._sorted([c for d in fit for c in d.children], least_free)
            fit = self._minimum(lower, ps.count, slice_size, least_free, True)
            idx += 1
        while idx < len(self.levels) - 1:
            nxt: list[_Domain] = []
            for d in fit:
                nxt += self._minimum(self._sorted(d.children, least_free), d.pods, 1, least_free, False)
            fit = nxt
            idx += 1
        fit = sorted(fit, key=lambda d: d.values)
        return [DomainPlacement(d.values, d.pods, tuple(d.nodes)) for d in fit if d.pods > 0]

    def assignment(self, chosen: Sequence[DomainPlacement]) -> TopologyAssignment:
        """Kueue's ``topologyAssignment``: only the hostname when the lowest level is the node."""
        start = len(self.levels) - 1 if self.by_node else 0
        return TopologyAssignment(levels=self.levels[start:],
                                  domains=tuple((d.values[start:], d.count) for d in chosen))


def find_assignments(tree: TasTree, pod_sets: Sequence[TasPodSet], free: Free,
                     assumed: dict[int, dict[str, int]] | None = None
                     ) -> tuple[dict[str, tuple[TopologyAssignment, list[DomainPlacement]]], tuple[str, str] | None]:
    """Place every pod set of one workload on one TAS flavor's topology, in order, each seeing the usage of
    the ones before it (and ``assumed``, per node index: what this workload's pod sets on other flavors sharing
    the nodes took; Kueue's TASHandleOverlappingFlavors). Returns per pod set (assignment, chosen domains) for
    those placed, and (pod set, reason) for the first that does not fit (None when all do); Kueue stops at that
    one too. ``assumed`` is updated with what the placed pod sets take."""
    assumed = {} if assumed is None else assumed
    out: dict[str, tuple[TopologyAssignment, list[DomainPlacement]]] = {}
    for ps in pod_sets:
        chosen = tree.find(ps, assumed, free)
        if isinstance(chosen, str):
            return out, (ps.name, chosen)
        out[ps.name] = (tree.assignment(chosen), chosen)
        # Charge the leaf so the next pod set sees it used (Kueue's assumedUsage): on its node, or on the first
        # node of a multi-node leaf, whose capacity is the sum over its nodes.
        for d in chosen:
            use = assumed.setdefault(d.nodes[0], {})
            for r, v in {**ps.per_pod, PODS: 1}.items():
                use[r] = use.get(r, 0) + v * d.count
    return out, None
