"""Fair sharing: dominant resource share (DRS) and the tournament that orders heads inside a cohort tree.

Role: with fair sharing on, the next head to process is chosen per cohort tree by a tournament: at every
cohort, each child (a ClusterQueue with a head, or a sub-cohort's winner) is scored by its DRS *including*
that head's request; the lowest DRS wins (ties: higher priority, then older), recursively up to the root.

DRS (Kueue ``fair_sharing.go``): per resource, ``borrowed = sum over flavors of max(0, usage + request -
subtree quota)``; ``ratio = borrowed * 1000 / lendable`` where lendable is what the parent could give;
DRS = max ratio / weight (weight 0 while borrowing = +inf). A node that is not borrowing has DRS 0.
KAI's ``overQuotaWeight`` maps onto ``fair_weight``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from .quota import FR, QNode, QuotaTree

E = TypeVar("E")


def drs(tree: QuotaTree, node: QNode, extra: Mapping[FR, int]) -> float:
    if node.parent is None:
        return 0.0
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
        return 0.0
    if node.weight <= 0:
        return math.inf
    return share / node.weight


def tournament(tree: QuotaTree, root: QNode, heads: Mapping[str, E], usage_of: Callable[[E], Mapping[FR, int]],
               tie: Callable[[E], tuple[int, float]]) -> E | None:
    """Winner among ``heads`` (keyed by ClusterQueue name) in the subtree of ``root``."""

    def play(node: QNode) -> E | None:
        if node.is_cq:
            return heads.get(node.name)
        best: tuple[float, tuple[int, float], E] | None = None
        for child in node.children:
            entry = play(child)
            if entry is None:
                continue
            score = (drs(tree, child, usage_of(entry)), tie(entry))
            if best is None or score < best[:2]:
                best = (score[0], score[1], entry)
        return None if best is None else best[2]

    return play(root)
