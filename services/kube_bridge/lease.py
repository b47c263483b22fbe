"""A leader lease in a KV key: one active kube-bridge per cluster.

The value is ``{"holder", "renewed_at"}``; every write is a compare-and-set on the KV revision, so two
bridges can never both believe they won the same revision. A holder renews every ``ttl_s / 3``; a standby
takes over once ``renewed_at`` is older than ``ttl_s`` (wall clocks must agree to within a few seconds).
"""

from __future__ import annotations

import contextlib
import time

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.errors import TemporaryError


class LeaseValue(msgspec.Struct, frozen=True):
    holder: str
    renewed_at: float


class Lease:
    def __init__(self, bus: Bus, bucket: str, key: str, holder: str, *, ttl_s: float = 15.0) -> None:
        self.bus, self.bucket, self.key, self.holder, self.ttl_s = bus, bucket, key, holder, ttl_s
        self.revision: int | None = None  # set while we hold it

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def try_acquire(self) -> bool:
        """Take the lease if free or stale, or renew it if ours. False: someone else holds it (or we lost it).
        ``TemporaryError`` when the bus cannot answer."""
        value = LeaseValue(holder=self.holder, renewed_at=time.time())
        try:
            if self.revision is None:
                found = await kv.get(self.bus, self.bucket, self.key)
                if found is not None and self._held_by_other(found.value):
                    return False
                self.revision = found.revision if found is not None else 0
            self.revision = await kv.save(self.bus, self.bucket, self.key, value, revision=self.revision)
            return True
        except kv.Conflict:
            self.revision = None  # someone else wrote in between: they hold it now
            return False

    def _held_by_other(self, stored: bytes) -> bool:
        try:
            current = msgspec.json.decode(stored or b"{}", type=LeaseValue)
        except msgspec.DecodeError:
            return False  # unreadable: nobody can claim it, so it is free
        return current.holder != self.holder and time.time() - current.renewed_at < self.ttl_s

    async def release(self) -> None:
        """Hand the lease over at once (a standby need not wait for the TTL)."""
        if self.revision is None:
            return
        stale = LeaseValue(holder="", renewed_at=0.0)
        with contextlib.suppress(TemporaryError):  # if not handed over, it expires by itself
            await kv.save(self.bus, self.bucket, self.key, stale, revision=self.revision)
        self.revision = None


class Checkpoints:
    """The last resourceVersion per watched resource, so a restarted bridge resumes where it was."""

    def __init__(self, bus: Bus, bucket: str, cluster: str) -> None:
        self.bus, self.bucket, self.cluster = bus, bucket, cluster

    def _key(self, plural: str) -> str:
        return f"rv.{self.cluster}.{plural}"

    async def get(self, plural: str) -> str | None:
        found = await kv.get(self.bus, self.bucket, self._key(plural))
        if found is None or not found.value:
            return None
        return found.value.decode()

    async def put(self, plural: str, resource_version: str) -> None:
        await kv.put(self.bus, self.bucket, self._key(plural), resource_version.encode())
