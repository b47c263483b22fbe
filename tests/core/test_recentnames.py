"""core/recentnames: the bounded set of recent names the local cluster remembers finished workloads in."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from taugrid.core.recentnames import RecentNames


def test_remembers_the_last_names_added_and_forgets_the_oldest() -> None:
    names = RecentNames(3)
    for n in ("a", "b", "c", "b", "d"):  # "b" again keeps its place, as an OrderedDict's assignment does
        names.add(n)
    assert [n for n in "abcde" if n in names] == ["b", "c", "d"] and len(names) == 3
    names.discard("c")
    names.discard("zz")  # not held: nothing
    assert [n for n in "abcde" if n in names] == ["b", "d"] and len(names) == 2
    names.add("e")  # the discarded name's ring slot is empty: "b", the oldest held, stays until its turn
    assert [n for n in "abcde" if n in names] == ["b", "d", "e"]
    names.add("f")
    assert [n for n in "abcdef" if n in names] == ["d", "e", "f"] and 42 not in names
    names.clear()
    assert len(names) == 0 and "f" not in names


@pytest.mark.parametrize("capacity", [1, 7, 64])
def test_agrees_with_an_ordered_dict_through_long_churn(capacity: int) -> None:
    """What the local cluster did before: an OrderedDict bounded by popping its oldest. Enough churn that the
    table is made again many times (removed slots past a quarter of it)."""
    rng = random.Random(capacity)
    names, model = RecentNames(capacity), OrderedDict[str, None]()
    for step in range(20_000):
        name = f"run-{rng.randrange(3 * capacity + 5)}"
        if rng.random() < 0.1:
            names.discard(name)
            model.pop(name, None)
        else:
            names.add(name)
            model.setdefault(name, None)
            while len(model) > capacity:
                model.popitem(last=False)
        if step % 97 == 0:
            universe = [f"run-{i}" for i in range(3 * capacity + 5)]
            assert [n for n in universe if n in names] == [n for n in universe if n in model], step
            assert len(names) == len(model)


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        RecentNames(0)
