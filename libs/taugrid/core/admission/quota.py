"""Quota ledger on the cohort tree: Kueue's per-(flavor, resource) arithmetic.

Role: hold nominal quota, borrowing/lending limits and usage for every ClusterQueue and Cohort, and answer
"how much can this queue still take" (``available``) and "how much could it ever take" (``potential``).

Formulas (Kueue ``resource_node.go``), per ``fr = (flavor, resource)``, all in integer milli-units:
- ``guaranteed(n) = max(0, subtree(n) - lending_limit(n))`` (0 when no lending limit: everything is lent);
- ``subtree(cq) = nominal``; ``subtree(cohort) = own nominal + sum(subtree(child) - guaranteed(child))``;
- usage bubbles up: a child's usage beyond its guaranteed part is counted in its parent;
- ``available(root) = subtree - usage``;
  ``available(n) = max(0, guaranteed - usage) + min(available(parent), stored - used_in_parent + borrowing_limit)``
  where ``stored = subtree - guaranteed`` and ``used_in_parent = max(0, usage - guaranteed)``
  (the ``min`` only when a borrowing limit is set);
- ``potential`` is the same with zero usage.
Invariant: after any sequence of ``add_usage`` calls whose requests each fit ``available``, every queue's usage
stays within ``nominal + borrowing_limit`` and no lender lends beyond its lending limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from taugrid.core.errors import PermanentError

from .model import ClusterQueue, Cohort, ResourceGroup, to_units

FR = tuple[str, str]  # (flavor, resource)


class QNode:
    """One ClusterQueue or Cohort in the tree."""

    __slots__ = ("name", "is_cq", "parent", "children", "nominal", "blimit", "llimit", "subtree",
                 "guaranteed", "usage", "weight", "epoch")

    def __init__(self, name: str, *, is_cq: bool, weight: float = 1.0) -> None:
        self.name = name
        self.is_cq = is_cq
        self.parent: QNode | None = None
        self.children: list[QNode] = []
        self.nominal: dict[FR, int] = {}
        self.blimit: dict[FR, int] = {}
        self.llimit: dict[FR, int] = {}
        self.subtree: dict[FR, int] = {}
        self.guaranteed: dict[FR, int] = {}
        self.usage: dict[FR, int] = {}
        self.weight = weight
        # Roots only: bumped by every usage change in the tree that is not a simulation (``charge(quiet=True)``),
        # so an unchanged epoch means the tree's quota state is exactly as it was (the engine's memo of
        # inadmissible heads relies on it).
        self.epoch = 0

    def load_groups(self, groups: Iterable[ResourceGroup]) -> None:
        for group in groups:
            for fq in group.flavors:
                for resource, rq in fq.resources.items():
                    fr = (fq.name, resource)
                    self.nominal[fr] = to_units(rq.nominal_quota)
                    if rq.borrowing_limit is not None:
                        self.blimit[fr] = to_units(rq.borrowing_limit)
                    if rq.lending_limit is not None:
                        self.llimit[fr] = to_units(rq.lending_limit)

    def borrowed(self, fr: FR) -> int:
        return max(0, self.usage.get(fr, 0) - self.nominal.get(fr, 0))

    def __repr__(self) -> str:
        return f"QNode({'cq' if self.is_cq else 'cohort'}:{self.name})"


class QuotaTree:
    """Nodes for every ClusterQueue and Cohort (implicit cohorts are created for names only CQs mention)."""

    def __init__(self, cluster_queues: Iterable[ClusterQueue], cohorts: Iterable[Cohort] = ()) -> None:
        self.cqs: dict[str, QNode] = {}
        self.cohorts: dict[str, QNode] = {}
        self._heights: dict[QNode, int] = {}
        cohort_specs = {c.name: c for c in cohorts}
        for spec in cohort_specs.values():
            node = QNode(spec.name, is_cq=False, weight=spec.fair_weight)
            node.load_groups(spec.resource_groups)
            self.cohorts[spec.name] = node
        for cq in cluster_queues:
            if cq.name in self.cqs:
                raise PermanentError(f"ClusterQueue {cq.name} defined twice; names must be unique")
            node = QNode(cq.name, is_cq=True, weight=cq.fair_weight)
            node.load_groups(cq.resource_groups)
            if cq.cohort is None and (node.blimit or node.llimit):
                raise PermanentError(
                    f"ClusterQueue {cq.name}: borrowing_limit/lending_limit need a cohort; set cohort or drop them")
            self.cqs[cq.name] = node
            if cq.cohort is not None:
                self._attach(node, self._cohort(cq.cohort))
        for spec in cohort_specs.values():
            if spec.parent is not None:
                self._attach(self.cohorts[spec.name], self._cohort(spec.parent))
        self._check_acyclic()
        for root in [n for n in self.cohorts.values() if n.parent is None]:
            self._compute_subtree(root)
        for node in self.cqs.values():
            if node.parent is None:
                self._compute_subtree(node)

    def _cohort(self, name: str) -> QNode:
        if name not in self.cohorts:
            self.cohorts[name] = QNode(name, is_cq=False)
        return self.cohorts[name]

    @staticmethod
    def _attach(child: QNode, parent: QNode) -> None:
        child.parent = parent
        parent.children.append(child)

    def _check_acyclic(self) -> None:
        for node in self.cohorts.values():
            seen = {node.name}
            p = node.parent
            while p is not None:
                if p.name in seen:
                    raise PermanentError(f"cohort {node.name}: parent chain loops through {p.name}; break the cycle")
                seen.add(p.name)
                p = p.parent

    def _compute_subtree(self, node: QNode) -> None:
        subtree = dict(node.nominal)
        for child in node.children:
            self._compute_subtree(child)
            for fr, q in child.subtree.items():
                subtree[fr] = subtree.get(fr, 0) + q - child.guaranteed.get(fr, 0)
        node.subtree = subtree
        node.guaranteed = {fr: max(0, subtree.get(fr, 0) - lim) for fr, lim in node.llimit.items()}

    # -- queries ---------------------------------------------------------------------------------------

    @staticmethod
    def root(node: QNode) -> QNode:
        while node.parent is not None:
            node = node.parent
        return node

    def available(self, node: QNode, fr: FR) -> int:
        if node.parent is None:
            return node.subtree.get(fr, 0) - node.usage.get(fr, 0)
        g = node.guaranteed.get(fr, 0)
        use = node.usage.get(fr, 0)
        from_parent = self.available(node.parent, fr)
        lim = node.blimit.get(fr)
        if lim is not None:
            stored = node.subtree.get(fr, 0) - g
            from_parent = min(from_parent, stored - max(0, use - g) + lim)
        return max(0, g - use) + from_parent

    def potential(self, node: QNode, fr: FR) -> int:
        if node.parent is None:
            return node.subtree.get(fr, 0)
        total = node.guaranteed.get(fr, 0) + self.potential(node.parent, fr)
        lim = node.blimit.get(fr)
        if lim is not None:
            total = min(total, node.subtree.get(fr, 0) + lim)
        return total

    def fits(self, node: QNode, usage: dict[FR, int], *, allow_borrow: bool = True) -> bool:
        for fr, val in usage.items():
            if val > self.available(node, fr):
                return False
            if not allow_borrow and node.usage.get(fr, 0) + val > node.nominal.get(fr, 0):
                return False
        return True

    # -- Kueue's helpers for hierarchical preemption and flavor choice (``resource_node.go``) ----------------

    @staticmethod
    def local_available(node: QNode, fr: FR) -> int:
        """Unused guaranteed (not lendable) quota of the node: what it can take without touching its parent."""
        return max(0, node.guaranteed.get(fr, 0) - node.usage.get(fr, 0))

    @staticmethod
    def borrowing_with(node: QNode, fr: FR, val: int) -> bool:
        """Would ``val`` more take the node beyond its own quota (nominal for a ClusterQueue, subtree for a cohort)?"""
        own = node.nominal.get(fr, 0) if node.is_cq else node.subtree.get(fr, 0)
        return own < node.usage.get(fr, 0) + val

    @staticmethod
    def within_nominal(node: QNode, frs: Iterable[FR]) -> bool:
        """Usage within the subtree quota for every ``fr`` (Kueue ``IsWithinNominalInResources``)."""
        usage, subtree = node.usage, node.subtree
        return all(usage.get(fr, 0) <= subtree.get(fr, 0) for fr in frs)

    def fit_in_quota(self, node: QNode, requests: dict[FR, int]) -> tuple[bool, dict[FR, int]]:
        """Kueue ``QuantitiesFitInQuota``: do the requests fit the node's subtree quota, and what is left over
        after its local (guaranteed) part."""
        fits = True
        remaining: dict[FR, int] = {}
        for fr, v in requests.items():
            if node.subtree.get(fr, 0) < node.usage.get(fr, 0) + v:
                fits = False
            remaining[fr] = max(0, v - self.local_available(node, fr))
        return fits, remaining

    def height(self, node: QNode) -> int:
        """Height of a cohort in the tree (a cohort with only ClusterQueues has height 1); the tree is fixed, so
        heights are computed once."""
        cached = self._heights.get(node)
        if cached is None:
            cached = min(len(node.children), 1)
            for child in node.children:
                if not child.is_cq:
                    cached = max(cached, self.height(child) + 1)
            self._heights[node] = cached
        return cached

    def borrow_height(self, node: QNode, fr: FR, val: int) -> tuple[int, bool]:
        """Kueue ``FindHeightOfLowestSubtreeThatFits``: how far up the tree ``val`` more must borrow (0 = not
        at all), and whether a cohort above that subtree still exists (so reclaim up the tree is possible)."""
        if not self.borrowing_with(node, fr, val) or node.parent is None:
            return 0, node.parent is not None
        remaining = val - self.local_available(node, fr)
        p: QNode | None = node.parent
        while p is not None:
            if not self.borrowing_with(p, fr, remaining):
                return self.height(p), p.parent is not None
            remaining -= self.local_available(p, fr)
            p = p.parent
        return self.height(self.root(node)), False

    # -- mutation --------------------------------------------------------------------------------------

    @staticmethod
    def add_usage(node: QNode | None, fr: FR, delta: int) -> None:
        while node is not None and delta:
            g = node.guaranteed.get(fr, 0)
            old = node.usage.get(fr, 0)
            new = old + delta
            node.usage[fr] = new
            delta = max(0, new - g) - max(0, old - g)
            node = node.parent

    def charge(self, node: QNode, usage: Mapping[FR, int], sign: int = 1, *, quiet: bool = False) -> None:
        """Add (``sign`` 1) or remove usage. ``quiet``: a simulation that is undone before anything else reads
        the tree (the root's epoch is left alone); every other change bumps the root's epoch."""
        for fr, val in usage.items():
            self.add_usage(node, fr, sign * val)
        if not quiet:
            self.root(node).epoch += 1
