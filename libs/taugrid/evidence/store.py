"""The ledger in the ``ledger`` KV bucket and the sealed bundle in the ``evidence`` object store.

Invariants:
- One KV key per run (``run.<workspace>.<run_id>``, so people's permissions can confine reads to their
  workspaces' ledgers), written when the run is sealed: the run's events up to and including its first terminal
  event (RUNS' order) are read back from HISTORY and AUDIT, which keep them as RUNS stored them (``run_history``),
  and chained in that order; a run not sealed yet has no ledger. Every write is a compare-and-set (the first one a
  create), and a lost race re-reads.
- The key keeps the seal alone (``ledger.seal_only``, issue 27: ~250 bytes a run where the whole ledger took
  ~1.4 KB, and the bundle holds the same entries): the bundle's name and digest, the chain's head, its length, the
  terminal event's type and attempt. The entries are read back from the sealed bundle where they are needed
  (``read_ledger``, ``tau verify``), and count as the run's only when the bundle hashes to the seal's digest and
  its chain is unbroken, as long, and ends at the sealed head: only the evidence service writes the key (with
  compare-and-set) and the bundle, and AUDIT's ``evidence.sealed`` and the anchors pin the same digest and head.
- A run is sealed once, by its first terminal event in stream order: whichever terminal event of the run is
  handled (a duplicate, a racing cancel vs. give-up, a second replica), the history read back ends at that first
  one, so every handler builds the same ledger, claim and bundle, and the one whose create lands wins.
- Sealing is idempotent: a bundle already stored for the winning terminal event is reused as it is, never
  rebuilt or overwritten; a fresh collection of the same stream contents yields identical bytes.
- ``digest`` = sha256 (hex) of the bundle's canonical JSON (stored compressed against its workspace's base,
  ``bases.py``, which the digest therefore covers too); large attempt logs are separate objects whose sha256
  the bundle records, so the bundle digest covers them too.
- A ledger written per event by an earlier version (runs in flight across the upgrade) is extended with what it
  lacks, by event id, and sealed the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

from taugrid import settings
from taugrid.bus import history, kv, streams
from taugrid.bus import manifests as stored_manifests
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import SIGNATURE_MAX_AGE_S, Event, from_message, run_traceparent
from taugrid.bus.objects import read as read_object  # noqa: F401  (store.read_object: the bus's copy only)
from taugrid.bus.objects import write as put_object
from taugrid.bus.platformread import shared_reader
from taugrid.bus.replay import replay
from taugrid.config.platform import Platform
from taugrid.core.contracts import (
    EvidenceSealed,
    ExecProgress,
    ExecRunning,
    LogChunk,
    PolicyApproved,
    RenderApplied,
)
from taugrid.core.errors import PermanentError, TauError, TemporaryError
from taugrid.core.events import TERMINAL_EVENTS, parse_run_subject
from taugrid.core.ids import token
from taugrid.core.publishing import source_problem
from taugrid.core.redaction import Redactor
from taugrid.evidence import archive, bases, packing
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.local import scratch
from taugrid.local.secrets import local_store

log = logging.getLogger(__name__)
BUCKET = "ledger"
_CAS_TRIES = 30
T = TypeVar("T")


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
    """The run's ledger as the KV stores it (a sealed one as its seal alone: ``read_ledger`` adds the entries)
    and its revision; (None, 0) when it has none."""
    found = await kv.get(bus, BUCKET, key(workspace, run_id))
    if found is None or not found.value:
        return None, 0
    return lg.decode(found.value), found.revision


async def find(bus: Bus, run_id: str) -> lg.Ledger | None:
    """The ledger of ``run_id`` in whichever workspace holds it (one wildcard direct get: services and
    platform admins; people name the workspace, ``load``)."""
    raw = await kv.last_by_wildcard(bus, BUCKET, f"run.*.{token(run_id)}")
    return lg.decode(raw) if raw else None


async def update(bus: Bus, workspace: str, run_id: str, change: Callable[[lg.Ledger], lg.Ledger]) -> lg.Ledger:
    """Apply ``change`` to the run's ledger with compare-and-set; a no-op change writes nothing."""
    for _ in range(_CAS_TRIES):
        current, revision = await load(bus, workspace, run_id)
        base = current if current is not None else lg.Ledger(run_id=run_id, workspace=workspace)
        new = change(base)
        if current is not None and new == current:
            return current
        try:
            await kv.save(bus, BUCKET, key(workspace, run_id), lg.encode(new), revision=revision)
        except kv.Conflict:
            await asyncio.sleep(0.005)
            continue
        return new
    raise TemporaryError(f"ledger contention on {run_id}", delay=0.2)


async def read_ledger(bus: Bus, workspace: str, run_id: str) -> lg.Ledger | None:
    """The run's ledger with its entries (None when it has no ledger): as the KV stores it when it holds them,
    else read from the sealed bundle (on the bus, else in the evidence archive) and checked against the seal the
    KV keeps (``with_entries``); ``BundleModified`` when the bundle is missing, does not hash to the sealed digest,
    or its ledger is not the sealed chain."""
    ledger, _ = await load(bus, workspace, run_id)
    return None if ledger is None else await with_entries(bus, ledger)


async def with_entries(bus: Bus, ledger: lg.Ledger) -> lg.Ledger:
    """``ledger`` with its entries read from its sealed bundle when the KV keeps its seal alone (see
    ``read_ledger``); as it is otherwise."""
    seal = ledger.seal
    if not ledger.in_bundle or seal is None:
        return ledger
    name = seal.bundle or b.bundle_name(ledger.run_id)
    try:
        data = await read_bundle_bytes(bus, name)
    except (packing.PackingError, bases.BaseMissing, bases.BaseModified) as exc:
        raise BundleModified(f"the ledger of {ledger.run_id} is in its bundle {name}, which cannot be read back: "
                             f"{exc}; run `tau verify {ledger.run_id}`") from exc
    if data is None:
        raise BundleModified(f"the ledger of {ledger.run_id} is in its bundle {name}, which is missing; run "
                             f"`tau verify {ledger.run_id}`")
    if lg.sha256(data) != seal.digest:
        raise BundleModified(f"bundle {name} hashes to {lg.sha256(data)[:12]}…, sealed as {seal.digest[:12]}…: it "
                             f"was modified; run `tau verify {ledger.run_id}`")
    full, problems = lg.with_entries(ledger, bundle_entries(msgspec.json.decode(data)))
    if problems:
        raise BundleModified(f"bundle {name} holds another ledger than the sealed one ({problems[0]}); run "
                             f"`tau verify {ledger.run_id}`")
    return full


def bundle_entries(doc: Any) -> list[lg.Entry]:
    """The ledger entries a decoded bundle holds: listed, or (``b.CHAINED``, issue 27) recomputed from
    its event records (``b.chain_of``), which every reader then checks as it checks listed ones (unbroken, as long
    as the seal, ending at the sealed and announced head); ``msgspec.ValidationError`` (a ``ValueError``) when
    they are not entries."""
    ledger = doc.get("ledger") if isinstance(doc, dict) else None
    held = ledger.get("entries", []) if isinstance(ledger, dict) else []
    if held == b.CHAINED_FROM_EVENTS:
        return b.chain_of(doc.get("events", []))
    if held == b.CHAINED_FROM_RUN_EVENTS:  # counted from the traceparent derived from the run id the bundle names,
        # which its digest covers: another id yields another chain, which misses the sealed head
        return b.chain_of(doc.get("events", []), trace=run_traceparent(str(doc.get("run_id", ""))))
    return msgspec.convert(held, type=list[lg.Entry])


def sealed_payload(ledger: lg.Ledger) -> EvidenceSealed:
    seal = ledger.seal
    if seal is None or not seal.digest:
        raise ValueError(f"run {ledger.run_id} is not sealed")
    return EvidenceSealed(
        attempt=seal.attempt,
        terminal_state=b.terminal_state(seal.type),
        bundle="" if seal.bundle == b.bundle_name(ledger.run_id) else seal.bundle,  # "": the usual name
        digest=seal.digest,
        ledger_head=seal.head or ledger.entries[seal.index].hash,
        entries=seal.index + 1,
    )


async def read_bundle(bus: Bus, run_id: str, *, workspace: str | None = None) -> tuple[bytes, dict[str, Any]] | None:
    """The stored bundle's bytes and its decoded JSON (for ``tau evidence RUN``), or None when not sealed.
    ``workspace``: the run's, as the caller's record says; a bundle of a run of that id in another workspace is
    then None (a reader with broad rights, the portal, must not serve one workspace's bundle for a record
    someone made under the same run id in theirs).
    A bundle read from the evidence archive (``archive.py``: written under other credentials than the bus's) is
    checked against the digest its ledger's seal keeps on the bus before anything of it is shown;
    ``BundleModified`` when it does not hash to it."""
    name = b.bundle_name(run_id)
    stored, where = await archive.read_object(bus, name)
    if stored is None:
        return None
    try:
        data = await bases.unpack(bus, stored)
    except (bases.BaseMissing, bases.BaseModified) as exc:  # the part it shares with other bundles
        raise BundleModified(f"bundle {name} cannot be read back: {exc}; run `tau verify {run_id}`") from exc
    doc = msgspec.json.decode(data)
    theirs = str(doc.get("workspace", "")) if isinstance(doc, dict) else ""
    if workspace is not None and token(theirs) != token(workspace):
        return None
    if where:
        ledger, _ = await load(bus, workspace if workspace is not None else theirs, run_id)
        sealed = ledger.seal.digest if ledger is not None and ledger.seal is not None else ""
        if lg.sha256(data) != sealed:
            raise BundleModified(f"bundle {name} read from the evidence archive ({where}) hashes to "
                                 f"{lg.sha256(data)[:12]}…, sealed as {sealed[:12] or 'nothing'}… on the bus: "
                                 f"it was modified; run `tau verify {run_id}`")
    return data, doc


class BundleModified(TauError):
    """A bundle read from the evidence archive that does not hash to the digest its ledger's seal keeps, or one
    whose base (``bases.py``) is missing or changed (the CLI exits 1, as ``tau verify`` does for a bundle that
    fails)."""


async def read_bundle_bytes(bus: Bus, name: str) -> bytes | None:
    """The canonical JSON of the stored bundle ``name`` (stored compressed, against its workspace's base, or plain
    before compression; ``packing``, ``bases``), or None when absent. What its digest is taken over. Read from the
    bus, else from the evidence archive (``archive.py``) when the platform names one."""
    stored, _ = await archive.read_object(bus, name)
    return None if stored is None else await bases.unpack(bus, stored)


async def collect(
    bus: Bus, ledger: lg.Ledger, *, known: Mapping[int, Event] | None = None
) -> tuple[bytes, dict[str, bytes]]:
    """The canonical bundle bytes for the ledger's seal, and the separate log objects it references.

    ``known``: events already in hand, by RUNS sequence (read for the seal); the rest are read from HISTORY and
    AUDIT.
    """
    seal = ledger.seal
    if seal is None:
        raise ValueError(f"run {ledger.run_id} has no terminal event yet")
    run_id = ledger.run_id
    terminal = ledger.entries[seal.index]
    # The events the ledger recorded, by their RUNS sequence: those in hand, the rest read once from the run's
    # subjects in HISTORY and AUDIT (direct gets, one a message of the run's)
    events = []
    stored: dict[int, Event] | None = None
    for entry in ledger.entries:
        if not entry.seq:
            continue
        held = known.get(entry.seq) if known is not None else None
        if held is None or held.id != entry.event_id:
            if stored is None:
                ws = ledger.workspace or next((ev.workspace for ev in (known or {}).values() if ev.workspace), "")
                stored = {ev.seq: ev for ev in await history.run_events(bus, token(ws), token(run_id))} if ws \
                    else {}
            held = stored.get(entry.seq)
        if held is None:
            continue  # aged out of HISTORY (max_age); the ledger still proves it existed
        events.append(held)
    # The bundle covers the run up to its terminal event; later events (evidence.sealed, a losing terminal
    # event) must not change the bytes of a bundle that is collected again.
    events = [ev for ev in events if ev.seq <= terminal.seq] if terminal.seq else events
    workspace = ledger.workspace or next((ev.workspace for ev in events if ev.workspace), "")

    chunks: dict[int, list[LogChunk]] = {}
    for m in await _log_messages(bus, f"log.*.{token(run_id)}.*", since=_logs_since(events)):
        try:
            chunk = msgspec.json.decode(m.data, type=LogChunk)
        except msgspec.DecodeError:
            continue  # not a LogChunk: nothing we can order or attribute
        tail = m.nats_subject.rsplit(".", 1)[-1]
        chunks.setdefault(chunk.attempt or (int(tail) if tail.isdigit() else 0), []).append(chunk)
    redact = Redactor(workspace_secrets(workspace))
    logs: dict[int, dict[str, Any]] = {}
    extra: dict[str, bytes] = {}
    for attempt in sorted(chunks):
        text, count = b.render_logs(chunks[attempt])
        section, blob = b.log_section(run_id, attempt, redact.text(text), count)
        logs[attempt] = section
        if blob is not None:
            extra[section["object"]] = blob

    approved = _payloads(events, "policy.approved", PolicyApproved)
    resolved = approved[-1].run if approved else None

    # every pod of the run: its exec.progress names it, or the gang its first rank's exec.running lists (only the
    # first rank's pod says exec.running, issue 30)
    running = _payloads(events, "exec.running", ExecRunning)
    pods = sorted(({r.pod for r in running} | {g.name for r in running for g in r.pods}
                   | {p.pod for p in _payloads(events, "exec.progress", ExecProgress)}) - {""})
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
    # each attempt's manifests, stored by the digest its render.applied signs (issue 27), checked against it
    rendered = {ra.digest: await stored_manifests.read(bus, workspace, run_id, ra.digest)
                for ra in _payloads(events, "render.applied", RenderApplied) if not ra.manifests}
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
        manifests=rendered,
    )
    return b.encode(b.redacted(doc, redact)), extra


def workspace_secrets(workspace: str) -> list[str]:
    """The values of the workspace's secrets, read from the embedded stack's store; none elsewhere (on Kubernetes
    the evidence service reads no Secrets, so a bundle there is blanked only where the pod's logs were)."""
    store = local_store()
    return store.values(workspace) if store is not None else []


def _payloads(events: list[Event], event_type: str, kind: type[T]) -> list[T]:
    """The payloads of ``events`` of one type that decode; an undecodable one is left out (the bundle lists it as
    such), so a hostile body never stops a run from being sealed."""
    out = []
    for ev in events:
        if ev.type == event_type:
            try:
                out.append(ev.payload(kind))
            except msgspec.DecodeError:
                continue
    return out


LOGS_MARGIN_S = SIGNATURE_MAX_AGE_S  # how far a submission's own time may be from when it was stored


def _logs_since(events: list[Event]) -> float | None:
    """From when to read the run's logs: its first event's time less the most a client's clock may be off (a
    run logs only once it runs, after it was submitted). None (from the start of LOGS) without a usable time."""
    times = [ev.happened for ev in events if ev.happened > 0]
    return min(times) - LOGS_MARGIN_S if times else None


async def _log_messages(bus: Bus, subject: str, *, since: float | None) -> list[Event]:
    """The run's log chunks on LOGS, from ``since`` on (the server finds where that starts: the walk by subject
    covers the run's own time, not the days of other runs' logs before it): by direct gets, else (a stream made
    before LOGS allowed them) a replay."""
    try:
        return await streams.history(bus, "LOGS", subject, since=since)
    except streams.DirectGetUnavailable:
        if not await streams.holds(bus, "LOGS", subject):
            return []
        return [from_message(m.subject, m.headers, m.data) for m in await replay(bus, stream="LOGS", subject=subject)]


async def _gpu_hour_price(bus: Bus, approved: PolicyApproved | None) -> tuple[float, int]:
    """(price of a GPU-hour on the run's compute profile, the platform revision it comes from) as the platform
    stood when the run was approved; (0, 0) when the run was never approved or that revision (or the profile)
    is no longer kept, so the bundle never prices a run with a later platform's numbers."""
    if approved is None:
        return 0.0, 0
    revision = approved.platform_revision or approved.run.platform_revision
    if not revision:
        return 0.0, 0
    reader = shared_reader(bus)  # the process's one reader: each revision parsed and held once
    platform = await reader.at(revision)  # a TemporaryError retries the seal, never prices it 0
    if not isinstance(platform, Platform):
        return 0.0, 0
    profile = next((p for p in platform.compute_profiles if p.name == approved.run.profile), None)
    return (profile.gpu_hour_price, revision) if profile is not None else (0.0, 0)


def keep_outputs_budget() -> int:
    """Bytes of small output files copied into the object store per run (``TAU_EVIDENCE_KEEP_OUTPUTS``, a
    quantity such as 64Mi; default 0: locally the files are on this machine already). A value that is not a
    quantity stops the evidence service at its start (``settings.SettingsError``), not at a run's seal."""
    return settings.current().evidence.keep_outputs


def scratch_writes(pods: list[str]) -> list[dict[str, Any]]:
    """What local pods of the run wrote under their scratch working directory (``taugrid.local.scratch``),
    read from the embedded stack's data dir; nothing elsewhere (Kubernetes has no such files)."""
    data_dir = settings.stack_data_dir()
    if data_dir is None:
        return []
    out = []
    for pod in pods:
        doc = scratch.read(data_dir / "pods" / pod)
        if doc is not None:
            out.append({"pod": pod, **doc})
    return out


def _workspace_of(data: bytes) -> str:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return ""
    return str(doc.get("workspace", "")) if isinstance(doc, dict) else ""


def _commits_to(data: bytes, seal: lg.Seal) -> bool:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return isinstance(doc, dict) and doc.get("terminal", {}).get("event_id") == seal.event_id


async def run_history(bus: Bus, terminal_event: Event) -> list[Event]:
    """The run's events in RUNS' order, up to and including ``terminal_event``, as its consumers accepted them.

    Read from HISTORY and AUDIT, which keep a run's events under one subject a run each (``bus/history.py``: direct
    gets on the run's subjects, each event at its RUNS sequence, the two merged in RUNS' order), once they hold them
    through ``terminal_event`` (``history.run_events`` waits for their feeds, which copy an event about a millisecond
    after RUNS stored it: a ``TemporaryError`` retries the seal should they not in ``history.CATCH_UP_S``).
    RUNS itself keeps only what its consumers have still to read (interest retention). AUDIT alone keeps the kinds
    verification needs (``topology.AUDIT_KEPT_EVENTS``: the people's requests, a run's end, the seal), for longer
    than HISTORY keeps the others (``max_age``, RUNS' retention): a run that outlived HISTORY's max age is sealed
    with its request and its end, without the intermediate events that aged out.
    Events from a service not allowed to publish their subject are left out: every consumer dead-lettered them,
    and ``tau verify`` does not count them as the run's."""
    ws, run, _ = parse_run_subject(terminal_event.nats_subject)
    events = await history.run_events(bus, ws, run, through=terminal_event.seq)
    return [ev for ev in events if source_problem(ev.nats_subject, ev.source) is None]


def sealed_ledger(base: lg.Ledger, events: list[Event]) -> lg.Ledger:
    """``base`` (an empty ledger, or one an earlier version wrote per event) with the run's ``events`` through
    its first terminal event appended, and that event's seal claimed (first wins: a claim already made stays)."""
    first = next((i for i, ev in enumerate(events) if ev.type in TERMINAL_EVENTS), None)
    if first is None:
        raise PermanentError(f"no terminal event among the {len(events)} events of run {base.run_id}")
    ledger = lg.extend(base, events[: first + 1])
    return lg.claim_seal(ledger, events[first])


class Sealed(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed run's ledger as stored, and whether it was found already written."""

    ledger: lg.Ledger
    resumed: bool  # the ledger existed before this call: an interrupted or concurrent seal, or a redelivery


async def seal(bus: Bus, terminal_event: Event) -> Sealed:
    """Seal the run of ``terminal_event``: build its ledger, store its bundle once, write the seal (the bundle's
    digest and the chain's head: ``ledger.seal_only``, the entries being the bundle's) in one compare-and-set (a
    create for a fresh run): the run's only ledger write. The caller announces it (``announce``). ``Sealed.ledger``
    is what the KV holds.

    When another terminal event came first in the stream, the seal (and the bundle) is that event's."""
    if terminal_event.type not in TERMINAL_EVENTS:
        raise PermanentError(
            f"{terminal_event.type} is not terminal; a run is sealed on one of {sorted(TERMINAL_EVENTS)}"
        )
    workspace, run_id = run_of(terminal_event)
    resumed = False
    for _ in range(_CAS_TRIES):
        current, revision = await load(bus, workspace, run_id)
        resumed = resumed or current is not None
        if current is not None and current.seal is not None and current.seal.digest:
            await stored_manifests.release(bus, workspace, run_id)  # a seal interrupted before it released them
            return Sealed(ledger=current, resumed=True)
        known: dict[int, Event] = {}
        if current is None or current.seal is None:
            events = await run_history(bus, terminal_event)
            known = {ev.seq: ev for ev in events}
            base = current if current is not None else lg.Ledger(run_id=run_id, workspace=workspace)
            ledger = sealed_ledger(base, events)
        else:
            ledger = current  # claimed by an earlier version, its bundle not written yet
        digest = await _store_bundle(bus, workspace, ledger, known)
        assert ledger.seal is not None
        ledger = msgspec.structs.replace(
            ledger, seal=msgspec.structs.replace(ledger.seal, bundle=b.bundle_name(run_id), digest=digest))
        ledger = lg.seal_only(ledger)
        try:
            await kv.save(bus, BUCKET, key(workspace, run_id), lg.encode(ledger), revision=revision)
        except kv.Conflict:  # another handler sealed it meanwhile (the same ledger) or an old one appended
            resumed = True
            await asyncio.sleep(0.005)
            continue
        # the bundle holds the manifests now, and is never rebuilt once the ledger commits to it; the events in
        # hand name their keys (none in hand: a seal an earlier version claimed, its keys listed)
        rendered = [ra.digest for ra in _payloads(list(known.values()), "render.applied", RenderApplied)
                    if not ra.manifests] if known else None
        await stored_manifests.release(bus, workspace, run_id, rendered)
        return Sealed(ledger=ledger, resumed=resumed)
    raise TemporaryError(f"ledger contention on {run_id}", delay=0.2)


async def _store_bundle(bus: Bus, workspace: str, ledger: lg.Ledger, known: Mapping[int, Event]) -> str:
    """The digest of the run's bundle for the ledger's seal: the one stored already (a seal interrupted after
    storing it), else collected and stored now."""
    claim = ledger.seal
    assert claim is not None
    name = b.bundle_name(ledger.run_id)
    try:
        existing = await read_bundle_bytes(bus, name)
    except packing.PackingError:
        existing = None  # damaged: stored again below
    if existing is not None and (theirs := _workspace_of(existing)) and token(theirs) != token(workspace):
        # Object names carry the run id alone: a run made in another workspace under an id already sealed
        # (run ids are visible to everyone) would replace that run's bundle and logs, or, its terminal event
        # having the same id, take that bundle's digest as its own seal. Nothing is written.
        raise PermanentError(
            f"run {ledger.run_id} of workspace {workspace} is not sealed: {name} is the sealed bundle of the run "
            f"of that id in workspace {theirs}, which a run of another workspace never replaces")
    if existing is not None and _commits_to(existing, claim):
        return lg.sha256(existing)  # never rebuilt: the outputs it scanned may have changed since
    data, extra = await collect(bus, ledger, known=known)
    for obj, blob in sorted(extra.items()):
        await put_object(bus, obj, blob, workspace=workspace)
    # against the workspace's base (written first when new): what its runs repeat is stored once
    await put_object(bus, name, await bases.writer(bus).pack(bus, workspace, data), workspace=workspace)
    return lg.sha256(data)


async def announce(bus: Bus, sealed: Sealed) -> bool:
    """Publish ``evidence.sealed`` once; False when it was on the bus already (AUDIT holds it).

    Its message id is deterministic (``<run>.<attempt>.evidence.sealed``), so RUNS drops a republish within its
    duplicate window; a seal resumed (the ledger was written before: a redelivery, an interrupted or concurrent
    seal) first looks for the announcement among the run's events (``history.run_events``: AUDIT keeps it,
    ``topology.AUDIT_KEPT_EVENTS``), which is the record that it was made (RUNS lets an event go once its consumers
    acked it). A copy still on its way to AUDIT (about a millisecond) is the duplicate window's to drop."""
    ledger = sealed.ledger
    claim = ledger.seal
    if claim is None or not claim.digest:
        raise ValueError(f"run {ledger.run_id} is not sealed")
    if sealed.resumed and any(ev.type == "evidence.sealed" for ev in await history.run_events(
            bus, token(ledger.workspace), token(ledger.run_id))):
        return False
    await bus.emit(workspace=ledger.workspace, run_id=ledger.run_id, attempt=claim.attempt,
                   event_type="evidence.sealed", payload=sealed_payload(ledger), dedup="")
    return True
