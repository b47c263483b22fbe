"""The one way to read a run record from the ``run_state`` KV bucket, and the one rule for a record not there yet.

Keys are ``run.<workspace>.<run>`` (both as subject tokens), so a person's bus permissions can confine their
reads to their workspaces' records (``access.permissions.person_permissions``). A run found by id alone
(``find``) is looked up with one wildcard direct get, which only services and platform admins may send; people
search their own workspaces.

Read on doubt: the projection (``services/run_record``) is a step behind the stream, so a stage acting on a run
event may find no record yet, or one the submitter or the policy has not decided yet. That is never a decision:
``require`` raises a ``TemporaryError`` and the event waits (nak'ed, redelivered) until the record catches up.
Every stage that needs the record to act (renderer, recovery, every emit's verified user) goes through it, so
there is one wait and one message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import Event
from taugrid.core import states
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import TemporaryError
from taugrid.core.ids import token

BUCKET = "run_state"
NOT_PROJECTED_DELAY = 0.5  # s before an event that found no record (or an undecided one) is tried again
UNDECIDED = ("new", "submitted")  # states in which the submitter has not verified the run's submitter yet


def key(workspace: str, run_id: str) -> str:
    return f"run.{token(workspace)}.{token(run_id)}"


def event_key(ev: Event) -> tuple[str, str]:
    """(key, workspace) of the record a RUNS event belongs to: the workspace token of its NATS subject."""
    parts = ev.nats_subject.split(".")
    ws = parts[1] if len(parts) >= 3 and parts[0] == "run" else token(ev.workspace)
    return f"run.{ws}.{token(ev.subject)}", ev.workspace or ws


async def load_key(bus: Bus, k: str) -> tuple[states.RunRecord | None, int]:
    return await kv.load(bus, BUCKET, k, states.RunRecord)


async def get(bus: Bus, workspace: str, run_id: str) -> tuple[states.RunRecord | None, int]:
    """The record of ``run_id`` in ``workspace`` and its revision; (None, 0) when there is none."""
    return await load_key(bus, key(workspace, run_id))


async def get_for(bus: Bus, ev: Event) -> tuple[states.RunRecord | None, int]:
    """The record of the run a RUNS event is about, in the workspace its subject names."""
    return await load_key(bus, event_key(ev)[0])


def not_projected(run_id: str, what: str = "") -> TemporaryError:
    """The one answer to a record that is not there (yet): wait for the projection, never decide on it."""
    return TemporaryError(f"run record of {run_id} not projected yet{f' ({what})' if what else ''}",
                          delay=NOT_PROJECTED_DELAY)


async def require(bus: Bus, ev: Event) -> states.RunRecord:
    """The record of ``ev``'s run, or ``not_projected`` raised when it has none yet."""
    record, _ = await get_for(bus, ev)
    if record is None:
        raise not_projected(ev.subject)
    return record


async def require_resolved(bus: Bus, ev: Event) -> tuple[states.RunRecord, ResolvedRun]:
    """The record of ``ev``'s run and the run as the policy resolved it, or ``not_projected`` raised when the
    record has no policy decision yet."""
    record = await require(bus, ev)
    if record.resolved is None:
        raise not_projected(ev.subject, "no policy decision in it yet")
    return record, record.resolved


class _Placed(msgspec.Struct):
    namespace: str = ""


class Summary(msgspec.Struct):
    """The part of a record a gate needs (msgspec skips the rest, history included)."""

    state: str = "new"
    attempt: int = 1
    user: str = ""
    resolved: _Placed | None = None  # the policy's decision, of which only the namespace is read

    @property
    def namespace(self) -> str:
        """The namespace the run's objects were rendered into; "" before the policy decided."""
        return self.resolved.namespace if self.resolved is not None else ""


async def summary(bus: Bus, workspace: str, run_id: str) -> Summary | None:
    """State, attempt, verified user and namespace of a run (None: no record yet), decoded without the history."""
    found = await kv.get(bus, BUCKET, key(workspace, run_id))
    if found is None or not found.value:
        return None
    return msgspec.json.decode(found.value, type=Summary)


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


async def list_records(bus: Bus, *, workspaces: Sequence[str] | None = None) -> list[states.RunRecord]:
    """Every record (``workspaces=None``: services, platform admins), else only those workspaces' records,
    each read through a consumer whose filter names the workspace (what people's permissions allow)."""
    if workspaces is None:
        return await kv.values(bus, BUCKET, states.RunRecord, prefix="run.")
    out: list[states.RunRecord] = []
    for ws in dict.fromkeys(token(w) for w in workspaces):
        out += await kv.filtered_values(bus, BUCKET, states.RunRecord, key_filter=f"run.{ws}.*")
    return out


class VerifiedUsers:
    """(workspace, run id) → its verified submitter, read from the run record once and then cached (it never changes).

    Used by services for events they emit outside a run event's handler (watch events, node samples).
    A run the submitter has not decided yet has no verified user: that is ``not_projected``, so the
    event waits rather than going out unattributed."""

    def __init__(self, bus: Bus, size: int = 8192) -> None:
        self.bus, self.size = bus, size
        self._known: OrderedDict[str, str] = OrderedDict()

    async def __call__(self, workspace: str, run_id: str) -> str:
        k = key(workspace, run_id)
        if k in self._known:
            self._known.move_to_end(k)
            return self._known[k]
        found = await summary(self.bus, workspace, run_id)
        if found is None or found.state in UNDECIDED:
            raise not_projected(run_id, "its submitter is not verified yet")
        if found.user:
            self._known[k] = found.user
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return found.user
