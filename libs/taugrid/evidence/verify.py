"""Independent re-verification of a run's evidence, for ``tau verify RUN`` and ``tau evidence RUN``.

Checks, each reported as a plain sentence in ``problems`` (empty ⇔ ``ok``):
1. the ledger is an unbroken hash chain. A sealed run's KV keeps its seal alone (issue 27, ``ledger.seal_only``:
   the bundle's digest, the chain's head and length, the terminal event's type and attempt): its entries are then
   the sealed bundle's, which must be an unbroken chain as long as the seal says, ending at its head, at its
   terminal event (``ledger.with_entries``); a ledger the KV keeps whole (sealed by an earlier release) is checked
   as it is;
2. the stored bundle's sha256 equals the digest the ledger's seal and the ``evidence.sealed`` event announce, and
   the seal's bundle name and length the ones it announced (taken over its canonical JSON; a bundle stored against its
   workspace's base, ``bases.py``, is inflated with the base, read again and checked against the sha256 its name
   carries first: a base missing or changed is a problem that names it);
3. the bundle's own ledger copy is an unbroken chain, a prefix of the KV ledger (when the KV keeps it whole),
   ending at the announced head; every ledger entry is one of the bundle's events (same id, type and payload
   hash);
4. every separately stored attempt log matches the sha256 the bundle records;
5. against the streams, each for the kinds it keeps. HISTORY (every kind AUDIT does not keep,
   ``topology.HISTORY_KINDS``, under one subject a run, for RUNS' retention: 30 d by default; RUNS itself lets an
   event go once its consumers acked it), while it still holds the run: every ledger entry of a kind AUDIT does not
   keep is an event there with the same type and payload hash (``_vouches``: every one when nothing of the run can
   have aged out of HISTORY, ``_holds_whole_run``; else from the run's first event HISTORY holds on), and every
   HISTORY event of the run up to the sealing terminal event is in the ledger. AUDIT (append-only, keeps
   ``topology.AUDIT_KEPT_EVENTS``: the people's signed requests, the terminal events and ``evidence.sealed``,
   365 d, which HISTORY does not copy): every ledger entry of a kept type is there the same, and every AUDIT event
   of the run up to the sealing terminal event is in the ledger; an AUDIT an earlier release made mirrors every
   event, and then every entry is checked against it (and a HISTORY an earlier release filled holds the kept kinds
   too: an entry of those there is compared, not required). Events the consumers refused for a wrong
   ``ce-source`` were never acted on, so they are counted apart, not required;
6. the submission's signature sealed in the bundle verifies against the sealed public key, covers the
   ``submit.requested`` that AUDIT holds, and is the key the submitter verified;
7. the bundle's accounting (queue wait, running time, GPU-seconds, cost) is what its own events give
   (``bundle.accounting`` recomputed from the bundled events and the sealed price).
8. each attempt's manifests in the bundle hash to the digest its ``render.applied`` signed (since issue 27 that
   event carries the digest alone, the evidence read the manifests from the ``manifests`` bucket and checked
   them at the seal: ``bus/manifests.py``); an attempt whose manifests the evidence could not have or check then
   (``manifests_missing``: purged, never stored, or not hashing to the digest) is a problem naming why. Manifests
   the workspace's secrets were blanked in (``[REDACTED]``) no longer hash to it and are not re-hashed: the
   bundle's digest covers them.
An intermediate event (neither a request nor the run's end) is thus vouched for by HISTORY while HISTORY keeps it,
and after that by the bundle alone, whose digest AUDIT's ``evidence.sealed`` pins: a ledger or bundle rewritten
after the seal fails check 1, 2 or 3 (the seal and the bundle rewritten together: check 2 and 3, against AUDIT);
one forged at the seal by the sealing service itself fails check 5 only while HISTORY keeps the run
(``tau verify --anchor`` adds the signed anchors' heads, §13b). Both streams are read through consumers filtered
on the run's subject (people may create them only in their workspaces; HISTORY's stream state, which anyone may
read, dates its oldest message) and copy RUNS asynchronously: each is read again for a moment before an event is
called missing.
A bundle (and its logs) archived out of the bus (``archive.py``) is read from the archive and checked the same
way: the digest on the bus (the ledger's seal, ``evidence.sealed`` in AUDIT) is what it must hash to.
Reads only; never repairs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import msgspec

from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event, SignatureInvalid, canonical_form, from_message, verify_form
from taugrid.bus.errors import UNAVAILABLE, unavailable
from taugrid.bus.history import CATCH_UP_S
from taugrid.bus.kept import audit_filter, in_runs_order, stored_filter, wanted
from taugrid.bus.replay import replay
from taugrid.bus.topology import AUDIT_KEPT_EVENTS, AUDIT_STREAM, HISTORY_STREAM
from taugrid.core.contracts import EvidenceSealed
from taugrid.core.ids import token
from taugrid.core.publishing import source_problem
from taugrid.core.redaction import REDACTED
from taugrid.evidence import archive, bases, packing, store
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.render import manifest_digest

# HISTORY's ``holds_from`` when it holds nothing of the run: no entry is required there
_NOTHING_HELD = 2**63


class VerifyReport(msgspec.Struct, kw_only=True):
    run_id: str
    ok: bool
    sealed: bool
    bundle: str = ""
    digest: str = ""  # sha256 of the stored bundle bytes, recomputed now
    announced_digest: str = ""  # from evidence.sealed (or the ledger's seal when the event is missing)
    archive: str = ""  # where the bundle was read when not on the bus (``directory /path``, ``s3://bucket/prefix``)
    ledger_head: str = ""
    entries: int = 0
    audit_events: int = 0  # the run's events AUDIT holds (the kept types: requests, its end, evidence.sealed)
    # the run's events HISTORY still holds, RUNS' record of those AUDIT does not keep (none once they aged out: the
    # bundle vouches then; named for RUNS in this schema, whose events they are)
    runs_events: int = 0
    refused_events: int = 0  # AUDIT events from a service not allowed to publish them (dead-lettered)
    user: str = ""  # the verified submitter sealed in the bundle
    signer: str = ""  # the public key whose submission signature was re-checked
    accounting: dict[str, Any] = msgspec.field(default_factory=dict)  # the bundle's, once checked
    problems: list[str] = msgspec.field(default_factory=list)


class _Seen(msgspec.Struct, frozen=True):
    event_type: str
    payload_sha256: str
    seq: int  # RUNS' sequence (HISTORY's and AUDIT's copies name it: ``envelope.from_message``)
    stored: float = 0.0  # when the stream read stored its copy (epoch seconds)


class _Stream(msgspec.Struct):
    """One stream's view of the run: its events by id, and the first RUNS sequence it can still vouch for."""

    name: str
    events: dict[str, _Seen]
    refused: int = 0
    sealed: EvidenceSealed | None = None
    holds_from: int = 0  # HISTORY: entries RUNS stored before this sequence may have aged out (0: AUDIT, by type)


def _seen(name: str, events: list[Event], *, holds_from: int = 0) -> _Stream:
    out = _Stream(name=name, events={}, holds_from=holds_from)
    for ev in events:
        if source_problem(ev.nats_subject, ev.source) is not None:
            out.refused += 1  # every consumer dead-lettered it: not part of the run's history
            continue
        out.events.setdefault(ev.id, _Seen(ev.type, lg.sha256(ev.data or b""), ev.seq, ev.stored))
        if ev.type == "evidence.sealed" and out.sealed is None:
            try:
                out.sealed = ev.payload(EvidenceSealed)
            except msgspec.DecodeError:
                continue  # not the evidence service's announcement: the check says none was found
    return out


async def _read(bus: Bus, stream: str, filters: tuple[str, ...], subject: str) -> list[Event]:
    """The run's events ``stream`` holds on ``filters`` (read through consumers, as people may), in RUNS' order,
    each as RUNS stored it (``envelope.from_message``: its subject and sequence there) with the time ``stream``
    stored its copy. Every message on the run's subject is read, as the seal read them (``store.run_history``), one
    whose headers contradict its subject too (``replay.batches`` leaves those out, the ledger does not)."""
    msgs = [m for f in filters for m in await replay(bus, stream=stream, subject=f)]
    return in_runs_order(wanted(subject, [
        from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream,
                     stored=m.metadata.timestamp.timestamp()) for m in msgs]))


async def _audit(bus: Bus, subject: str) -> _Stream:
    """The run's events AUDIT holds: under its one subject a run (``a.<ws>.<run>``), and under RUNS' own subjects
    (an earlier release's AUDIT)."""
    return _seen(AUDIT_STREAM, await _read(bus, AUDIT_STREAM, (audit_filter(subject), subject), subject))


async def _history(bus: Bus, subject: str, audit: _Stream) -> _Stream:
    """The run's events HISTORY holds, each as RUNS stored it, and from which RUNS sequence on it vouches for the
    run's entries of the kinds it keeps: every one when nothing of the run can have aged out of it
    (``_holds_whole_run``), else from the first event of the run it holds (the ones before may have aged out: it
    lets the oldest go first), none when it holds none."""
    events = await _read(bus, HISTORY_STREAM, (stored_filter(subject),), subject)
    if not events:
        holds_from = _NOTHING_HELD
    elif await _holds_whole_run(bus, events, audit):
        holds_from = 1
    else:
        holds_from = events[0].seq
    return _seen(HISTORY_STREAM, events, holds_from=holds_from)


async def _holds_whole_run(bus: Bus, events: list[Event], audit: _Stream) -> bool:
    """Whether HISTORY, holding ``events`` of the run, holds every event of the run it ever stored.

    It does when it holds the run's ``submit.requested``, the run's first event (a run sealed when HISTORY copied
    every kind). Since HISTORY leaves the request to AUDIT (``topology.HISTORY_KINDS``), the request's copy there
    dates the run's start: every event of the run was stored after RUNS stored its request, which AUDIT's feed
    copied within ``CATCH_UP_S`` (a source re-established after a restart: seconds), and HISTORY lets its oldest
    messages go first. So nothing of the run left HISTORY when its oldest message was stored ``CATCH_UP_S`` before
    AUDIT's copy of the request, or when it let nothing go (its first sequence 1) and was there by the time the run
    was submitted (its oldest message stored no later than ``CATCH_UP_S`` after AUDIT's copy of the request: a
    HISTORY made later, at an upgrade, holds only what RUNS still held of an older run). Otherwise the run's entries
    are required there from its first event HISTORY holds on. Judged by the server's stamps (its stream state,
    which anyone may read, and its copies' store times), never the ledger's."""
    if events[0].type == "submit.requested":
        return True
    requested = min((got.stored for got in audit.events.values() if got.event_type == "submit.requested"),
                    default=0.0)
    if not requested:
        return False  # AUDIT holds no request of the run (aged out of it too, or never kept): nothing dates it
    first_seq, first_stored = await _history_front(bus)
    if not first_stored:
        return False
    return first_stored <= requested - CATCH_UP_S or (first_seq <= 1 and first_stored <= requested + CATCH_UP_S)


class _State(msgspec.Struct):
    first_seq: int = 0
    first_ts: str = ""


class _StreamInfo(msgspec.Struct):
    state: _State = msgspec.field(default_factory=_State)
    error: dict[str, object] | None = None


async def _history_front(bus: Bus) -> tuple[int, float]:
    """HISTORY's first sequence and when it stored the message there (epoch seconds; (0, 0.0) when it holds none
    or cannot say), from its stream state (nats-py's ``StreamState`` leaves the time out)."""
    try:
        answer = await bus.replies.request(f"$JS.API.STREAM.INFO.{HISTORY_STREAM}", b"", timeout=10.0)
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {HISTORY_STREAM}'s state", exc) from exc
    info = msgspec.json.decode(answer.data, type=_StreamInfo)
    if info.error is not None or not info.state.first_seq:
        return 0, 0.0
    return info.state.first_seq, _epoch(info.state.first_ts)


def _epoch(stamp: str) -> float:
    """An RFC 3339 time the server wrote (nanoseconds, UTC) as epoch seconds; 0.0 when it is not one."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    try:
        second = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
        return second + int(fraction[:9].ljust(9, "0") or 0) / 1e9
    except ValueError:
        return 0.0


def _check_identity(doc: dict[str, Any], audit: _Stream) -> list[str]:
    """Re-check the sealed submission signature (see the module docstring, check 6)."""
    ident = doc.get("identity")
    if ident is None:
        return []  # sealed before identities were recorded
    signed = ident.get("signed") or {}
    signer, signature = str(ident.get("signer", "")), str(ident.get("signature", ""))
    if not signed or not signature:
        return ["no submission signature is sealed in the bundle (the run was submitted unsigned)"]
    form = canonical_form(nats_subject=str(signed.get("nats_subject", "")), event_id=str(signed.get("id", "")),
                          event_type=str(signed.get("type", "")), subject=str(signed.get("subject", "")),
                          time=str(signed.get("time", "")), body_sha256=str(signed.get("body_sha256", "")))
    problems = []
    try:
        verify_form(form, public_key=signer, signature=signature)
    except SignatureInvalid as exc:
        problems.append(f"the sealed submission signature does not verify against the sealed key {signer}: {exc}")
    got = audit.events.get(str(signed.get("id", "")))
    if got is None:
        problems.append(f"the signed submission {signed.get('id')} is not in {AUDIT_STREAM}")
    elif got.payload_sha256 != signed.get("body_sha256"):
        problems.append(f"the sealed signature covers a different submission body than {AUDIT_STREAM} holds")
    verified = ident.get("verified_signer")
    if verified is not None and verified != signer:
        problems.append(f"the submitter verified key {verified}, but the sealed signature is by {signer}")
    return problems


def _vouches(stream: _Stream, entry: lg.Entry, *, everything: bool) -> bool:
    """Whether ``stream`` must hold ``entry``: HISTORY every kind AUDIT does not keep (``topology.HISTORY_KINDS``;
    a kind no service may publish too, which no stream holds: a forged entry), from where it holds the run on;
    AUDIT the kept types (every type when it mirrors all of RUNS)."""
    if stream.holds_from:
        return entry.type not in AUDIT_KEPT_EVENTS and entry.seq >= stream.holds_from
    return everything or entry.type in AUDIT_KEPT_EVENTS


def _check_stream(ledger: lg.Ledger, stream: _Stream, horizon: int | None) -> list[str]:
    """Check 5 against one stream: every entry it vouches for is there the same, and nothing it holds of the run
    up to the sealing terminal event (RUNS' sequence ``horizon``; None: no stream holds it) is missing from the
    ledger."""
    name, held = stream.name, stream.events
    everything = any(got.event_type not in AUDIT_KEPT_EVENTS for got in held.values())  # a mirror of all RUNS
    problems = []
    for e in ledger.entries:
        got = held.get(e.event_id)
        if got is None:
            if _vouches(stream, e, everything=everything):
                problems.append(f"ledger entry {e.index} ({e.type}, {e.event_id}) is not in {name}")
        elif (got.event_type, got.payload_sha256) != (e.type, e.payload_sha256):
            problems.append(
                f"ledger entry {e.index} ({e.event_id}) differs from {name}: "
                f"type {e.type}/{got.event_type}, payload {e.payload_sha256[:12]}…/"
                f"{got.payload_sha256[:12]}…"
            )
    if horizon is not None:
        in_ledger = {e.event_id for e in ledger.entries}
        for event_id, got in sorted(held.items(), key=lambda kv: kv[1].seq):
            if got.seq <= horizon and event_id not in in_ledger:
                problems.append(f"{name} event {event_id} ({got.event_type}) is missing from the ledger")
    return problems


def _horizon(ledger: lg.Ledger, *streams: _Stream) -> int | None:
    """RUNS' sequence of the sealing terminal event, as the first of ``streams`` that holds it says (AUDIT keeps the
    terminal events; a HISTORY an earlier release filled holds them too); None when unsealed or held by none (a
    problem the checks name)."""
    if ledger.seal is None:
        return None
    return next((s.events[ledger.seal.event_id].seq for s in streams if ledger.seal.event_id in s.events), None)


def _check_bundle_events(doc: dict[str, Any], ledger: lg.Ledger) -> list[str]:
    """Every ledger entry is one of the sealed bundle's events, the same (check 3): what vouches for an
    intermediate event once HISTORY no longer keeps it."""
    records = {str(r.get("id")): r for r in doc.get("events", []) if isinstance(r, dict)}
    problems = []
    for e in ledger.entries:
        rec = records.get(e.event_id)
        if rec is None:
            problems.append(f"ledger entry {e.index} ({e.type}, {e.event_id}) is not among the sealed bundle's events")
        elif (rec.get("type"), rec.get("payload_sha256")) != (e.type, e.payload_sha256):
            problems.append(f"ledger entry {e.index} ({e.event_id}) differs from the sealed bundle's event: "
                            f"type {e.type}/{rec.get('type')}, payload {e.payload_sha256[:12]}…/"
                            f"{str(rec.get('payload_sha256'))[:12]}…")
    return problems


def _check_bundle(doc: dict[str, Any], ledger: lg.Ledger, announced_head: str, *,
                  chain_checked: bool = False) -> list[str]:
    """The bundle's own ledger (check 3). ``chain_checked``: the ledger's entries are the bundle's, their chain
    checked already (``ledger.with_entries``), so it is not reported twice."""
    problems = []
    try:
        entries = store.bundle_entries(doc)
    except msgspec.ValidationError as exc:
        return [f"bundle ledger is malformed: {exc}"]
    if not chain_checked:
        problems += [f"bundle ledger: {p}" for p in lg.verify_entries(entries)]
    if entries and announced_head and entries[-1].hash != announced_head:
        problems.append(
            f"bundle ledger ends at {entries[-1].hash[:12]}…, evidence.sealed announced "
            f"{announced_head[:12]}…"
        )
    ledger_doc = doc.get("ledger")
    held: dict[str, Any] = ledger_doc if isinstance(ledger_doc, dict) else {}
    derived = held.get("entries") in b.CHAINED  # its head is the recomputed chain's, not written
    if (not derived or "head" in held) and held.get("head") != (entries[-1].hash if entries else None):
        problems.append("bundle ledger head does not match its last entry")
    if tuple(entries) != ledger.entries[: len(entries)]:
        problems.append("bundle ledger is not a prefix of the run's ledger (one of them was rewritten)")
    return problems


def _check_accounting(doc: dict[str, Any]) -> list[str]:
    sealed = doc.get("accounting")
    if not isinstance(sealed, dict):
        return []  # a bundle sealed before bundles carried accounting
    try:
        again = b.accounting(str(doc.get("run_id", "")), str(doc.get("workspace", "")), list(doc.get("events", [])),
                             gpu_hour_price=float(sealed.get("gpu_hour_price", 0.0)),
                             price_revision=int(sealed.get("price_revision", 0)))
    except (TypeError, ValueError, AttributeError) as exc:
        return [f"bundle accounting cannot be recomputed from its events: {exc}"]
    wrong = sorted(k for k in again if again[k] != sealed.get(k))
    return [f"bundle accounting {k} is {sealed.get(k)!r}, its events give {again[k]!r}" for k in wrong]


def _check_manifests(doc: dict[str, Any]) -> list[str]:
    """Check 8: every applied attempt's manifests are in the bundle and hash to the digest its event signed."""
    problems = []
    for att in doc.get("attempts", []):
        render = att.get("render") if isinstance(att, dict) else None
        if not isinstance(render, dict):
            continue  # never applied (render.failed, or no render event)
        n = att.get("attempt")
        if "manifests_missing" in render:
            problems.append(f"attempt {n}: its manifests are not in the bundle: {render['manifests_missing']}")
            continue
        manifests = render.get("manifests")
        if not isinstance(manifests, list) or not all(isinstance(m, dict) for m in manifests):
            problems.append(f"attempt {n}: the bundle's manifests are not a list of manifests")
        elif manifest_digest(manifests) != render.get("digest") and REDACTED not in str(manifests):
            problems.append(f"attempt {n}: the bundle's manifests do not hash to the digest render.applied "
                            f"signed ({str(render.get('digest'))[:19]}…)")
    return problems


async def _check_logs(bus: Bus, doc: dict[str, Any]) -> list[str]:
    problems = []
    for att in doc.get("attempts", []):
        logs = att.get("logs") or {}
        if "object" in logs:
            data, where = await archive.read_object(bus, logs["object"])
            if data is None:
                problems.append(f"attempt {att.get('attempt')}: log object {logs['object']} is missing")
            elif lg.sha256(data) != logs.get("sha256"):
                problems.append(f"attempt {att.get('attempt')}: log object {logs['object']} was modified"
                                + (f" (read from the archive, {where})" if where else ""))
        elif "text" in logs and lg.sha256(str(logs["text"]).encode()) != logs.get("sha256"):
            problems.append(f"attempt {att.get('attempt')}: inline log does not match its sha256")
    return problems


async def verify_run(bus: Bus, run_id: str, *, workspace: str | None = None,
                     audit_wait_s: float = 5.0) -> VerifyReport:
    """Re-read and re-check everything recorded for ``run_id``; see the module docstring for the checks.
    ``workspace``: the run's (people pass it: they may read only their workspaces' records); None looks the
    run up by id in every workspace."""
    if workspace is None:
        ledger = await store.find(bus, run_id)
        workspace = ledger.workspace if ledger is not None else ""
    else:
        ledger, _ = await store.load(bus, workspace, run_id)
    report = VerifyReport(run_id=run_id, ok=False, sealed=False)
    if ledger is None:
        report.problems.append(
            f"no ledger for run {run_id} (unknown run, or not sealed yet: a run's ledger is written at its seal)"
        )
        return report
    report.entries, report.ledger_head = ledger.count, ledger.head  # what the bus keeps: a sealed one's seal
    seal = ledger.seal
    doc: dict[str, Any] | None = None
    if seal is not None and seal.digest:
        report.sealed = True
        report.bundle = seal.bundle or b.bundle_name(run_id)
        doc = await _read_bundle(bus, report)
    from_bundle = ledger.in_bundle
    if from_bundle:  # the KV keeps the seal alone: the entries are the bundle's, which must be the sealed chain
        if doc is None:
            return report  # why it cannot be read is said; nothing else of the run can be checked without it
        try:
            entries = store.bundle_entries(doc)
        except msgspec.ValidationError as exc:
            report.problems.append(f"bundle ledger is malformed: {exc}")
            return report
        ledger, attached = lg.with_entries(ledger, entries)
        report.problems += attached
    else:
        report.problems += lg.verify(ledger)

    subject = f"run.{token(workspace)}.{token(run_id)}.>"  # people may read only their workspaces' subjects
    # HISTORY and AUDIT source RUNS asynchronously: give them a moment to catch up before calling an event missing.
    deadline = asyncio.get_running_loop().time() + audit_wait_s
    while True:
        audit = await _audit(bus, subject)
        kept = await _history(bus, subject, audit)
        horizon = _horizon(ledger, audit, kept)
        kept_problems = _check_stream(ledger, kept, horizon)
        audit_problems = _check_stream(ledger, audit, horizon)
        # a sealed ledger's evidence.sealed is copied after the entries it follows: wait for it too
        caught_up = not kept_problems and not audit_problems and (ledger.seal is None or audit.sealed is not None)
        if caught_up or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.2)
    report.runs_events = len(kept.events)
    report.problems += kept_problems
    report.audit_events, report.refused_events = len(audit.events), audit.refused
    report.problems += audit_problems
    announced = audit.sealed

    seal = ledger.seal
    if seal is None or not seal.digest:
        report.problems.append("run is not sealed yet (no terminal event, or sealing has not finished)")
        report.ok = False
        return report
    report.announced_digest = announced.digest if announced else seal.digest
    if announced is None:
        report.problems.append(f"no evidence.sealed event for {run_id} in {AUDIT_STREAM}")
    else:
        if announced.digest != seal.digest:
            report.problems.append(
                f"evidence.sealed announced {announced.digest[:12]}…, the ledger records {seal.digest[:12]}…"
            )
        announced_bundle = announced.bundle_of(run_id)  # "" announced: the run's usual name, as a seal keeps it
        if announced_bundle != report.bundle:
            report.problems.append(f"evidence.sealed announced the bundle {announced_bundle}, the seal names "
                                   f"{report.bundle}")
        if announced.entries != seal.index + 1:
            report.problems.append(f"evidence.sealed announced {announced.entries} ledger entries, the seal "
                                   f"records {seal.index + 1}")
    if report.digest and report.digest != report.announced_digest:
        from_archive = f" in the archive, {report.archive}" if report.archive else ""
        report.problems.append(
            f"bundle {report.bundle} hashes to {report.digest[:12]}…, sealed as "
            f"{report.announced_digest[:12]}… (the bundle was modified{from_archive})"
        )
    if doc is None:
        report.ok = False
        return report
    head = announced.ledger_head if announced else seal.head if from_bundle else _sealed_head(ledger)
    report.problems += _check_bundle(doc, ledger, head, chain_checked=from_bundle)
    report.problems += _check_bundle_events(doc, ledger)
    ident = doc.get("identity") or {}
    report.user, report.signer = str(ident.get("user", "")), str(ident.get("signer", ""))
    report.problems += _check_identity(doc, audit)
    accounting_problems = _check_accounting(doc)
    report.problems += accounting_problems
    if not accounting_problems and isinstance(doc.get("accounting"), dict):
        report.accounting = doc["accounting"]
    report.problems += await _check_logs(bus, doc)
    report.problems += _check_manifests(doc)
    report.ok = not report.problems
    return report


def _sealed_head(ledger: lg.Ledger) -> str:
    """The hash of a whole ledger's terminal entry ("" when its seal points past its entries: ``lg.verify`` said)."""
    seal = ledger.seal
    return ledger.entries[seal.index].hash if seal is not None and seal.index < len(ledger.entries) else ""


async def _read_bundle(bus: Bus, report: VerifyReport) -> dict[str, Any] | None:
    """The sealed bundle ``report.bundle`` decoded, read from the bus, else the archive (``report.archive``: where),
    its sha256 recomputed (``report.digest``); None, with the reason in ``report.problems``, when it cannot be."""
    stored, report.archive = await archive.read_object(bus, report.bundle)  # the bus, else the archive
    from_archive = f" in the archive, {report.archive}" if report.archive else ""
    try:
        data = None if stored is None else await bases.unpack(bus, stored, fresh=True)
    except (bases.BaseMissing, bases.BaseModified) as exc:
        report.problems.append(f"bundle {report.bundle}: {exc}")
        return None
    except packing.PackingError as exc:
        report.problems.append(f"bundle {report.bundle} is damaged{from_archive}: {exc}")
        return None
    if data is None:
        report.problems.append(f"bundle {report.bundle} is missing from the evidence object store (and from the "
                               f"evidence archive, when the platform names one)")
        return None
    report.digest = lg.sha256(data)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        report.problems.append(f"bundle {report.bundle} is not JSON: {exc}")
        return None
    if not isinstance(doc, dict):
        report.problems.append(f"bundle {report.bundle} is not a JSON object")
        return None
    return doc


def as_dict(report: VerifyReport) -> dict[str, Any]:
    """The report as plain JSON values, for ``--output json``."""
    return {"schema": "taugrid.verify/v1", **msgspec.to_builtins(report)}
