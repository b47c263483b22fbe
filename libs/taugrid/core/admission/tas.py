"""Topology Aware Scheduling (Kueue's TAS): which topology domains a pod set's pods go to.

Role: on one TAS flavor's domain tree (``tas_tree``), choose domains the way Kueue's
``TASFlavorSnapshot.findTopologyAssignment`` does:

- find the level to place at: the requested level (``required``/``preferred``; the highest level for a
  slice-only request; the lowest for ``unconstrained`` or an implied request), climbing up for ``preferred``
  when no single domain fits, and failing for ``required``;
- BestFit (Kueue's default profile): domains by most slices first, the last one chosen as the smallest domain
  that still fits the remainder; LeastFreeCapacity for unconstrained/implied requests (Kueue's
  ``TASProfileMixed``, on by default): the domain with the fewest slices that fits, else fill fewest first;
- descend level by level to the leaves, keeping the number of domains minimal;
- a pod-set group (Kueue's ``podset-group-name``: a one-pod leader and its workers) is placed together, the
  leader in a domain that also holds workers' room;
- report per leaf domain how many pods it takes, domains in level-value order (pods fill them in that order).

Invariants: pure (no engine state); a pod set's pods never exceed a leaf's count of what fits; pod sets of one
workload see each other's usage (Kueue's assumed usage). Not modelled: multi-layer slice constraints, balanced
placement, node-affinity preferences (Kueue feature gates or fields taugrid does not expose).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Toleration, TopologyRequest
from .results import TopologyAssignment
from .tas_tree import PODS, Demand, Domain, Free, NodeChanges, Stats, TasTree

Found = dict[str, tuple[TopologyAssignment, "list[DomainPlacement]"]]


@dataclass(frozen=True, slots=True)
class TasPodSet:
    name: str
    count: int
    per_pod: Mapping[str, int]  # one pod's requests in units (without ``pods``)
    request: TopologyRequest | None  # None: implied (a TAS-only ClusterQueue), placed as unconstrained
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    excluded_nodes: frozenset[str] = frozenset()  # a retry's nodes to avoid (PodSet.excluded_nodes)


@dataclass(frozen=True, slots=True)
class DomainPlacement:
    """One chosen leaf domain: its values (all levels), how many pods, and the node indices it holds."""

    values: tuple[str, ...]
    count: int
    nodes: tuple[int, ...]


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


class _Search:
    """One placement of a pod set (with its leader, if grouped) on a tree whose counts are filled."""

    def __init__(self, tree: TasTree, *, count: int, leaders: int, slice_size: int, required: bool,
                 least_free: bool, stats: Stats) -> None:
        self.tree, self.count, self.leaders, self.slice_size = tree, count, leaders, slice_size
        self.required, self.least_free, self.stats = required, least_free, stats

    # -- ordering --------------------------------------------------------------------------------------

    def sorted(self, domains: Sequence[Domain]) -> list[Domain]:
        # BestFit: most slices first; LeastFreeCapacity: fewest first; then fewest pods, then by values.
        lf = self.least_free
        return sorted(domains, key=lambda d: (d.slices if lf else -d.slices, d.pods, d.values))

    def sorted_with_leader(self, domains: Sequence[Domain]) -> list[Domain]:
        lf = self.least_free
        return sorted(domains, key=lambda d: (-d.leader, d.slices_wl if lf else -d.slices_wl, d.pods_wl, d.values))

    @staticmethod
    def best_fit(domains: Sequence[Domain], needed: int, leaders: int, *, slices: bool) -> Domain:
        """Kueue ``findBestFitDomainBy``: the first domain with the smallest count that still holds
        ``needed`` (and the leaders); else the first."""
        def count(d: Domain) -> int:
            if slices:
                return d.slices_wl if leaders > 0 else d.slices
            return d.pods_wl if leaders > 0 else d.pods
        best: Domain | None = None
        for d in domains:
            if d.leader < leaders:
                continue
            n = count(d)
            if n >= needed and (best is None or n < count(best)):
                best = d
        return best or domains[0]

    def not_fit(self, fit: int, total: int) -> str:
        unit = "pod" if self.slice_size == 1 else "slice"
        name = self.tree.name
        head = (f'topology "{name}" doesn\'t allow to fit any of {total} {unit}(s)' if fit == 0 else
                f'topology "{name}" allows to fit only {fit} out of {total} {unit}(s)')
        return head + self.stats.describe()

    # -- phase 2a: the level -------------------------------------------------------------------------

    def fit_level(self, idx: int) -> tuple[int, list[Domain]] | str:
        """Kueue ``findLevelWithFitDomains``."""
        domains = list(self.tree.per_level[idx].values())
        if not domains:
            return f"no topology domains at level: {self.tree.levels[idx]}"
        ordered = self.sorted_with_leader(domains)
        top = ordered[0]
        needed = self.count // self.slice_size
        if not self.least_free and top.slices_wl >= needed and top.leader >= self.leaders:
            top = self.best_fit(ordered, needed, self.leaders, slices=True)
        if self.least_free:
            for d in ordered:
                if self.leaders > 0 and d.leader < self.leaders:
                    continue
                if (d.slices_wl if self.leaders > 0 else d.slices) >= needed:
                    return idx, [d]
            if self.required:
                return self.not_fit(ordered[-1].pods, needed)
        if top.slices_wl >= needed and top.leader >= self.leaders:
            return idx, [top]
        if self.required:
            return self.not_fit(top.slices, needed)
        if idx > 0 and not self.least_free:
            return self.fit_level(idx - 1)
        return self._spread(idx, ordered, needed)

    def _spread(self, idx: int, ordered: list[Domain], needed: int) -> tuple[int, list[Domain]] | str:
        """No single domain holds it: take domains in order (leader's first), the last one by BestFit."""
        chosen: list[Domain] = []
        remaining, leaders = needed, self.leaders
        ordered = self.prioritize_leader(ordered, self.count, leaders, slices=True)
        i = 0
        while leaders > 0 and i < len(ordered) and ordered[i].leader > 0:
            d = ordered[i]
            if not self.least_free and d.slices_wl >= remaining:
                d = self.best_fit(ordered[i:], remaining, leaders, slices=True)
            chosen.append(d)
            leaders -= d.leader
            remaining -= d.slices_wl
            i += 1
        if leaders > 0:
            return self.not_fit(self.leaders - leaders, needed)
        rest = self.sorted(ordered[i:])
        for j, d in enumerate(rest):
            if remaining <= 0:
                break
            if not self.least_free and d.slices >= remaining:
                d = self.best_fit(rest[j:], remaining, 0, slices=True)
            chosen.append(d)
            remaining -= d.slices
        if remaining > 0:
            return self.not_fit(needed - remaining, needed)
        return idx, chosen

    # -- phase 2b: down to the leaves ----------------------------------------------------------------

    def prioritize_leader(self, domains: list[Domain], count: int, leaders: int, *, slices: bool) -> list[Domain]:
        """Kueue ``prioritizeLeaderDomain``: move first a leader-capable domain whose loss of worker room the
        others can make up."""
        if leaders == 0 or len(domains) < 2:
            return domains
        need = count // self.slice_size if slices else count
        available = sum(d.slices if slices else d.pods for d in domains)
        for i, d in enumerate(domains):
            if d.leader < leaders:
                continue
            penalty = d.slices - d.slices_wl if slices else d.pods - d.pods_wl
            if available - penalty < need:
                continue
            return domains if i == 0 else [d, *domains[:i], *domains[i + 1:]]
        return domains

    def minimum(self, domains: list[Domain], count: int, leaders: int, slice_size: int, *, slices: bool
                ) -> list[Domain]:
        """Kueue ``updateCountsToMinimumGeneric``: take domains in order until ``count`` pods (and the leaders)
        are covered, the last one by BestFit; each chosen domain's ``pods``/``leader`` become what it takes."""
        domains = self.prioritize_leader(domains, count, leaders, slices=slices)
        self.tree.altered.update(domains)  # what follows rewrites some of these counts (see TasTree.fill)
        out: list[Domain] = []
        remaining = count // slice_size if slices else count
        for i, d in enumerate(domains):
            if leaders > 0:
                d, remaining, leaders, done = self._with_leader(d, domains[i:], remaining, leaders, slice_size,
                                                                slices=slices)
                out.append(d)
                if done:
                    return out
                continue
            have = d.slices if slices else d.pods
            if not self.least_free and have >= remaining:
                d = self.best_fit(domains[i:], remaining, 0, slices=slices)
                have = d.slices if slices else d.pods
            d.leader = 0
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

    def _with_leader(self, d: Domain, rest: list[Domain], remaining: int, leaders: int, slice_size: int, *,
                     slices: bool) -> tuple[Domain, int, int, bool]:
        """Kueue ``consumeWithLeadersGeneric``: take a domain while leaders are still to place."""
        def with_leader(x: Domain) -> int:
            return x.slices_wl if slices else x.pods_wl
        if not self.least_free and with_leader(d) >= remaining and d.leader >= leaders:
            d = self.best_fit(rest, remaining, leaders, slices=slices)
        if with_leader(d) >= remaining and d.leader >= leaders:
            if slices:
                d.slices = remaining
            d.leader = leaders
            d.pods = remaining * slice_size
            return d, 0, 0, True
        took = min(with_leader(d), remaining)
        d.leader = min(d.leader, leaders)
        if slices:
            d.slices = d.slices_wl = took
        else:
            d.pods_wl = took
        d.pods = took * slice_size
        return d, remaining - took, leaders - d.leader, False


def find(tree: TasTree, ps: TasPodSet, leader: TasPodSet | None, assumed: Mapping[int, Mapping[str, int]],
         free: Free, changes: NodeChanges | None = None, source: Hashable = None
         ) -> tuple[list[DomainPlacement], list[DomainPlacement]] | str:
    """Place the workers ``ps`` (and ``leader``, one pod, with them): the chosen leaf domains of each, or
    Kueue's reason. ``changes``/``source``: see ``TasTree.fill``."""
    tr = ps.request
    levels = tree.levels
    key = level_of(tr, levels)
    if key not in levels:
        return f"no requested topology level: {key}"
    level_idx = levels.index(key)
    slice_size = (tr.slice_size or 1) if tr is not None and tr.slice_required is not None else 1
    slice_key = tr.slice_required if tr is not None and tr.slice_required is not None else levels[-1]
    if slice_key not in levels:
        return f"no requested topology level for slices: {slice_key}"
    slice_idx = levels.index(slice_key)
    if level_idx > slice_idx:
        return f"podset slice topology {slice_key} is above the podset topology {key}"
    least_free = tr is None or tr.unconstrained or (
        tr.required is None and tr.preferred is None and tr.slice_required is not None)
    stats = Stats()
    tree.fill(Demand(ps.per_pod, leader.per_pod if leader is not None else None, ps.node_selector,
                     ps.tolerations, slice_size, slice_idx, ps.excluded_nodes), assumed, free, stats, changes, source)
    s = _Search(tree, count=ps.count, leaders=1 if leader is not None else 0, slice_size=slice_size,
                required=tr is not None and tr.required is not None, least_free=least_free, stats=stats)
    found = s.fit_level(level_idx)
    if isinstance(found, str):
        return found
    idx, fit = found
    fit = s.minimum(fit, ps.count, s.leaders, slice_size, slices=True)
    while idx < min(len(levels) - 1, slice_idx):
        fit = s.minimum(s.sorted([c for d in fit for c in d.children]), ps.count, s.leaders, slice_size,
                        slices=True)
        idx += 1
    while idx < len(levels) - 1:
        nxt: list[Domain] = []
        for d in fit:
            nxt += s.minimum(s.sorted(d.children), d.pods, d.leader, 1, slices=False)
        fit = nxt
        idx += 1
    fit = sorted(fit, key=lambda d: d.values)
    workers = [DomainPlacement(d.values, d.pods, tuple(d.nodes)) for d in fit if d.pods > 0]
    leaders = [DomainPlacement(d.values, d.leader, tuple(d.nodes)) for d in fit if d.leader > 0]
    return workers, leaders


def _groups(pod_sets: Sequence[TasPodSet]) -> list[tuple[TasPodSet, TasPodSet | None]]:
    """Pod sets in order, a group's two as (workers, leader): Kueue's ``findLeaderAndWorkers``."""
    order: list[str] = []
    members: dict[str, list[TasPodSet]] = {}
    for i, ps in enumerate(pod_sets):
        group = ps.request.pod_set_group if ps.request is not None else None
        key = f"\0{i}" if group is None else group
        if key not in members:
            order.append(key)
        members.setdefault(key, []).append(ps)
    out: list[tuple[TasPodSet, TasPodSet | None]] = []
    for key in order:
        m = members[key]
        if len(m) == 1:
            out.append((m[0], None))
        else:
            workers, leader = m[0], m[1]
            if leader.count > workers.count:
                workers, leader = leader, workers
            out.append((workers, leader))
    return out


def find_assignments(tree: TasTree, pod_sets: Sequence[TasPodSet], free: Free,
                     assumed: dict[int, dict[str, int]] | None = None, *, changes: NodeChanges | None = None,
                     source: Hashable = None) -> tuple[Found, tuple[str, str] | None]:
    """Place every pod set of one workload on one TAS flavor's topology, in order, each seeing the usage of
    the ones before it (and ``assumed``, per node index: what this workload's pod sets on other flavors sharing
    the nodes took; Kueue's TASHandleOverlappingFlavors). Returns per pod set (assignment, chosen domains) for
    those placed, and (pod set, reason) for the first that does not fit (None when all do); Kueue stops at that
    one too. ``assumed`` is updated with what the placed pod sets take. ``changes``: the log of nodes whose
    ``free`` changed, so the tree recounts only those (``source`` names what ``free`` measures)."""
    assumed = {} if assumed is None else assumed
    out: Found = {}
    for workers, leader in _groups(pod_sets):
        chosen = find(tree, workers, leader, assumed, free, changes, source)
        if isinstance(chosen, str):
            return out, (workers.name, chosen)
        for ps, domains in ((workers, chosen[0]), (leader, chosen[1])):
            if ps is None:
                continue
            out[ps.name] = (tree.assignment([(d.values, d.count) for d in domains]), domains)
            # Charge the leaf so the next pod set sees it used (Kueue's assumedUsage): on its node, or on the
            # first node of a multi-node leaf, whose capacity is the sum over its nodes.
            for d in domains:
                use = assumed.setdefault(d.nodes[0], {})
                for r, v in {**ps.per_pod, PODS: 1}.items():
                    use[r] = use.get(r, 0) + v * d.count
    return out, None
