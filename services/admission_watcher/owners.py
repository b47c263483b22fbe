"""Which run a job uid belongs to, shared by every admission-watcher replica and surviving restarts.

A real Kueue Workload names its job only by uid (``kueue.x-k8s.io/job-uid``, ownerReferences), so resolving
it needs the Job/RayJob event seen earlier — possibly by another replica or before a restart. Each Job/RayJob
uid is therefore written once to the ``bridge`` KV bucket as ``owner.<uid>`` → ``{workspace, run_id,
attempt}``; an in-process LRU caches what this replica has seen or read.

Invariants: entries are write-once (create; an existing key is left alone — a uid never changes run) and are
never deleted (a late Workload event for a deleted job still resolves); only Job/RayJob uids are persisted, and
not those of a job annotated ``taugrid.io/run-labelled`` (the local cluster's: its Workload and pods carry the
run labels, and an eviction names the preemptor's run), which no Workload needs resolved.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.contracts import WatchEvent
from taugrid.kube.translate import RunRef, remember_owner, run_labelled, run_ref

BUCKET = "bridge"
OWNER_KINDS = frozenset({"Job", "RayJob"})
MEMORY = 50_000


class StoredRef(msgspec.Struct, frozen=True):
    workspace: str
    run_id: str
    attempt: int


def key(uid: str) -> str:
    return f"owner.{uid}"


class Owners:
    """``memory`` is the uid → RunRef map ``translate`` reads; ``remember``/``recall`` keep it filled."""

    def __init__(self, bus: Bus, *, memory: int = MEMORY) -> None:
        self.bus, self.limit = bus, memory
        self.memory: OrderedDict[str, RunRef] = OrderedDict()

    async def remember(self, ev: WatchEvent) -> None:
        """Learn from a tau-labelled object; persist a Job/RayJob owner the first time this process sees it."""
        meta = ev.object.get("metadata") or {}
        uid, ref = str(meta.get("uid") or ""), run_ref(ev.object)
        # Only a job whose Workload names it by uid alone (Kueue's) needs the entry; the local cluster's don't.
        owner = ev.type != "DELETED" and ev.object.get("kind") in OWNER_KINDS and not run_labelled(ev.object)
        if uid and ref is not None and owner and self.memory.get(uid) != ref:
            await self._store(uid, ref)
        remember_owner(ev, self.memory)
        if uid in self.memory:
            self.memory.move_to_end(uid)
        self._trim()

    async def recall(self, uids: Iterable[str]) -> None:
        """Load any of ``uids`` this replica does not know from KV into memory (unknown ones stay unknown)."""
        for uid in uids:
            if not uid or uid in self.memory:
                continue
            ref = await self._load(uid)
            if ref is not None:
                self.memory[uid] = ref
        self._trim()

    def _trim(self) -> None:
        while len(self.memory) > self.limit:
            self.memory.popitem(last=False)

    async def _store(self, uid: str, ref: RunRef) -> None:
        # create-once: an existing key was recorded by another replica, or by us before a restart
        await kv.create(self.bus, BUCKET, key(uid),
                        StoredRef(workspace=ref.workspace, run_id=ref.run_id, attempt=ref.attempt))

    async def _load(self, uid: str) -> RunRef | None:
        found = await kv.get(self.bus, BUCKET, key(uid))
        if found is None:
            return None
        try:
            stored = msgspec.json.decode(found.value, type=StoredRef)
        except msgspec.DecodeError:
            return None
        return RunRef(workspace=stored.workspace, run_id=stored.run_id, attempt=stored.attempt)
