"""A run's hash-chained ledger: one entry per run event, each entry committing to the one before it.

Pure (no I/O). Invariants:
- ``entry.hash`` = sha256 of the canonical JSON (sorted keys, no whitespace) of the entry without ``hash``;
  ``entry.prev`` is the previous entry's hash, ``GENESIS`` (64 zeros) for the first; ``entry.index`` counts
  from 0. Changing any field of any entry breaks that entry's hash or the next entry's ``prev``.
- ``append`` (and ``extend``) is idempotent by event id: a redelivered event is never appended twice.
- The seal is claimed once per run (``claim_seal``): the first terminal event to claim it wins, and a later
  terminal event (a duplicate, or a racing cancel vs. give-up) leaves the claim as it is.
- A sealed ledger is stored as its seal alone (``seal_only``, issue 27): the entries are in the sealed bundle, whose
  digest the seal keeps, and the seal keeps the chain's head and (``index + 1``) its length, so the entries read
  back from the bundle are the sealed ones only when the bundle hashes to the digest, the chain is unbroken, as
  long, and ends at the head (``with_entries``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Annotated, Any, Protocol

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


class Seal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The terminal event that won the seal, and (once written) the bundle it produced and the chain it closes."""

    event_id: str
    type: str
    attempt: int
    index: int  # ledger index of the terminal entry; the bundle covers entries[: index + 1]
    bundle: str = ""
    digest: str = ""
    # Written by releases that updated the ledger after publishing evidence.sealed; RUNS holding the announcement
    # is the record of it now (the ledger is written once, at the seal), so a current ledger keeps False.
    emitted: bool = False
    # The hash of the terminal entry (``entries[index]``): what the bundle's ledger must end at when the stored
    # ledger keeps the seal alone (``seal_only``). "" in a seal written before issue 27's cut.
    head: str = ""


class Ledger(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    run_id: str
    workspace: str = ""
    schema: str = SCHEMA
    entries: tuple[Entry, ...] = ()
    seal: Seal | None = None

    @property
    def in_bundle(self) -> bool:
        """Stored as its seal alone: the entries are the sealed bundle's (``with_entries`` reads them back)."""
        return not self.entries and self.seal is not None and bool(self.seal.head)

    @property
    def head(self) -> str:
        if self.entries:
            return self.entries[-1].hash
        return self.seal.head if self.in_bundle and self.seal is not None else GENESIS

    @property
    def count(self) -> int:
        """How many entries the chain has, whether they are held here or in the sealed bundle."""
        if self.entries:
            return len(self.entries)
        return self.seal.index + 1 if self.in_bundle and self.seal is not None else 0

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


def seal_only(ledger: Ledger) -> Ledger:
    """What the ``ledger`` KV keeps of a sealed run (issue 27: the entries were stored twice, here and in the
    bundle): the seal with the chain's head, the entries left to the bundle its digest names, and so the terminal
    event's id, which is the last of them (``with_entries`` puts it back). A ledger with entries past its terminal
    one (written per event by an earlier release: the bundle does not hold them) or not sealed with a digest yet
    is kept whole."""
    seal = ledger.seal
    if seal is None or not _HEX64.fullmatch(seal.digest) or len(ledger.entries) != seal.index + 1:
        return ledger
    return msgspec.structs.replace(
        ledger, entries=(), seal=msgspec.structs.replace(seal, event_id="", head=ledger.entries[seal.index].hash))


def with_entries(ledger: Ledger, entries: list[Entry] | tuple[Entry, ...]) -> tuple[Ledger, list[str]]:
    """A ledger stored as its seal alone (``seal_only``) with ``entries``, read from the sealed bundle, its seal's
    terminal event id put back, and every reason they are not the chain the seal closes (empty when they are): a
    break in the chain, another length than the seal's, another head, a last entry of another type or attempt.
    The caller checks that the bundle hashes to the seal's digest (which covers these entries). A ledger that holds
    its entries is returned as it is."""
    seal = ledger.seal
    if not ledger.in_bundle or seal is None:
        return ledger, []
    problems = [f"bundle ledger: {p}" for p in verify_entries(entries)]
    if len(entries) != seal.index + 1:
        problems.append(f"the sealed bundle's ledger has {len(entries)} entries, the seal on the bus records "
                        f"{seal.index + 1}")
    if not entries:
        return ledger, problems
    last = entries[-1]
    if last.hash != seal.head:
        problems.append(f"the sealed bundle's ledger ends at {last.hash[:12]}…, the seal on the bus records the "
                        f"head {seal.head[:12]}… (one of them was rewritten)")
    if (last.type, last.attempt) != (seal.type, seal.attempt):
        problems.append(f"the sealed bundle's ledger ends at {last.type} of attempt {last.attempt}, the seal on the "
                        f"bus records {seal.type} of attempt {seal.attempt}")
    return msgspec.structs.replace(ledger, entries=tuple(entries),
                                   seal=msgspec.structs.replace(seal, event_id=last.event_id)), problems


def prefix(ledger: Ledger, index: int) -> tuple[Entry, ...]:
    """Entries ``0..index`` inclusive: the part of the chain a bundle sealed at ``index`` commits to."""
    return ledger.entries[: index + 1]


_HEX64 = re.compile(r"[0-9a-f]{64}")
_Sha256 = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]


class _SealOnly(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A ledger stored as its seal alone (``seal_only``), as a MessagePack array: ~100 bytes where its JSON took
    ~270 gzip-compressed (issue 27: the key's subject and headers are another ~130 a run). Its first byte is a
    MessagePack fixarray's (0x97, 0x98), never a JSON ledger's ``{`` nor gzip's 0x1f."""

    run_id: str
    workspace: str
    type: str
    attempt: int
    index: int
    digest: _Sha256
    head: _Sha256
    bundle: str = ""  # "" when the bundle has its usual name (``bundle.bundle_name``)


def encode(ledger: Ledger) -> bytes:
    """The ``ledger`` KV value. A ledger stored as its seal alone (``seal_only``): ``_SealOnly``. Else its JSON
    (defaults left out) gzip-compressed (``packing``; issue 27: each entry's ``prev`` repeats the hash before it,
    so a whole ledger stores in under a third of its JSON). Never hashed: entry hashes are over ``canonical``
    entries, the seal's digest over the bundle."""
    seal = ledger.seal
    if ledger.in_bundle and seal is not None and not seal.event_id:
        default = f"runs/{ledger.run_id}/bundle.json"  # bundle.bundle_name (the bundle module imports this one)
        return msgspec.msgpack.encode(_SealOnly(
            run_id=ledger.run_id, workspace=ledger.workspace, type=seal.type, attempt=seal.attempt,
            index=seal.index, digest=bytes.fromhex(seal.digest), head=bytes.fromhex(seal.head),
            bundle="" if seal.bundle == default else seal.bundle))
    return packing.pack(msgspec.json.encode(ledger))


def decode(data: bytes) -> Ledger:
    """A ``ledger`` KV value: a seal alone (``_SealOnly``), a compressed ledger, or (written by earlier releases)
    plain JSON; ``packing.PackingError`` (a ``ValueError``) when it does not inflate, ``msgspec.DecodeError``
    (also a ``ValueError``) when it is none of them."""
    if data[:1] in (b"\x97", b"\x98"):
        kept = msgspec.msgpack.decode(data, type=_SealOnly)
        return Ledger(run_id=kept.run_id, workspace=kept.workspace, seal=Seal(
            event_id="", type=kept.type, attempt=kept.attempt, index=kept.index,
            bundle=kept.bundle or f"runs/{kept.run_id}/bundle.json", digest=kept.digest.hex(), head=kept.head.hex()))
    return msgspec.json.decode(packing.unpack(data), type=Ledger)
