"""Read and project run records in the ``run_state`` KV bucket.

Every write is a compare-and-set against the revision just read; a lost race re-reads and re-applies, and an
invalid transition (duplicate, stale attempt, after terminal) is a no-op, so the projection is idempotent.
A projector may keep a ``RecordCache`` of the records it last wrote: the cached revision is only the CAS
precondition, so a stale entry (another replica wrote since) fails the write and is re-read from the bucket.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import msgspec
import nats

from taugrid.bus import kvread
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core import states
from taugrid.core.contracts import PolicyApproved, SubmitAccepted, SubmitRequested
from taugrid.core.errors import TemporaryError

BUCKET = "run_state"


def key(run_id: str) -> str:
    return f"run.{run_id}"


async def get(bus: Bus, run_id: str) -> tuple[states.RunRecord | None, int]:
    kv = await bus.kv(BUCKET)
    try:
        entry = await kv.get(key(run_id))
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return None, 0
    if entry.value is None:
        return None, 0
    return msgspec.json.decode(entry.value, type=states.RunRecord), int(entry.revision or 0)


async def create(bus: Bus, record: states.RunRecord) -> bool:
    """Create-once: False when the record already exists."""
    kv = await bus.kv(BUCKET)
    try:
        await kv.create(key(record.run_id), msgspec.json.encode(record))
    except nats.js.errors.KeyWrongLastSequenceError:
        return False
    return True


class RecordCache:
    """The records one projector last wrote, with their revisions (bounded, least recently used out).

    An entry is taken out while an event is applied to it (``take``) and put back only after its write
    succeeded (``put``), so a failed or abandoned write never leaves a record in the cache that the bucket
    does not hold.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[states.RunRecord, int]] = OrderedDict()

    def take(self, run_id: str) -> tuple[states.RunRecord, int] | None:
        return self._entries.pop(run_id, None)

    def put(self, run_id: str, record: states.RunRecord, revision: int) -> None:
        self._entries[run_id] = (record, revision)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


async def project(bus: Bus, ev: Event, *, cache: RecordCache | None = None) -> bool:
    """Apply one RUNS event to its record. Returns whether the record changed."""
    kv = await bus.kv(BUCKET)
    run_id = ev.subject
    for _ in range(20):
        cached = cache.take(run_id) if cache is not None else None
        record, revision = cached if cached is not None else await get(bus, run_id)
        if record is None:
            record = states.RunRecord(run_id=run_id, workspace=ev.workspace, created=time.time())
        if ev.seq and any(h.get("seq") == ev.seq for h in record.history):
            if cache is not None and revision:
                cache.put(run_id, record, revision)
            return False  # already projected (redelivery)
        data = ev.as_dict()
        changed = states.apply(record, ev.type, ev.attempt, data, time.time())
        _enrich(record, ev)
        record.last_seq = max(record.last_seq, ev.seq)
        record.history.append({"seq": ev.seq, "type": ev.type, "attempt": ev.attempt, "time": ev.time,
                               "applied": changed})
        del record.history[:-200]
        try:
            body = msgspec.json.encode(record)
            if revision:
                written = await kv.update(key(run_id), body, last=revision)
            else:
                written = await kv.create(key(run_id), body)
        except nats.js.errors.KeyWrongLastSequenceError:
            continue  # another writer (a replica) got there first; the cache entry is gone, so re-read
        if cache is not None:
            cache.put(run_id, record, int(written))
        return changed
    raise TemporaryError(f"run_state contention on {run_id}", delay=0.2)


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


class VerifiedUsers:
    """run id → its verified submitter, read from the run record once and then cached (it never changes).

    Used by services for events they emit outside a run event's handler (watch events, node samples).
    A run the submitter has not decided yet has no verified user: that is a ``TemporaryError``, so the
    event waits rather than going out unattributed."""

    def __init__(self, bus: Bus, size: int = 8192) -> None:
        self.bus, self.size = bus, size
        self._known: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, run_id: str) -> str:
        if run_id in self._known:
            self._known.move_to_end(run_id)
            return self._known[run_id]
        record, _ = await get(self.bus, run_id)
        if record is None or record.state in ("new", "submitted"):
            raise TemporaryError(f"run {run_id} has no verified submitter yet", delay=0.5)
        if record.user:
            self._known[run_id] = record.user
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return record.user


async def list_records(bus: Bus) -> list[states.RunRecord]:
    return await kvread.values(bus, BUCKET, states.RunRecord, prefix="run.")
