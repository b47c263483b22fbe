"""A leader lease in a KV key: one active kube-bridge per cluster.

The value is ``{"holder", "renewed_at"}``; every write is a compare-and-set on the KV revision, so two
bridges can never both believe they won the same revision. A holder renews every ``ttl_s / 3``; a standby
takes over once ``renewed_at`` is older than ``ttl_s`` (wall clocks must agree to within a few seconds).

Note: this module is the only one in the service that touches nats-py; it belongs in ``taugrid.bus``.
"""

from __future__ import annotations

import time

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue
from taugrid.core.errors import TemporaryError


class LeaseValue(msgspec.Struct, frozen=True):
    holder: str
    renewed_at: float


class Lease:
    def __init__(self, kv: KeyValue, key: str, holder: str, *, ttl_s: float = 15.0) -> None:
        self.kv, self.key, self.holder, self.ttl_s = kv, key, holder, ttl_s
        self.revision: int | None = None  # set while we hold it

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def try_acquire(self) -> bool:
        """Take the lease if free or stale, or renew it if ours. False: someone else holds it (or we lost it)."""
        value = msgspec.json.encode(LeaseValue(holder=self.holder, renewed_at=time.time()))
        try:
            if self.revision is not None:
                self.revision = await self.kv.update(self.key, value, last=self.revision)
                return True
            try:
                entry = await self.kv.get(self.key)
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                self.revision = await self.kv.create(self.key, value)
                return True
            current = msgspec.json.decode(entry.value or b"{}", type=LeaseValue)
            if current.holder != self.holder and time.time() - current.renewed_at < self.ttl_s:
                return False
            self.revision = await self.kv.update(self.key, value, last=entry.revision)
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            self.revision = None  # someone else wrote in between: they hold it now
            return False
        except msgspec.DecodeError:
            entry_rev = (await self.kv.get(self.key)).revision
            self.revision = await self.kv.update(self.key, value, last=entry_rev)
            return True
        except (nats.errors.Error, TimeoutError) as exc:
            raise TemporaryError(f"lease {self.key}: {exc!r}", delay=1.0) from exc

    async def release(self) -> None:
        """Hand the lease over at once (a standby need not wait for the TTL)."""
        if self.revision is None:
            return
        stale = msgspec.json.encode(LeaseValue(holder="", renewed_at=0.0))
        try:
            await self.kv.update(self.key, stale, last=self.revision)
        except (nats.errors.Error, TimeoutError):
            pass  # it expires by itself
        self.revision = None


class Checkpoints:
    """The last resourceVersion per watched resource, so a restarted bridge resumes where it was."""

    def __init__(self, kv: KeyValue, cluster: str) -> None:
        self.kv, self.cluster = kv, cluster

    def _key(self, plural: str) -> str:
        return f"rv.{self.cluster}.{plural}"

    async def get(self, plural: str) -> str | None:
        try:
            entry = await self.kv.get(self._key(plural))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except (nats.errors.Error, TimeoutError) as exc:
            raise TemporaryError(f"checkpoint {plural}: {exc!r}", delay=1.0) from exc
        return (entry.value or b"").decode() or None

    async def put(self, plural: str, resource_version: str) -> None:
        try:
            await self.kv.put(self._key(plural), resource_version.encode())
        except (nats.errors.Error, TimeoutError) as exc:
            raise TemporaryError(f"checkpoint {plural}: {exc!r}", delay=1.0) from exc
