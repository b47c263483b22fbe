"""Read and project run records in the ``run_state`` KV bucket.

Every write is a compare-and-set against the revision just read; a lost race re-reads and re-applies, and an
invalid transition (duplicate, stale attempt, after terminal) is a no-op, so the projection is idempotent.
"""

from __future__ import annotations

import time

import msgspec
import nats

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


async def project(bus: Bus, ev: Event) -> bool:
    """Apply one RUNS event to its record. Returns whether the record changed."""
    kv = await bus.kv(BUCKET)
    run_id = ev.subject
    for _ in range(20):
        record, revision = await get(bus, run_id)
        if record is None:
            record = states.RunRecord(run_id=run_id, workspace=ev.workspace, created=time.time())
        if ev.seq and any(h.get("seq") == ev.seq for h in record.history):
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
                await kv.update(key(run_id), body, last=revision)
            else:
                await kv.create(key(run_id), body)
            return changed
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
    raise TemporaryError(f"run_state contention on {run_id}", delay=0.2)


def _enrich(record: states.RunRecord, ev: Event) -> None:
    if ev.type == "submit.requested":
        req = ev.payload(SubmitRequested)
        record.submission_id = req.submission_id
        record.user = req.user
    elif ev.type == "submit.accepted":
        acc = ev.payload(SubmitAccepted)
        record.name = str(acc.config.get("name", record.name))
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


async def list_records(bus: Bus) -> list[states.RunRecord]:
    kv = await bus.kv(BUCKET)
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
    out = []
    for k in keys:
        try:
            entry = await kv.get(k)
        except nats.js.errors.KeyNotFoundError:
            continue
        if entry.value:
            out.append(msgspec.json.decode(entry.value, type=states.RunRecord))
    return out
