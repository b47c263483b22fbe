"""Read and project run records in the ``run_state`` KV bucket.

Keys are ``run.<workspace>.<run>`` (both as subject tokens), so a person's bus permissions can confine their
reads to their workspaces' records (``permissions.person_permissions``). The workspace of a projected event is
the one in its NATS subject, which the server's publish permissions vouch for (never the ``ce-workspace``
header alone). A run found by id alone (``find``) is looked up with one wildcard direct get, which only
services and platform admins may send; people search their own workspaces.

Every write is a compare-and-set against the revision just read; a lost race re-reads and re-applies, and an
invalid transition (duplicate, stale attempt, after terminal) is a no-op, so the projection is idempotent.
A projector may keep a ``RecordCache`` of the records it last wrote: the cached revision is only the CAS
precondition, so a stale entry (another replica wrote since) fails the write and is re-read from the bucket.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core import states
from taugrid.core.contracts import PolicyApproved, SubmitAccepted, SubmitRequested
from taugrid.core.errors import TemporaryError
from taugrid.core.ids import token

BUCKET = "run_state"


def key(workspace: str, run_id: str) -> str:
    return f"run.{token(workspace)}.{token(run_id)}"


def _event_key(ev: Event) -> tuple[str, str]:
    """(key, workspace) of the record a RUNS event belongs to: the workspace token of its NATS subject."""
    parts = ev.nats_subject.split(".")
    ws = parts[1] if len(parts) >= 3 and parts[0] == "run" else token(ev.workspace)
    return f"run.{ws}.{token(ev.subject)}", ev.workspace or ws


async def _get_key(bus: Bus, k: str) -> tuple[states.RunRecord | None, int]:
    return await kv.load(bus, BUCKET, k, states.RunRecord)


async def get(bus: Bus, workspace: str, run_id: str) -> tuple[states.RunRecord | None, int]:
    """The record of ``run_id`` in ``workspace`` and its revision; (None, 0) when there is none."""
    return await _get_key(bus, key(workspace, run_id))


async def get_for(bus: Bus, ev: Event) -> tuple[states.RunRecord | None, int]:
    """The record of the run a RUNS event is about, in the workspace its subject names."""
    return await _get_key(bus, _event_key(ev)[0])


async def find(bus: Bus, run_id: str, *, workspaces: Sequence[str] | None = None) -> states.RunRecord | None:
    """The record of ``run_id`` when its workspace is not known. ``workspaces=None``: any workspace, by one
    wildcard direct get (services, platform admins); else only those workspaces, one get each (people, whose
    permissions name their workspaces)."""
    if workspaces is not None:
        for ws in workspaces:
            record, _ = await get(bus, ws, run_id)
            if record is not None:
                return record
        return None
    raw = await kv.last_by_wildcard(bus, BUCKET, f"run.*.{token(run_id)}")
    return msgspec.json.decode(raw, type=states.RunRecord) if raw else None


async def create(bus: Bus, record: states.RunRecord) -> bool:
    """Create-once: False when the record already exists."""
    return await kv.create(bus, BUCKET, key(record.workspace, record.run_id), record) is not None


class RecordCache:
    """The records one projector last wrote, by KV key, with their revisions (bounded, least recently used out).

    An entry is taken out while an event is applied to it (``take``) and put back only after its write
    succeeded (``put``), so a failed or abandoned write never leaves a record in the cache that the bucket
    does not hold.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[states.RunRecord, int]] = OrderedDict()

    def take(self, record_key: str) -> tuple[states.RunRecord, int] | None:
        return self._entries.pop(record_key, None)

    def put(self, record_key: str, record: states.RunRecord, revision: int) -> None:
        self._entries[record_key] = (record, revision)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


async def project(bus: Bus, ev: Event, *, cache: RecordCache | None = None) -> bool:
    """Apply one RUNS event to its record. Returns whether the record changed."""
    run_id = ev.subject
    record_key, workspace = _event_key(ev)
    for _ in range(20):
        cached = cache.take(record_key) if cache is not None else None
        record, revision = cached if cached is not None else await _get_key(bus, record_key)
        if record is None:
            record = states.RunRecord(run_id=run_id, workspace=workspace, created=time.time())
        if ev.seq and any(h.get("seq") == ev.seq for h in record.history):
            if cache is not None and revision:
                cache.put(record_key, record, revision)
            return False  # already projected (redelivery)
        data = ev.as_dict()
        changed = states.apply(record, ev.type, ev.attempt, data, time.time())
        _enrich(record, ev)
        record.last_seq = max(record.last_seq, ev.seq)
        record.history.append({"seq": ev.seq, "type": ev.type, "attempt": ev.attempt, "time": ev.time,
                               "applied": changed})
        del record.history[:-200]
        try:
            written = await kv.save(bus, BUCKET, record_key, record, revision=revision)
        except kv.Conflict:
            continue  # another writer (a replica) got there first; the cache entry is gone, so re-read
        if cache is not None:
            cache.put(record_key, record, int(written))
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
    """(workspace, run id) → its verified submitter, read from the run record once and then cached (it never changes).

    Used by services for events they emit outside a run event's handler (watch events, node samples).
    A run the submitter has not decided yet has no verified user: that is a ``TemporaryError``, so the
    event waits rather than going out unattributed."""

    def __init__(self, bus: Bus, size: int = 8192) -> None:
        self.bus, self.size = bus, size
        self._known: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, workspace: str, run_id: str) -> str:
        k = key(workspace, run_id)
        if k in self._known:
            self._known.move_to_end(k)
            return self._known[k]
        record, _ = await get(self.bus, workspace, run_id)
        if record is None or record.state in ("new", "submitted"):
            raise TemporaryError(f"run {run_id} has no verified submitter yet", delay=0.5)
        if record.user:
            self._known[k] = record.user
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return record.user


async def list_records(bus: Bus, *, workspaces: Sequence[str] | None = None) -> list[states.RunRecord]:
    """Every record (``workspaces=None``: services, platform admins), else only those workspaces' records,
    each read through a consumer whose filter names the workspace (what people's permissions allow)."""
    if workspaces is None:
        return await kv.values(bus, BUCKET, states.RunRecord, prefix="run.")
    out: list[states.RunRecord] = []
    for ws in dict.fromkeys(token(w) for w in workspaces):
        out += await kv.filtered_values(bus, BUCKET, states.RunRecord, key_filter=f"run.{ws}.*")
    return out
