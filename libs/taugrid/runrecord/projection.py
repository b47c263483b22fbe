"""The run-record projection: folds RUNS into the ``run_state`` KV bucket (run by ``services/run_record`` only).

The workspace of a projected event is the one in its NATS subject, which the server's publish permissions vouch
for (never the ``ce-workspace`` header alone).

Every write is a compare-and-set against the revision just read; a lost race re-reads and re-applies, and an
invalid transition (duplicate, stale attempt, after terminal) is a no-op, so the projection is idempotent.
The record is the fold of the run's events *in stream order*. Delivery can break that order: an event whose
projection failed (a KV write lost with a restarting server) or whose delivery was lost is redelivered only
after later events of the same run were folded, and folding it then would apply it to a state it predates (a
``submit.accepted`` arriving after ``policy.approved`` left the record at ``accepted`` for good, every later
event an "invalid transition"). So an event older than the record's ``last_seq`` that the record has not seen
rebuilds the record from the run's events as HISTORY keeps them, in RUNS order (``_refold``: RUNS, an interest
stream, lets an event go once its readers acked it). A sealed run's record keeps no history (issue 27: the
sealed bundle holds its events) and folds nothing at or below its ``last_seq`` (``_apply``).
A projector may keep a ``RecordCache`` of the records it last wrote: the cached revision is only the CAS
precondition, so a stale entry (another replica wrote since) fails the write and is re-read from the bucket (so
an event of a cached record costs one KV write and no read).
The ``Projector`` writes the events of one record that arrive while its previous write is in flight
together: each is checked and folded as it would be alone, in the order they arrived (the stream's), and the
record is written once for them all, so a run's burst of events (a pod's progress and its end) costs one write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from taugrid.bus import history, kv
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core import states, wirejson
from taugrid.core.contracts import PolicyApproved, ResolvedRun, SubmitAccepted, SubmitRequested
from taugrid.core.errors import PermissionDenied, TemporaryError
from taugrid.runrecord.read import BUCKET, event_key, load_key

log = logging.getLogger("taugrid.runrecord")
HISTORY = 200  # history entries a record keeps (the newest)


# A run's first event: its record is created without being read first (a record that exists after all, e.g. on a
# redelivery, fails the create, and the record is read and the event applied to it then).
FIRST_EVENT = "submit.requested"
PEOPLE_REQUESTS = (FIRST_EVENT, "cancel.requested")  # what people publish (anyone of a workspace, on any run id)
# A run's last event: its record is not cached after it (a finished run's record, with its history, would
# otherwise stay among the cache's most recent 4,096 over a long run); a later event re-reads it from KV.
LAST_EVENT = "evidence.sealed"
# Events whose write may wait a moment for the run's next event, to be written with it (issue 30: one KV write
# fewer each, on the projector and on the server), as they come in quick succession and no stage on the run's
# path reads back from the record what they change before the event after them is written:
# - the submission (``submit.requested``): the submitter's answer follows within milliseconds and is written at
#   once, with it. Until then a stage that reads the record finds none and waits (``read.require``), never
#   decides: the renderer's cancel, the admission watcher's verified user. A group holding the submitter's answer
#   opens its record without ``_may_open``'s lookup: the submitter answers only the first request of a run id its
#   workspace holds (``_first_for_run``), a stricter check already made.
# - the policy's approval (``policy.approved``): the renderer's apply follows within milliseconds (its
#   ``render.applied`` is written at once, with it). No stage reads the resolved run back from the record before
#   then: the renderer takes it from the approval itself, and its cancel check reads the user (written with the
#   submitter's answer), the cancel and ``object_name`` (written with ``render.applied``); a retry or a reproduction
#   reads it runs later. A render that fails ends the wait as any event outside this set does.
# - the run's admission and its pod's phases (queued then admitted on an idle queue; admitted, the pod's phases
#   and running within a tick of the local cluster): a stage that must know a run's attempt or end reads the
#   record when it handles a decisive event (``exec.succeeded``, ``exec.failed``, a retry), and those are written
#   at once, with whatever waits.
# A waiting write goes as soon as an event outside this set arrives for the run, or after ``LINGER_S``: ``tau
# status`` may show such a phase that much later, and a run's record appears that much after its request when
# no answer came meanwhile (a submission paced or refused, a busy submitter).
# Not among them: ``submit.accepted`` (the renderer's cancel reads the verified user from a record its request
# opened alone: a cancel within the linger would be refused as not the submitter's), ``render.applied`` (the
# cancel reads ``object_name``: it would end a run whose objects exist as never applied), and ``exec.running``, the
# phase people watch for (the portal, `tau status`): a short run's end arriving within the linger would have
# been written with it, so that the record never said running.
LINGER = frozenset({"submit.requested", "policy.approved", "admission.queued", "admission.admitted",
                    "exec.progress"})
LINGER_S = 0.05
# The admission's events wait longer: in a burst a run's queued, admitted and running come 50-130 ms apart (on an
# idle stack within milliseconds), and the shorter wait wrote each alone. ``tau status`` may show them that late.
# A waiting event holds its place among the consumer's messages in flight (``ConsumerLoop``: twice its batch),
# hence run_record's larger batch: with a burst's runs all queued at once, the window filled with waiting events
# and held back the events that would have ended their wait.
LINGER_ADMISSION = frozenset({"admission.queued", "admission.admitted", "exec.progress"})
LINGER_ADMISSION_S = 0.25


class RecordCache:
    """The records one projector last wrote, by KV key, with their revisions (bounded, least recently used out).

    An entry is taken out while an event is applied to it (``take``) and put back only after its write
    succeeded (``put``), so a failed or abandoned write never leaves a record in the cache that the bucket
    does not hold.
    """

    def __init__(self, size: int = 1024) -> None:
        # A record with its resolved run and history is several kilobytes as Python objects: with 4,096 the
        # submitter was at 94 MB after Kueue's scenario at fraction 0.3, with 1,024 at 64 MB (issue 11's aim is
        # 80). A miss costs one KV read, and runs still in flight beyond the bound (a long queue) missed at 4,096
        # as well.
        self.size = size
        self._entries: OrderedDict[str, tuple[states.RunRecord, int]] = OrderedDict()
        # The stored JSON of the resolved runs of the records last written, by the resolved run's identity (the
        # entry keeps the object, so its id is not reused while the entry lives). A resolved run is frozen and set
        # once (``policy.approved``), while its record is encoded again at each later event of the run: about a
        # quarter of encoding a record (issue 30).
        self._resolved: OrderedDict[int, tuple[ResolvedRun, msgspec.Raw]] = OrderedDict()

    def take(self, record_key: str) -> tuple[states.RunRecord, int] | None:
        return self._entries.pop(record_key, None)

    def put(self, record_key: str, record: states.RunRecord, revision: int) -> None:
        self._entries[record_key] = (record, revision)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __contains__(self, record_key: str) -> bool:
        return record_key in self._entries

    def packed(self, record: states.RunRecord) -> bytes:
        """``wirejson.encode(record)``, the same bytes, with its resolved run's JSON encoded once per resolved run,
        and its history encoded by msgspec at once: entries of plain values, which ``wirejson.plain`` would walk
        value by value to give back as they are (issue 30: its longest list)."""
        # each Raw stands where its field was (wirejson hands it to msgspec as it is: spliced in, in place)
        packed: dict[str, msgspec.Raw] = {}
        if record.history:
            packed["history"] = msgspec.Raw(msgspec.json.encode(record.history))
        resolved = record.resolved
        if resolved is not None:
            known = self._resolved.get(id(resolved))
            if known is not None and known[0] is resolved:
                self._resolved.move_to_end(id(resolved))
                packed["resolved"] = known[1]
            else:
                packed["resolved"] = raw = msgspec.Raw(wirejson.encode(resolved))
                self._resolved[id(resolved)] = (resolved, raw)
                while len(self._resolved) > self.size:
                    self._resolved.popitem(last=False)
        return wirejson.encode(msgspec.structs.replace(record, **packed) if packed else record)

    def __len__(self) -> int:
        return len(self._entries)


async def project(bus: Bus, ev: Event, *, cache: RecordCache | None = None) -> bool:
    """Apply one RUNS event to its record. Returns whether the record changed."""
    return (await _project_all(bus, [ev], cache=cache))[0]


async def _project_all(bus: Bus, events: Sequence[Event], *, cache: RecordCache | None) -> list[bool]:
    """Apply events of one record, in the order given, and write the record once (no write when every one is
    already in it); whether each changed the record. A lost compare-and-set re-reads and re-applies them all."""
    record_key, workspace = event_key(events[0])
    keep = cache is not None and all(ev.type != LAST_EVENT for ev in events)
    for tries in range(20):
        cached = cache.take(record_key) if cache is not None else None
        if cached is not None:
            record, revision = cached
        elif tries == 0 and events[0].type == FIRST_EVENT:
            record, revision = None, 0  # a run's first event: no record yet, almost always (else the create fails)
        else:
            record, revision = await load_key(bus, record_key)
        if record is None:
            if not await _may_open(bus, events, record_key):
                return [False] * len(events)
            record = states.RunRecord(run_id=events[0].subject, workspace=workspace, created=time.time())
        changes: list[bool | None] = []
        for ev in events:
            record, changed = await _apply(bus, record, ev, record_key=record_key)
            changes.append(changed)
        if all(changed is None for changed in changes):
            if cache is not None and revision and keep:
                cache.put(record_key, record, revision)
            return [False] * len(events)  # already projected (redeliveries)
        try:
            written = await kv.save(bus, BUCKET, record_key, record if cache is None else cache.packed(record),
                                    revision=revision)
        except kv.Conflict:
            continue  # another writer (a replica) got there first; the cache entry is gone, so re-read
        if cache is not None and keep:
            cache.put(record_key, record, int(written))
        return [bool(changed) for changed in changes]
    raise TemporaryError(f"run_state contention on {events[0].subject}", delay=0.2)


async def _may_open(bus: Bus, events: Sequence[Event], record_key: str) -> bool:
    """Whether people's requests may open a record no run has yet. Anyone in a workspace may publish a request on
    any run id there, and admins' and multi-workspace readers' lookups by run id alone (``find``) take the first
    or newest record of that id: a cancel (nothing to cancel: no run) opens none, and a submission none under an
    id another workspace's run holds (the submitter refuses it unanswered). A service's event opens its record
    whatever came first."""
    if not all(ev.type in PEOPLE_REQUESTS for ev in events):
        return True
    run, ws = record_key.split(".", 2)[2], record_key.split(".")[1]
    if all(ev.type != FIRST_EVENT for ev in events):
        log.info("%s: a request of a run that has no record: nothing recorded", record_key)
        return False
    # The newest record of the id, not every one (one direct get, not a stream-info request: issue 30): this
    # workspace's has not been written (else this would not be asked, but on a redelivery, whose create then
    # fails and reads it), so any record there is is another workspace's.
    newest = await kv.newest_key(bus, BUCKET, f"run.*.{run}")
    other = newest.split(".")[1] if newest is not None else ws
    if other != ws:
        log.warning("%s: run id %s is a run of %s: this workspace's request under it opens no record", record_key,
                    run, other)
        return False
    return True


async def _apply(bus: Bus, record: states.RunRecord, ev: Event, *,
                 record_key: str) -> tuple[states.RunRecord, bool | None]:
    """``ev`` applied to ``record`` (in place, or rebuilt from the run's history when ``ev`` is older than what the
    record has folded): the record and whether the state machine took ``ev``; None when the record has it already."""
    if ev.seq and ev.seq <= record.last_seq and (  # a history holds no seq above its record's last_seq
            # sealed and ended: no history (``_fold``); what it has not folded by now (a pre-seal event redelivered
            # after the seal) is in the bundle, and would not move a terminal state. A seal folded before its run's
            # end (that end's delivery failed) is not final: such a late event rebuilds the record (below)
            (record.evidence_digest and record.state in states.TERMINAL)
            or any(h.get("seq") == ev.seq for h in record.history) or _beyond_history(record, ev.seq)):
        return record, None
    if ev.seq and ev.seq < record.last_seq:
        log.info("%s: %s seq=%s arrived after seq=%s; rebuilding the record from the run's history", record_key,
                 ev.type, ev.seq, record.last_seq)
        try:
            return await _refold(bus, record, ev, record_key=record_key), True
        except PermissionDenied as exc:  # an identity without HISTORY's reads (permissions.SERVICE_ROLES)
            log.error("cannot rebuild %s for its late event seq=%s (%s); folding it out of order", record_key,
                      ev.seq, exc)
    return record, _fold(record, ev, at=time.time())


class _Batch:
    """Events of one record waiting for its previous write, each with the future its handler awaits."""

    __slots__ = ("waiting", "due")

    def __init__(self) -> None:
        self.waiting: list[tuple[Event, asyncio.Future[bool]]] = []
        self.due: asyncio.Future[None] | None = None  # a lingering group's: resolved when it need wait no more


class Projector:
    """The projection for a consumer that hands one run's events over without waiting for the previous one to be
    handled (``ConsumerLoop(ordered=False)``): it keeps each record's events in the order they arrive itself, and
    the events of a record that arrive while its previous write is in flight are applied together and written
    once (one KV write, not one per event; a run's events come in bursts: a pod's progress and its end). A lone
    event is written at once, as ``project`` writes it, unless it is one of ``LINGER``: its write then waits up to
    ``LINGER_S`` (``LINGER_ADMISSION_S`` for the admission's) for the run's next event, and goes with it. When
    one event of such a group cannot be applied (a payload that does not decode), each is applied on its own, so
    only that one fails (and is dead-lettered)."""

    def __init__(self, bus: Bus, cache: RecordCache | None = None) -> None:
        self.bus = bus
        self.cache = RecordCache() if cache is None else cache
        self._open: dict[str, _Batch] = {}  # record key → the events waiting for its previous write
        self._tail: dict[str, asyncio.Future[None]] = {}  # record key → when its latest group is written

    async def project(self, ev: Event) -> bool:
        """Apply ``ev`` to its record (with whatever else of the record is waiting); whether it changed it."""
        record_key = event_key(ev)[0]
        loop = asyncio.get_running_loop()
        mine: asyncio.Future[bool] = loop.create_future()
        joined = self._open.get(record_key)
        if joined is not None:  # a group is waiting (lingering, or for this record's previous write): join it
            joined.waiting.append((ev, mine))
            if ev.type not in LINGER and joined.due is not None and not joined.due.done():
                joined.due.set_result(None)  # this one is wanted at once, and the others with it
            return await mine
        group = _Batch()
        group.waiting.append((ev, mine))
        previous = self._tail.get(record_key)
        written: asyncio.Future[None] = loop.create_future()
        self._tail[record_key] = written
        try:
            if previous is not None or ev.type in LINGER:
                self._open[record_key] = group
                try:
                    if ev.type in LINGER:
                        # a timer on the future itself, not asyncio.wait's waiter, callbacks and sets: most of a
                        # run's events linger
                        due = group.due = loop.create_future()
                        timer = loop.call_later(LINGER_ADMISSION_S if ev.type in LINGER_ADMISSION else LINGER_S,
                                                _resolve, due)
                        try:
                            await due
                        finally:
                            timer.cancel()
                    if previous is not None:
                        await asyncio.wait([previous])  # never raises: always resolved with None
                finally:
                    if self._open.get(record_key) is group:
                        del self._open[record_key]
            await self._write(group.waiting)
        finally:
            written.set_result(None)
            if self._tail.get(record_key) is written:
                del self._tail[record_key]
            for _, fut in group.waiting:  # interrupted (cancelled): the others are told to retry
                if fut is not mine and not fut.done():
                    fut.set_exception(TemporaryError("the run_state write was interrupted", delay=0.5))
        return await mine

    async def _write(self, waiting: list[tuple[Event, asyncio.Future[bool]]]) -> None:
        if len(waiting) > 1:
            try:
                changed = await _project_all(self.bus, [ev for ev, _ in waiting], cache=self.cache)
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass  # one event does not apply: each on its own below, so only it fails
            except Exception as exc:  # noqa: BLE001 - each event's handler gets the write's failure
                for _, fut in waiting:
                    fut.set_exception(exc)
                return
            else:
                for (_, fut), one in zip(waiting, changed, strict=True):
                    fut.set_result(one)
                return
        for ev, fut in waiting:
            try:
                fut.set_result(await project(self.bus, ev, cache=self.cache))
            except Exception as exc:  # noqa: BLE001 - the handler of this event raises it
                fut.set_exception(exc)


def _resolve(due: asyncio.Future[None]) -> None:
    if not due.done():
        due.set_result(None)


def _fold(record: states.RunRecord, ev: Event, *, at: float) -> bool:
    """Apply ``ev`` to ``record`` in place and note it in the history; whether the state machine took it."""
    changed = states.apply(record, ev.type, ev.attempt, ev.as_dict(), at)
    _enrich(record, ev)
    record.last_seq = max(record.last_seq, ev.seq)
    if record.evidence_digest:
        # Sealed (issue 27): the record keeps one revision without its history, which the sealed bundle holds
        # (its ``events``); ``last_seq`` alone tells what it has folded, as nothing folds into it after the seal
        # but events stored after it (``_apply``), a late cancel or a duplicate's redelivery. Nor the signer's key
        # (~66 B of a sealed record, compressed), which no reader takes from the record: the bundle's identity
        # holds it, verified (``tau verify``, the portal's evidence tab).
        record.history.clear()
        record.signer = ""
        return changed
    record.history.append({"seq": ev.seq, "type": ev.type, "attempt": ev.attempt, "time": ev.time,
                           "applied": changed})
    del record.history[:-HISTORY]
    return changed


def _beyond_history(record: states.RunRecord, seq: int) -> bool:
    """Older than the oldest entry of a full history: it was projected before the history dropped it."""
    return len(record.history) >= HISTORY and seq < int(record.history[0].get("seq") or 0)


async def _refold(bus: Bus, record: states.RunRecord, late: Event, *, record_key: str) -> states.RunRecord:
    """The record rebuilt from ``late``'s run's events as HISTORY keeps them (``history.run_events``), in RUNS
    order (``late`` among them), each applied at the time HISTORY stored it (a millisecond after RUNS did). They
    are read through the newest event the record has folded (its ``last_seq``), waiting for HISTORY's feed to hold
    it: after a server restart, what makes events arrive late, the feed takes seconds to copy again, and a record
    rebuilt from less would drop events it had folded, which are not delivered again (past
    ``history.CATCH_UP_S``, ``TemporaryError``: ``late`` is delivered again later). The run's later events fold
    when they are delivered."""
    _, workspace, run = record_key.split(".", 2)  # HISTORY's subject holds the tokens RUNS' subject has
    events = await history.run_events(bus, workspace, run, through=max(record.last_seq, late.seq))
    rebuilt = states.RunRecord(run_id=record.run_id, workspace=record.workspace, created=record.created)
    seen = False
    for ev in events:
        if ev.subject != late.subject:
            continue  # another run whose id sanitises to the same token
        seen = seen or ev.seq == late.seq
        try:
            _fold(rebuilt, ev, at=ev.stored or time.time())
        except msgspec.DecodeError:
            continue  # dead-lettered on its own delivery; it never changed the record
    if not seen:  # HISTORY no longer holds it (retention): fold it last rather than lose it
        _fold(rebuilt, late, at=time.time())
    return rebuilt


def _enrich(record: states.RunRecord, ev: Event) -> None:
    if ev.type == "submit.requested":
        record.submission_id = ev.payload(SubmitRequested).submission_id  # its `user` is only a claim
    elif ev.type == "submit.accepted":
        acc = ev.payload(SubmitAccepted)
        record.name = str(acc.config.get("name", record.name))
        record.user, record.signer = acc.user, acc.signer  # verified by the submitter
    elif ev.type == "submit.rejected" and not record.user:
        record.user = ev.user
    elif ev.type == "policy.approved":
        pa = ev.payload(PolicyApproved)
        record.resolved = pa.run
        record.queue = pa.run.local_queue
        record.cluster_queue = pa.run.cluster_queue
        record.name = pa.run.name
    elif ev.type == "recovery.retrying":
        record.exclude_nodes = list(ev.as_dict().get("exclude_nodes", []))
    elif ev.type == "evidence.sealed":
        record.evidence_digest = str(ev.as_dict().get("digest", ""))
