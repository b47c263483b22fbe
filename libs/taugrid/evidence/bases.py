"""Bases: what a workspace's bundles have in common, stored once (issue 27 item 2: bundles deduplicated).

A base is the canonical JSON of a bundle the evidence service sealed in the workspace (its last
``packing.DICTIONARY_BYTES``: what deflate can refer back to), stored as ``bases/<workspace>/<sha256 of those
bytes>``. Later bundles of the workspace are stored deflated against it (``packing.pack_against``): what the
runs of one tau.yaml, or a sweep's variants of it, repeat (the config's text and parse, the resolved run, the
rendered manifests, the events' layout) is stored once, in the base, and each bundle stores what is its own (its
ids, times, hashes, signature, exit). A config diffed field by field would miss most of it: the manifests and
the resolved run name the run id, and a sweep changes the config's text itself.

Invariants:
- Content-addressed and write-once: a base's name carries its sha256; it is written before the first bundle that
  refers to it and never deleted (the archive copies it and leaves it on the bus, where bundles sealed since and
  later read with it), so nothing counts references. Bases are few: one per workspace and evidence-service
  process, and a new one when a bundle gains little from the current one (``REBASE_GAIN``): at once for the
  workspace's first ``EARLY_BASES`` (its first run may be one unlike the rest, a rejected one), then at most
  once every ``REBASE_AFTER`` bundles stored against the current one.
- Stored under the workspace's chunk subjects (``objects.write``): whoever may read a workspace's bundles may
  read its bases, and no one else.
- The seal's digest stays the sha256 of the canonical JSON a bundle inflates to, so a base changed or lost can
  only fail verification. A reader checks the base's bytes against the sha256 its name carries first, so the
  failure names the base (``BaseMissing``, ``BaseModified``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from taugrid.bus import objects
from taugrid.bus.connection import Bus
from taugrid.core.ids import token
from taugrid.evidence import archive, packing
from taugrid.evidence.ledger import sha256

REBASE_AFTER = 100  # bundles stored against a base before a poor match may replace it (bounds bases per run)
EARLY_BASES = 3  # bases a workspace may replace at once when a bundle gains too little from them
REBASE_GAIN = 0.6  # a bundle whose delta is over this share of its plain gzip gains too little from its base
POOR_SHARE = 0.1  # below this share of its JSON a delta is good (a trivial run's: ~7 %; plain gzip: ~21 %)
WORKSPACES_HELD = 64  # current bases kept in memory (each at most packing.DICTIONARY_BYTES)
READ_HELD = 64  # bases read back and checked, kept per connection for readers (never for ``tau verify``)


def base_name(workspace: str, dictionary: bytes) -> str:
    return f"bases/{token(workspace)}/{sha256(dictionary)}"


class BaseMissing(packing.PackingError):
    """A bundle stored against a base that neither the bus nor the archive holds."""


class BaseModified(packing.PackingError):
    """A base whose bytes do not hash to the sha256 its name carries."""


@dataclass
class _Current:
    name: str
    dictionary: bytes
    made: int  # bases this process made for the workspace, this one included
    stored: int = 0  # bundles stored against it


class Bases:
    """The evidence service's current base per workspace (in memory: a restarted service starts new ones)."""

    def __init__(self) -> None:
        self._current: OrderedDict[str, _Current] = OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def pack(self, bus: Bus, workspace: str, canonical: bytes) -> bytes:
        """The bytes to store for the bundle ``canonical`` of ``workspace``: deflated against the workspace's
        base (made from this bundle when there is none yet, or when the current one gains it too little and has
        served ``REBASE_AFTER`` bundles), or plain gzip when that is smaller."""
        ws = token(workspace)
        lock = self._locks.get(ws)
        if lock is None:
            lock = self._locks[ws] = asyncio.Lock()
        async with lock:  # concurrent seals of one workspace make one base, not one each
            current = self._current.get(ws)
            if current is None:
                current = await self._new(bus, workspace, canonical)
            stored = packing.pack_against(canonical, base=current.name, dictionary=current.dictionary)
            current.stored += 1
            self._current.move_to_end(ws)
            if len(stored) <= POOR_SHARE * len(canonical):
                return stored
            plain = packing.pack(canonical)
            if len(stored) > REBASE_GAIN * len(plain) and (current.made < EARLY_BASES
                                                           or current.stored > REBASE_AFTER):
                current = await self._new(bus, workspace, canonical)  # the workspace's runs changed: follow them
                stored = packing.pack_against(canonical, base=current.name, dictionary=current.dictionary)
            return stored if len(stored) < len(plain) else plain

    async def _new(self, bus: Bus, workspace: str, canonical: bytes) -> _Current:
        dictionary = canonical[-packing.DICTIONARY_BYTES:]
        name = base_name(workspace, dictionary)
        if not await objects.exists(bus, name):
            await objects.write(bus, name, packing.pack(dictionary), workspace=workspace)
        before = self._current.get(token(workspace))
        current = self._current[token(workspace)] = _Current(name, dictionary, made=before.made + 1 if before else 1)
        while len(self._current) > WORKSPACES_HELD:
            self._current.popitem(last=False)
        return current


_WRITERS: weakref.WeakKeyDictionary[Bus, Bases] = weakref.WeakKeyDictionary()
_READ: weakref.WeakKeyDictionary[Bus, OrderedDict[str, bytes]] = weakref.WeakKeyDictionary()


def writer(bus: Bus) -> Bases:
    """The bases of bundles stored through ``bus`` (one set per connection: a base lives on one bus)."""
    found = _WRITERS.get(bus)
    if found is None:
        found = _WRITERS[bus] = Bases()
    return found


async def unpack(bus: Bus, stored: bytes, *, fresh: bool = False) -> bytes:
    """The canonical JSON of a stored bundle, reading its base when it has one (from the bus, else the evidence
    archive) and checking it against its name first. ``fresh``: read the base again even when this connection
    checked it before (``tau verify`` re-checks everything). ``packing.PackingError`` (``BaseMissing``,
    ``BaseModified``: naming the base) when it cannot be read back."""
    name = packing.base_of(stored)
    if not name:
        return packing.unpack(stored)
    held = _READ.get(bus)
    if held is None:
        held = _READ[bus] = OrderedDict()
    dictionary = None if fresh else held.get(name)
    if dictionary is None:
        dictionary = await read_base(bus, name)
        held[name] = dictionary
        while len(held) > READ_HELD:
            held.popitem(last=False)
    return packing.unpack(stored, dictionary=dictionary)


async def read_base(bus: Bus, name: str) -> bytes:
    """The bytes of base ``name``, checked against the sha256 its name carries."""
    raw, where = await archive.read_object(bus, name)
    if raw is None:
        raise BaseMissing(f"its base {name} is missing from the evidence object store (and from the evidence "
                          f"archive, when the platform names one)")
    try:
        return packing.dictionary_of(name, raw)
    except packing.PackingError as exc:
        raise BaseModified(f"{exc}" + (f" (read from the archive, {where})" if where else "")) from exc
