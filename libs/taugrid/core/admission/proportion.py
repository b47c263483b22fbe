"""KAI's fair-share division (its ``proportion`` plugin, ``resource_division.go``), per resource, pure.

Among sibling queues sharing ``total`` of one resource:
1. each gets ``min(deserved, requestable)`` first, where requestable = ``min(requested, limit)``;
2. what is left goes by queue priority groups, highest first; inside a group, in rounds, each unsatisfied
   queue gets ``left × weight / Σ weights`` of the unsatisfied (rounded down to whole ``step``s while it still
   wants more), until every queue is satisfied or nothing is left;
3. the fractions lost to rounding go one ``step`` at a time to the queues with the largest remainder.
A queue is satisfied when its fair share reaches its requestable amount (or its limit). Historical usage
(KAI's time-based ``kValue`` term) is not modelled: with no usage history the weights alone decide.

Invariants: amounts are integers in the engine's milli-units; no queue's share exceeds its requestable amount;
the shares never sum above ``total`` (when ``total`` covers the deserved quotas given out first).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class Share:
    """One queue's view of one resource (milli-units); ``limit`` None means unlimited."""

    name: str
    deserved: int
    requested: int
    weight: float = 1.0
    priority: int = 100
    limit: int | None = None
    fair: int = 0

    @property
    def requestable(self) -> int:
        return self.requested if self.limit is None else min(self.limit, self.requested)

    def satisfied(self) -> bool:
        return self.fair >= self.requestable


def divide(total: int, shares: Iterable[Share], *, step: int = 1) -> dict[str, int]:
    """Set every share's ``fair`` amount of ``total``; returns name -> fair share."""
    queues = list(shares)
    left = total
    for q in queues:
        q.fair = min(q.deserved, q.requestable)
        left -= q.fair
    left = max(0, left)
    remainders: dict[str, tuple[Share, float]] = {}
    for priority in sorted({q.priority for q in queues}, reverse=True):
        group = [q for q in queues if q.priority == priority]
        left = _rounds(left, group, step, remainders)
    for q, _ in sorted(remainders.values(), key=lambda t: (-t[1], t[0].name)):
        if left <= 0:
            break
        give = min(step, left, q.requestable - q.fair)
        if give > 0:
            q.fair += give
            left -= give
    return {q.name: q.fair for q in queues}


def _rounds(left: int, group: list[Share], step: int, remainders: dict[str, tuple[Share, float]]) -> int:
    while left > 0:
        hungry = [q for q in group if not q.satisfied() and q.weight > 0]
        weights = sum(q.weight for q in hungry)
        if not hungry or weights <= 0:
            return left
        budget, another = left, False
        for q in hungry:
            if left <= 0:
                break
            portion = budget * q.weight / weights
            wanted = q.requestable - q.fair
            if wanted <= portion:
                give = wanted
                remainders.pop(q.name, None)
                another = True  # it took less than its portion: the rest goes round again
            else:
                give = int(portion // step) * step
                if portion - give > 0:
                    remainders[q.name] = (q, portion - give)
            give = min(give, left)
            q.fair += give
            left -= give
        if not another:
            return left
    return left
