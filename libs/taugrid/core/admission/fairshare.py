"""Fair sharing: dominant resource share (DRS) and the tournament that orders heads inside a cohort tree.

Role: with fair sharing on, the next head to process is chosen per cohort tree by a tournament: at every
cohort, each child (a ClusterQueue with a head, or a sub-cohort's winner) is scored with that head's request
added: not borrowing on the requested resources first, then the lowest DRS (ties: higher priority, then
older), recursively up to the root.

DRS (Kueue ``fair_sharing.go``): per resource, ``borrowed = sum over flavors of max(0, usage + request -
subtree quota)``; ``ratio = borrowed * 1000 / lendable`` where lendable is what the parent could give;
DRS = max ratio / weight (weight 0 while borrowing = +inf). A node that is not borrowing has DRS 0.
KAI's ``overQuotaWeight`` maps onto ``fair_weight``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from .quota import FR, QNode, QuotaTree

E = TypeVar("E")


DrsKey = tuple[bool, float]  # (borrows with weight 0, share): compares as Kueue's ``CompareDRS``


def drs_key(tree: QuotaTree, node: QNode, extra: Mapping[FR, int] | None = None) -> DrsKey:
    """Kueue's DRS of ``node`` (with ``extra`` usage added on top, for a cohort node as an approximation):
    weighted share, or, for a node of weight 0 that borrows, ``(True, unweighted share)`` — above every weighted
    share and compared among themselves unweighted."""
    extra = extra or {}
    if node.parent is None:
        return False, 0.0
    borrowed: dict[str, int] = {}
    lendable: dict[str, int] = {}
    for fr in set(node.subtree) | set(extra) | set(node.usage):
        resource = fr[1]
        over = node.usage.get(fr, 0) + extra.get(fr, 0) - node.subtree.get(fr, 0)
        borrowed[resource] = borrowed.get(resource, 0) + max(0, over)
        lendable[resource] = lendable.get(resource, 0) + tree.potential(node.parent, fr)
    share = 0.0
    for resource, b in borrowed.items():
        if b <= 0:
            continue
        lend = lendable.get(resource, 0)
        share = max(share, math.inf if lend <= 0 else b * 1000 / lend)
    if share == 0.0:
        return False, 0.0
    if node.weight <= 0:
        return True, share
    return False, share / node.weight


def drs(tree: QuotaTree, node: QNode, extra: Mapping[FR, int]) -> float:
    """The DRS as one number (+inf for a weight-0 node that borrows)."""
    zero_weight, share = drs_key(tree, node, extra)
    return math.inf if zero_weight else share


def borrowing_on(node: QNode, frs: Iterable[FR]) -> bool:
    """Does the node use more than its subtree quota of any of ``frs`` (Kueue ``IsBorrowingOn``)?"""
    return any(node.usage.get(fr, 0) > node.subtree.get(fr, 0) for fr in frs)


def tournament(tree: QuotaTree, root: QNode, heads: Mapping[str, E], node_of: Callable[[E], QNode],
               usage_of: Callable[[E], Mapping[FR, int]], tie: Callable[[E], tuple[int, float]]) -> E | None:
    """Winner among ``heads`` (keyed by ClusterQueue name) in the subtree of ``root``: Kueue's
    ``fairSharingIterator``. Each head's request is added to its queue and, at every cohort on its path, the
    child on that path is scored: not borrowing on the requested resources first
    (``FairSharingPrioritizeNonBorrowing``), then the lowest DRS, then ``tie`` (priority, age)."""
    scores: dict[tuple[str, str], tuple[bool, DrsKey]] = {}
    for name, entry in heads.items():
        cq = node_of(entry)
        usage = dict(usage_of(entry))
        tree.charge(cq, usage, quiet=True)  # a score, undone below
        try:
            child = cq
            while child.parent is not None:
                scores[(child.parent.name, name)] = (borrowing_on(child, usage), drs_key(tree, child))
                child = child.parent
        finally:
            tree.charge(cq, usage, -1, quiet=True)

    def play(node: QNode) -> tuple[str, E] | None:
        if node.is_cq:
            e = heads.get(node.name)
            return None if e is None else (node.name, e)
        best: tuple[tuple[bool, DrsKey, tuple[int, float]], str, E] | None = None
        for child in node.children:
            won = play(child)
            if won is None:
                continue
            key = (*scores[(node.name, won[0])], tie(won[1]))
            if best is None or key < best[0]:
                best = (key, won[0], won[1])
        return None if best is None else (best[1], best[2])

    won = play(root)
    return None if won is None else won[1]
