"""``service.freeze_started``: a started service's cyclic garbage is collected once, and what it keeps is left out
of the cyclic collector's later passes (issue 30, idle p99: those passes over a started service took 40-120 ms of
a run's path)."""

from __future__ import annotations

import gc
import weakref

from taugrid.service import freeze_started


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_what_a_start_left_in_cycles_is_freed_and_what_it_keeps_is_frozen() -> None:
    gc.unfreeze()
    gc.disable()  # so that only freeze_started's own collection can free the cycle below
    try:
        left = _Node()
        gone = weakref.ref(left)
        del left
        kept = _Node()
        assert gone() is not None
        freeze_started()
        assert gone() is None  # collected before the freeze, not kept for the process's life
        assert gc.get_freeze_count() > 0
        assert all(o is not kept for o in gc.get_objects())  # frozen: in no generation the collector passes over
    finally:
        gc.unfreeze()
        gc.enable()
