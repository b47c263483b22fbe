"""A run's hash-chained ledger: one entry per run event, each entry committing to the one before it.

Pure (no I/O). Invariants:
- ``entry.hash`` = sha256 of the canonical JSON (sorted keys, no whitespace) of the entry without ``hash``;
  ``entry.prev`` is the previous entry's hash, ``GENESIS`` (64 zeros) for the first; ``entry.index`` counts
  from 0. Changing any field of any entry breaks that entry's hash or the next entry's ``prev``.
- ``append`` (and ``extend``) is idempotent by event id: a redelivered event is never appended twice.
- The seal is claimed once per run (``claim_seal``): the first terminal event to claim it wins, and a later
  terminal event (a duplicate, or a racing cancel vs. give-up) leaves the claim as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Protocol

import msgspec

from taugrid.core.events import TERMINAL_EVENTS
from taugrid.evidence import packing

GENESIS = "0" * 64
SCHEMA = "taugrid.ledger/v1"


class LedgerEvent(Protocol):
    """What the ledger reads from an event (``taugrid.bus.envelope.Event`` satisfies it)."""

    id: str
    type: str
    source: str
    subject: str
    time: str
    data: bytes
    attempt: int
    traceparent: str
    seq: int


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    seq: int
    event_id: str
    type: str
    attempt: int
    time: str
    source: str
    traceparent: str
    payload_sha256: str
    prev: str
    hash: str = ""


class Seal(msgspec.Struct, frozen=True, kw_only=True):
    """The terminal event that won the seal, and (once written) the bundle it produced."""

    event_id: str
    type: str
    attempt: int
    index: int  # ledger index of the terminal entry; the bundle covers entries[: index + 1]
    bundle: str = ""
    digest: str = ""
    # Written by releases that updated the ledger after publishing evidence.sealed; RUNS holding the announcement
    # is the record of it now (the ledger is written once, at the seal), so a current ledger keeps False.
    emitted: bool = False


class Ledger(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    workspace: str = ""
    schema: str = SCHEMA
    entries: tuple[Entry, ...] = ()
    seal: Seal | None = None

    @property
    def head(self) -> str:
        return self.entries[-1].hash if self.entries else GENESIS

    def find(self, event_id: str) -> Entry | None:
        for e in self.entries:
            if e.event_id == event_id:
                return e
        return None


def canonical(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8. Used for every hash and digest."""
    return msgspec.json.encode(value, order="sorted")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_hash(entry: Entry) -> str:
    body = msgspec.to_builtins(entry)
    body.pop("hash", None)
    return sha256(canonical(body))


def make_entry(event: LedgerEvent, *, index: int, prev: str) -> Entry:
    draft = Entry(
        index=index,
        seq=int(event.seq),
        event_id=event.id,
        type=event.type,
        attempt=int(event.attempt),
        time=event.time,
        source=event.source,
        traceparent=event.traceparent,
        payload_sha256=sha256(event.data or b""),
        prev=prev,
    )
    return msgspec.structs.replace(draft, hash=entry_hash(draft))


def append(ledger: Ledger, event: LedgerEvent) -> Ledger:
    """The ledger with ``event`` appended; the same ledger when the event id is already in it."""
    if ledger.find(event.id) is not None:
        return ledger
    entry = make_entry(event, index=len(ledger.entries), prev=ledger.head)
    return msgspec.structs.replace(ledger, entries=(*ledger.entries, entry))


def extend(ledger: Ledger, events: Iterable[LedgerEvent]) -> Ledger:
    """``append`` of each event in turn, in linear time (a run's whole history at its seal)."""
    seen = {e.event_id for e in ledger.entries}
    entries = list(ledger.entries)
    for event in events:
        if event.id in seen:
            continue
        seen.add(event.id)
        entries.append(make_entry(event, index=len(entries), prev=entries[-1].hash if entries else GENESIS))
    if len(entries) == len(ledger.entries):
        return ledger
    return msgspec.structs.replace(ledger, entries=tuple(entries))


def claim_seal(ledger: Ledger, event: LedgerEvent) -> Ledger:
    """Claim the run's seal for a terminal event already in the ledger; first claim wins."""
    if ledger.seal is not None or event.type not in TERMINAL_EVENTS:
        return ledger
    entry = ledger.find(event.id)
    if entry is None:
        raise ValueError(f"event {event.id} is not in the ledger of {ledger.run_id}; append it first")
    return msgspec.structs.replace(
        ledger, seal=Seal(event_id=entry.event_id, type=entry.type, attempt=entry.attempt, index=entry.index)
    )


def verify_entries(entries: tuple[Entry, ...] | list[Entry]) -> list[str]:
    """Every break in the chain, phrased as what is wrong at which index (empty when intact)."""
    problems: list[str] = []
    prev = GENESIS
    seen: set[str] = set()
    for i, e in enumerate(entries):
        if e.index != i:
            problems.append(f"entry {i}: index is {e.index}, expected {i}")
        if e.prev != prev:
            problems.append(
                f"entry {i} ({e.type}): prev {e.prev[:12]}… does not match the hash of entry {i - 1}"
            )
        actual = entry_hash(e)
        if e.hash != actual:
            problems.append(
                f"entry {i} ({e.type}): stored hash {e.hash[:12]}… != recomputed {actual[:12]}… "
                "(the entry was modified)"
            )
        if e.event_id in seen:
            problems.append(f"entry {i} ({e.type}): event {e.event_id} appears twice")
        seen.add(e.event_id)
        prev = e.hash
    return problems


def verify(ledger: Ledger) -> list[str]:
    problems = verify_entries(ledger.entries)
    seal = ledger.seal
    if seal is not None and (
        seal.index >= len(ledger.entries) or ledger.entries[seal.index].event_id != seal.event_id
    ):
        problems.append(f"seal: terminal event {seal.event_id} is not at ledger index {seal.index}")
    return problems


def prefix(ledger: Ledger, index: int) -> tuple[Entry, ...]:
    """Entries ``0..index`` inclusive: the part of the chain a bundle sealed at ``index`` commits to."""
    return ledger.entries[: index + 1]


def encode(ledger: Ledger) -> bytes:
    """The ``ledger`` KV value: the ledger's JSON gzip-compressed (``packing``; issue 27: each entry's ``prev``
    repeats the hash before it, so a run's ledger stores in under a third of its JSON). Never hashed: entry hashes
    are over ``canonical`` entries."""
    return packing.pack(msgspec.json.encode(ledger))


def decode(data: bytes) -> Ledger:
    """A ``ledger`` KV value, compressed or (written by earlier releases) plain JSON; ``packing.PackingError`` (a
    ``ValueError``) when it does not inflate."""
    return msgspec.json.decode(packing.unpack(data), type=Ledger)
