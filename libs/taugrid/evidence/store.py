"""The ledger in the ``ledger`` KV bucket and the sealed bundle in the ``evidence`` object store.

Invariants:
- One KV key per run (``run.<workspace>.<run_id>``, so people's permissions can confine reads to their
  workspaces' ledgers); every write is a compare-and-set on the revision read, and a lost
  race re-reads and re-applies the (idempotent) change, so concurrent replicas never fork or drop entries.
- A run is sealed once: the first terminal event to claim the seal wins (``ledger.claim_seal`` under CAS).
- Sealing is idempotent: a bundle already stored for the winning terminal event is reused as it is, never
  rebuilt or overwritten; a fresh collection of the same stream contents yields identical bytes.
- ``digest`` = sha256 (hex) of the stored bundle bytes; large attempt logs are separate objects whose sha256
  the bundle records, so the bundle digest covers them too.
- A ``LedgerCache`` only saves the read before a write: its revision is the CAS precondition, so an entry made
  stale by another replica fails the write and the ledger is re-read. ``Event``s remembered from the consumer
  are the same messages ``collect`` would otherwise fetch back from RUNS by sequence.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from taugrid.bus import kv, streams
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.bus.objects import read as read_object
from taugrid.bus.objects import write as put_object
from taugrid.bus.platformread import PlatformReader
from taugrid.bus.replay import replay
from taugrid.config.platform import Platform
from taugrid.core.contracts import EvidenceSealed, ExecRunning, LogChunk, PolicyApproved
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.events import TERMINAL_EVENTS, parse_run_subject
from taugrid.core.ids import token
from taugrid.core.quantity import parse_memory
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.local import scratch

log = logging.getLogger(__name__)
BUCKET = "ledger"
_CAS_TRIES = 30


def key(workspace: str, run_id: str) -> str:
    return f"run.{token(workspace)}.{token(run_id)}"


def run_of(ev: Event) -> tuple[str, str]:
    """(workspace, run_id) of a run event: the workspace its subject names (what the server's permissions
    vouch for), else its ``ce-workspace``; the run from ``ce-subject``, else the subject."""
    try:
        ws, run, _ = parse_run_subject(ev.nats_subject)
    except ValueError:
        ws = run = ""
    return ws or ev.workspace, ev.subject or run


async def load(bus: Bus, workspace: str, run_id: str) -> tuple[lg.Ledger | None, int]:
    found = await kv.get(bus, BUCKET, key(workspace, run_id))
    if found is None or not found.value:
        return None, 0
    return lg.decode(found.value), found.revision


async def find(bus: Bus, run_id: str) -> lg.Ledger | None:
    """The ledger of ``run_id`` in whichever workspace holds it (one wildcard direct get: services and
    platform admins; people name the workspace, ``load``)."""
    raw = await kv.last_by_wildcard(bus, BUCKET, f"run.*.{token(run_id)}")
    return lg.decode(raw) if raw else None


class LedgerCache:
    """The ledgers this process last wrote, by KV key, with their revisions (bounded, least recently used out)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[lg.Ledger, int]] = OrderedDict()

    def take(self, ledger_key: str) -> tuple[lg.Ledger, int] | None:
        return self._entries.pop(ledger_key, None)

    def forget(self, ledger_key: str) -> None:
        """Drop a ledger that will not be written again soon (its run is sealed and announced)."""
        self._entries.pop(ledger_key, None)

    def __contains__(self, ledger_key: str) -> bool:
        return ledger_key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ledger_key: str, ledger: lg.Ledger, revision: int) -> None:
        self._entries[ledger_key] = (ledger, revision)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


async def update(
    bus: Bus, workspace: str, run_id: str, change: Callable[[lg.Ledger], lg.Ledger], *,
    cache: LedgerCache | None = None,
) -> lg.Ledger:
    """Apply ``change`` to the run's ledger with compare-and-set; a no-op change writes nothing."""
    k = key(workspace, run_id)
    for _ in range(_CAS_TRIES):
        cached = cache.take(k) if cache is not None else None
        current, revision = cached if cached is not None else await load(bus, workspace, run_id)
        base = current if current is not None else lg.Ledger(run_id=run_id, workspace=workspace)
        new = change(base)
        if current is not None and new == current:
            if cached is not None:
                continue  # a redelivery: decide on the stored ledger, never on a copy another replica outdated
            if cache is not None:
                cache.put(k, current, revision)
            return current
        try:
            written = await kv.save(bus, BUCKET, k, lg.encode(new), revision=revision)
        except kv.Conflict:
            await asyncio.sleep(0.005)
            continue
        if cache is not None:
            cache.put(k, new, int(written))
        return new
    raise TemporaryError(f"ledger contention on {run_id}", delay=0.2)


async def record(bus: Bus, ev: Event, *, cache: LedgerCache | None = None) -> lg.Ledger:
    """Append ``ev`` (once), claim the seal if it is the first terminal event, note an ``evidence.sealed``."""
    workspace, run_id = run_of(ev)

    def change(ledger: lg.Ledger) -> lg.Ledger:
        ledger = lg.append(ledger, ev)
        if ev.type in TERMINAL_EVENTS:
            ledger = lg.claim_seal(ledger, ev)
        elif ev.type == "evidence.sealed":
            ledger = lg.mark_emitted(ledger)
        return ledger

    return await update(bus, workspace, run_id, change, cache=cache)


async def mark_emitted(bus: Bus, workspace: str, run_id: str, *, cache: LedgerCache | None = None) -> lg.Ledger:
    return await update(bus, workspace, run_id, lg.mark_emitted, cache=cache)


def sealed_payload(ledger: lg.Ledger) -> EvidenceSealed:
    seal = ledger.seal
    if seal is None or not seal.digest:
        raise ValueError(f"run {ledger.run_id} is not sealed")
    return EvidenceSealed(
        attempt=seal.attempt,
        terminal_state=b.terminal_state(seal.type),
        bundle=seal.bundle,
        digest=seal.digest,
        ledger_head=ledger.entries[seal.index].hash,
        entries=seal.index + 1,
    )


async def read_bundle(bus: Bus, run_id: str) -> tuple[bytes, dict[str, Any]] | None:
    """The stored bundle's bytes and its decoded JSON (for ``tau evidence RUN``), or None when not sealed."""
    data = await read_object(bus, b.bundle_name(run_id))
    if data is None:
        return None
    return data, msgspec.json.decode(data)


async def collect(
    bus: Bus, ledger: lg.Ledger, *, known: Mapping[int, Event] | None = None
) -> tuple[bytes, dict[str, bytes]]:
    """The canonical bundle bytes for the ledger's seal, and the separate log objects it references.

    ``known``: events already in hand, by stream sequence (the consumer delivered them); the rest are fetched.
    """
    seal = ledger.seal
    if seal is None:
        raise ValueError(f"run {ledger.run_id} has no terminal event yet")
    run_id = ledger.run_id
    terminal = ledger.entries[seal.index]
    # Direct gets by the sequences the ledger recorded: O(entries), where a filtered replay would make the
    # server scan every subject of RUNS for each sealed run.
    events = []
    for entry in ledger.entries:
        if not entry.seq:
            continue
        held = known.get(entry.seq) if known is not None else None
        if held is not None and held.id == entry.event_id:
            events.append(held)
            continue
        stored = await streams.at(bus, "RUNS", entry.seq)
        if stored is None:
            continue  # aged out of RUNS (max_age); the ledger still proves it existed
        events.append(stored)
    # The bundle covers the run up to its terminal event; later events (evidence.sealed, a losing terminal
    # event) must not change the bytes of a bundle that is collected again.
    events = [ev for ev in events if ev.seq <= terminal.seq] if terminal.seq else events
    workspace = ledger.workspace or next((ev.workspace for ev in events if ev.workspace), "")

    chunks: dict[int, list[LogChunk]] = {}
    log_subject = f"log.*.{token(run_id)}.*"
    has_logs = await streams.holds(bus, "LOGS", log_subject)
    log_msgs = await replay(bus, stream="LOGS", subject=log_subject) if has_logs else []
    for m in log_msgs:
        try:
            chunk = msgspec.json.decode(m.data, type=LogChunk)
        except msgspec.DecodeError:
            continue  # not a LogChunk: nothing we can order or attribute
        tail = m.subject.rsplit(".", 1)[-1]
        chunks.setdefault(chunk.attempt or (int(tail) if tail.isdigit() else 0), []).append(chunk)
    logs: dict[int, dict[str, Any]] = {}
    extra: dict[str, bytes] = {}
    for attempt in sorted(chunks):
        text, count = b.render_logs(chunks[attempt])
        section, blob = b.log_section(run_id, attempt, text, count)
        logs[attempt] = section
        if blob is not None:
            extra[section["object"]] = blob

    approved: list[PolicyApproved] = [
        ev.payload(PolicyApproved) for ev in events if ev.type == "policy.approved"
    ]
    resolved = approved[-1].run if approved else None

    pods = sorted({ev.payload(ExecRunning).pod for ev in events if ev.type == "exec.running"} - {""})
    keeper = b.Keeper(run_id, keep_outputs_budget())

    def scan() -> dict[str, Any]:
        found: dict[str, Any] = {
            "output_dir": b.scan_dir(resolved.output_dir if resolved else "", metrics=True, keeper=keeper),
            "checkpoint_dir": b.scan_dir(resolved.checkpoint_dir if resolved else "", metrics=False,
                                         keeper=keeper),
        }
        written = scratch_writes(pods)
        if written:
            found["scratch"] = written
        return found

    outputs = await asyncio.to_thread(scan)
    extra.update(keeper.blobs)
    price, price_revision = await _gpu_hour_price(bus, approved[-1] if approved else None)
    doc = b.build(
        run_id=run_id,
        workspace=workspace,
        seal=seal,
        ledger=lg.prefix(ledger, seal.index),
        events=events,
        logs=logs,
        outputs=outputs,
        gpu_hour_price=price,
        price_revision=price_revision,
    )
    return b.encode(doc), extra


async def _gpu_hour_price(bus: Bus, approved: PolicyApproved | None) -> tuple[float, int]:
    """(price of a GPU-hour on the run's compute profile, the platform revision it comes from) as the platform
    stood when the run was approved; (0, 0) when the run was never approved or that revision (or the profile)
    is no longer kept, so the bundle never prices a run with a later platform's numbers."""
    if approved is None:
        return 0.0, 0
    revision = approved.platform_revision or approved.run.platform_revision
    if not revision:
        return 0.0, 0
    platform = await PlatformReader(bus).at(revision)  # a TemporaryError retries the seal, never prices it 0
    if not isinstance(platform, Platform):
        return 0.0, 0
    profile = next((p for p in platform.compute_profiles if p.name == approved.run.profile), None)
    return (profile.gpu_hour_price, revision) if profile is not None else (0.0, 0)


def keep_outputs_budget() -> int:
    """Bytes of small output files copied into the object store per run (``TAU_EVIDENCE_KEEP_OUTPUTS``, a
    quantity such as 64Mi; default 0: locally the files are on this machine already)."""
    raw = os.environ.get("TAU_EVIDENCE_KEEP_OUTPUTS", "").strip()
    if not raw:
        return 0
    try:
        return max(0, parse_memory(raw))
    except ValueError:
        log.error("TAU_EVIDENCE_KEEP_OUTPUTS=%r is not a quantity (e.g. 64Mi); keeping no outputs", raw)
        return 0


def scratch_writes(pods: list[str]) -> list[dict[str, Any]]:
    """What local pods of the run wrote under their scratch working directory (``taugrid.local.scratch``),
    read from the embedded stack's data dir; nothing elsewhere (Kubernetes has no such files)."""
    data_dir = os.environ.get("TAU_DATA_DIR")
    if not data_dir:
        return []
    out = []
    for pod in pods:
        doc = scratch.read(Path(data_dir) / "pods" / pod)
        if doc is not None:
            out.append({"pod": pod, **doc})
    return out


def _commits_to(data: bytes, seal: lg.Seal) -> bool:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return isinstance(doc, dict) and doc.get("terminal", {}).get("event_id") == seal.event_id


async def seal(
    bus: Bus, workspace: str, run_id: str, terminal_event: Event, *, cache: LedgerCache | None = None,
    known: Mapping[int, Event] | None = None,
) -> EvidenceSealed:
    """Seal the run: store its bundle once and return the ``evidence.sealed`` payload (the caller publishes).

    When another terminal event already won the seal, the bundle describes that one (first wins).
    """
    if terminal_event.type not in TERMINAL_EVENTS:
        raise PermanentError(
            f"{terminal_event.type} is not terminal; a run is sealed on one of " f"{sorted(TERMINAL_EVENTS)}"
        )
    ledger = await record(bus, terminal_event, cache=cache)
    claim = ledger.seal
    assert claim is not None  # record() claims on a terminal event when nobody has
    name = b.bundle_name(run_id)
    existing = await read_object(bus, name)
    if existing is not None and _commits_to(existing, claim):
        digest = lg.sha256(existing)  # already sealed (maybe by a replica that died before the KV write)
    else:
        data, extra = await collect(bus, ledger, known=known)
        for obj, blob in sorted(extra.items()):
            await put_object(bus, obj, blob, workspace=workspace)
        await put_object(bus, name, data, workspace=workspace)
        digest = lg.sha256(data)

    def settle(current: lg.Ledger) -> lg.Ledger:
        s = current.seal
        if s is None or s.event_id != claim.event_id or (s.bundle, s.digest) == (name, digest):
            return current
        return msgspec.structs.replace(current, seal=msgspec.structs.replace(s, bundle=name, digest=digest))

    return sealed_payload(await update(bus, workspace, run_id, settle, cache=cache))
