"""A bounded set of the names most recently added, held with no Python object per name.

Why (issue 27): the local cluster remembers the names of the last 20,000 workloads that finished, so that a
redelivered apply of one is not run again. Held as strings in an ``OrderedDict``, each name and its node were
small objects allocated one by one as runs ended, all through a large backlog: the live ones, scattered over
CPython's 1 MiB arenas, kept arenas that everything else had left from returning to the system. Here a name is
its 64-bit digest in two flat arrays (one allocation each, outside those arenas): the order the names came in (a
ring) and an open-addressing table for membership.

Two names with the same digest would read as one: at 20,000 names held the chance that a new name is taken for a
remembered one is about 20,000 / 2**64 (1e-15) per look-up.
"""

from __future__ import annotations

import hashlib
import os
from array import array

_EMPTY = 0  # a table slot never used (ends a probe); a ring slot with no name (one discarded)
_GONE = 1  # a table slot whose name was removed (a probe goes past it)


# Keyed per process (nothing here outlives it): a name chosen to share another's digest cannot be worked out
_KEY = os.urandom(16)


def _digest(name: str) -> int:
    d = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8, key=_KEY).digest(), "little")
    return d if d > _GONE else d + 2  # 0 and 1 mark slots


class RecentNames:
    """The last ``capacity`` names added (``add``), oldest forgotten first; ``in``, ``discard``, ``len``."""

    __slots__ = ("_capacity", "_ring", "_head", "_used", "_count", "_table", "_mask", "_gone")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self.clear()

    def clear(self) -> None:
        # the digests in the order added, from the oldest at ``_head`` over ``_used`` slots (a discarded name's
        # slot stays, empty, until the ring is closed up)
        self._ring = array("Q", bytes(8 * self._capacity))
        self._head = self._used = self._count = 0
        self._new_table()

    def _new_table(self) -> None:
        # names at most two thirds of it, removed slots an eighth: probes of a few slots (20,000 names: 256 KB)
        size = 1 << (3 * self._capacity // 2).bit_length()
        self._table = array("Q", bytes(8 * size))
        self._mask = size - 1
        self._gone = 0

    def _slot(self, digest: int) -> int:
        """The table slot holding ``digest``, else -1."""
        table, mask = self._table, self._mask
        i = digest & mask
        while True:
            held = table[i]
            if held == digest:
                return i
            if held == _EMPTY:
                return -1
            i = (i + 1) & mask

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._slot(_digest(name)) >= 0

    def __len__(self) -> int:
        return self._count

    def add(self, name: str) -> None:
        """Remember ``name`` (already remembered: it keeps its place), forgetting the oldest past the capacity."""
        digest = _digest(name)
        if self._slot(digest) >= 0:
            return
        ring, capacity = self._ring, self._capacity
        if self._count == capacity:  # the oldest name goes (empty slots before it with it)
            while ring[self._head] == _EMPTY:
                self._head, self._used = (self._head + 1) % capacity, self._used - 1
            oldest = ring[self._head]
            ring[self._head] = _EMPTY  # out of the ring first: a table made again takes the ring's names
            self._head, self._used = (self._head + 1) % capacity, self._used - 1
            self._remove(oldest)
        if self._used == capacity:  # every slot used, some of them empty: the ring is closed up
            self._close_up()
        ring = self._ring
        ring[(self._head + self._used) % capacity] = digest
        self._used += 1
        self._count += 1
        table, mask = self._table, self._mask
        i = digest & mask
        while table[i] > _GONE:
            i = (i + 1) & mask
        if table[i] == _GONE:
            self._gone -= 1
        table[i] = digest

    def discard(self, name: str) -> None:
        """Forget ``name`` if remembered."""
        digest = _digest(name)
        if self._slot(digest) < 0:
            return
        self._ring[self._ring.index(digest)] = _EMPTY  # a rare call (a run reserved here again): a scan is fine
        self._remove(digest)

    def _held(self) -> list[int]:
        """The digests held, oldest first."""
        ring, capacity = self._ring, self._capacity
        order = (ring[(self._head + k) % capacity] for k in range(self._used))
        return [d for d in order if d != _EMPTY]

    def _close_up(self) -> None:
        held = self._held()
        self._ring = array("Q", held)
        self._ring.extend(array("Q", bytes(8 * (self._capacity - len(held)))))
        self._head, self._used = 0, len(held)

    def _remove(self, digest: int) -> None:
        self._table[self._slot(digest)] = _GONE
        self._count -= 1
        self._gone += 1
        if self._gone > len(self._table) // 8:  # removed slots lengthen probes: the table is made again
            self._new_table()
            for held in self._held():
                i = held & self._mask
                while self._table[i] != _EMPTY:
                    i = (i + 1) & self._mask
                self._table[i] = held
