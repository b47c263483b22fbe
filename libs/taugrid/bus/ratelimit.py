"""Per-workspace submission rate limit: a fixed one-minute window counted in the ``submissions`` KV bucket.

Key ``rate.<workspace>`` holds ``{window, count}`` (``window`` = the minute since the epoch). Every submitter
replica counts under compare-and-set, so the limit holds across replicas and restarts. Only a new submission
counts (the caller counts after claiming the submission id), so a redelivery never uses up the budget.
"""

from __future__ import annotations

import time

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.errors import TemporaryError
from taugrid.core.ids import token

BUCKET = "submissions"


class Window(msgspec.Struct, kw_only=True):
    window: int = 0
    count: int = 0


async def admit(bus: Bus, workspace: str, *, per_minute: int, now: float | None = None) -> bool:
    """Count one submission in ``workspace``'s current minute; False when that minute already holds
    ``per_minute`` (``per_minute`` 0 = unlimited, nothing counted)."""
    if per_minute <= 0:
        return True
    minute = int((time.time() if now is None else now) // 60)
    key = f"rate.{token(workspace)}"
    for _ in range(20):
        try:
            current, revision = await kv.load(bus, BUCKET, key, Window)
        except msgspec.DecodeError:  # a submission id that happened to be this key: overwrite it
            current, revision = None, await _revision(bus, key)
        count = current.count if current is not None and current.window == minute else 0
        if count >= per_minute:
            return False
        try:
            await kv.save(bus, BUCKET, key, Window(window=minute, count=count + 1), revision=revision)
            return True
        except kv.Conflict:
            continue
    raise TemporaryError(f"counting a submission in {workspace!r} kept losing races", delay=0.2)


async def _revision(bus: Bus, key: str) -> int:
    found = await kv.get(bus, BUCKET, key)
    return found.revision if found is not None else 0
