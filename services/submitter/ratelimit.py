"""Per-workspace submission pacing: a burst beyond a workspace's rate waits its turn; it is not rejected.

The rate (``workspaces[].submissions_per_minute``) protects the bus, not against people: ``per_minute``
submissions are admitted at once (the burst), then one every ``60 / per_minute`` seconds. It is a generic cell
rate algorithm over one value per workspace, ``rate.<workspace>`` in the ``submissions`` KV bucket: ``tat``, the
time from which the next submission would wait. Each new submission reserves the next slot under
compare-and-set, so the pace holds across submitter replicas and restarts, and slots go in the order the
submissions were stored among those a replica has in hand (one reservation at a time per workspace in each
replica, each after every earlier one in hand: ``enter``/``leave``).

A submission with a slot in the future gets ``due.<submission id>`` (when it is due) and waits in the stream: the
submitter naks it until then (``errors.NotYet``) and admits it when it comes back. Such a submission holds one
of the submitter durable's unacknowledged deliveries while it waits, so a workspace's backlog is bounded
(``max_backlog``, default ``limits.PACED_SUBMISSIONS_MAX``): a submission that would have more than that many
ahead of it is refused (``Backlogged``), leaving the durable room for every other workspace's submissions.
Only a new submission reserves (the caller asks after claiming the submission id), so a redelivery never uses up
the rate; a redelivered paced submission reads back its own ``due`` time.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import defaultdict

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.errors import TemporaryError
from taugrid.core.ids import token
from taugrid.core.limits import PACED_SUBMISSIONS_MAX

BUCKET = "submissions"
DUE_SLACK_S = 0.05  # a redelivery this early counts as on time (the server's timers are not exact)


class Pace(msgspec.Struct, kw_only=True):
    """``rate.<workspace>``: from when the next submission waits (epoch seconds; 0 = never yet)."""

    tat: float = 0.0


class Due(msgspec.Struct, kw_only=True):
    """``due.<submission id>``: when a paced submission is admitted (epoch seconds)."""

    at: float


class Backlogged(Exception):
    """The workspace already has ``ahead`` submissions waiting for their slots (the most it may have)."""

    def __init__(self, *, ahead: int, wait_s: float) -> None:
        super().__init__(f"{ahead} submissions are waiting; this one would wait {wait_s:.0f}s")
        self.ahead, self.wait_s = ahead, wait_s


class Pacer:
    """One submitter replica's side of the pace: reservations, one at a time per workspace."""

    def __init__(self, bus: Bus, *, max_backlog: int = PACED_SUBMISSIONS_MAX) -> None:
        self.bus, self.max_backlog = bus, max_backlog
        self._turns: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The stream sequences of the submissions this replica is handling, per workspace, and a condition to wait
        # on: a new submission reserves only once every earlier one in hand has reserved or left, so slots go in
        # the order the submissions were stored, not in the order their checks (round trips each) happened to end.
        self._in_hand: defaultdict[str, set[int]] = defaultdict(set)
        self._moved = asyncio.Condition()

    def enter(self, workspace: str, seq: int) -> None:
        """``seq`` of ``workspace`` is being handled (called before the handler's first await)."""
        self._in_hand[workspace].add(seq)

    async def leave(self, workspace: str, seq: int) -> None:
        """``seq`` reserved, or was handled without reserving."""
        held = self._in_hand.get(workspace)
        if held is not None and seq in held:
            held.discard(seq)
            if not held:
                del self._in_hand[workspace]
            async with self._moved:
                self._moved.notify_all()

    async def _after_earlier(self, workspace: str, seq: int) -> None:
        async with self._moved:
            await self._moved.wait_for(lambda: not any(s < seq for s in self._in_hand.get(workspace, ())))

    async def reserve(self, workspace: str, submission_id: str, *, per_minute: int, now: float | None = None,
                      seq: int = 0) -> float:
        """Reserve the next slot of ``workspace`` for a new submission: the seconds until it is admitted (0: now;
        ``per_minute`` 0 = unlimited, nothing reserved). Raises ``Backlogged`` when the workspace already has
        ``max_backlog`` submissions waiting. With ``seq`` (one ``enter`` ed), after every earlier one in hand."""
        if per_minute <= 0:
            return 0.0
        if seq:
            await self._after_earlier(workspace, seq)
        async with self._turns[workspace]:
            return await self._reserve(workspace, submission_id, per_minute=per_minute, now=now)

    async def _reserve(self, workspace: str, submission_id: str, *, per_minute: int, now: float | None) -> float:
        interval = 60.0 / per_minute
        burst = (per_minute - 1) * interval  # how far ahead of now the slots may run before one waits
        key = f"rate.{token(workspace)}"
        for _ in range(20):
            t = time.time() if now is None else now
            try:
                current, revision = await kv.load(self.bus, BUCKET, key, Pace)
            except msgspec.DecodeError:  # a submission id that happened to be this key: overwrite it
                current, revision = None, await _revision(self.bus, key)
            tat = max(current.tat if current is not None else 0.0, t)
            wait = max(0.0, round(tat - burst - t, 6))  # to the microsecond: no float dust makes a wait
            ahead = round(wait / interval)
            if ahead > self.max_backlog:
                raise Backlogged(ahead=ahead - 1, wait_s=wait)
            try:
                await kv.save(self.bus, BUCKET, key, Pace(tat=tat + interval), revision=revision)
            except kv.Conflict:  # another replica reserved in between: read its slot and take the next
                continue
            if wait > 0:
                await kv.put(self.bus, BUCKET, _due_key(submission_id), Due(at=t + wait))
            return wait
        raise TemporaryError(f"reserving a submission slot in {workspace!r} kept losing races", delay=0.2)

    async def due(self, submission_id: str, *, now: float | None = None) -> float:
        """Seconds until a submission reserved before is admitted; 0 when it is due or was never paced."""
        try:
            found, _ = await kv.load(self.bus, BUCKET, _due_key(submission_id), Due)
        except msgspec.DecodeError:
            return 0.0
        if found is None:
            return 0.0
        left = found.at - (time.time() if now is None else now)
        return left if left > DUE_SLACK_S else 0.0


def _due_key(submission_id: str) -> str:
    """Hashed: any id a client chose maps to a valid key, and no two ids to the same one."""
    return f"due.{hashlib.sha256(submission_id.encode()).hexdigest()[:32]}"


async def _revision(bus: Bus, key: str) -> int:
    found = await kv.get(bus, BUCKET, key)
    return found.revision if found is not None else 0
