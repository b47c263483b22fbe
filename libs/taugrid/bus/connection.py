"""Connection to NATS with reconnect and error callbacks, and typed publish helpers.

Invariant: every publish to a stream waits for the JetStream ack (so "published" means "stored") and carries a
deterministic ``Nats-Msg-Id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from taugrid.bus import identity, tracing
from taugrid.bus.envelope import SIGNED_TYPES, Event, headers_for, sign_headers
from taugrid.core.errors import TemporaryError
from taugrid.core.events import message_id, run_subject

log = logging.getLogger("taugrid.bus")

DEFAULT_URL = "nats://127.0.0.1:4222"


def default_url() -> str:
    return os.environ.get("TAU_NATS_URL", DEFAULT_URL)


class Bus:
    """One service's handle on NATS: JetStream, KV buckets, the evidence object store."""

    def __init__(self, nc: Client, source: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self.source = source
        self._kv: dict[str, KeyValue] = {}
        self._obs: ObjectStore | None = None
        # A person's nkey seed: their submit/cancel requests are signed with it (the client sets it).
        self.seed: bytes | None = None
        # run id → its verified submitter, for events emitted outside a run event's handler (a service sets
        # it: ``runstate.verified_user``); None leaves ``ce-tauuser`` off unless the caller names the user.
        self.user_lookup: Callable[[str], Awaitable[str]] | None = None

    async def kv(self, bucket: str) -> KeyValue:
        if bucket not in self._kv:
            self._kv[bucket] = await self.js.key_value(bucket)
        return self._kv[bucket]

    async def objects(self) -> ObjectStore:
        if self._obs is None:
            from taugrid.bus.topology import OBJECT_STORE

            self._obs = await self.js.object_store(OBJECT_STORE)
        return self._obs

    async def publish(
        self, subject: str, payload: msgspec.Struct | bytes, *, event_type: str, ce_subject: str,
        msg_id: str, workspace: str = "", attempt: int = 1, family: str = "run",
        traceparent: str | None = None, user: str = "",
    ) -> int:
        """Publish one CloudEvent into a stream and return its stream sequence. A person's request
        (``SIGNED_TYPES``) is signed with ``self.seed`` when the bus has one."""
        data = payload if isinstance(payload, bytes) else msgspec.json.encode(payload)
        headers = headers_for(
            event_id=msg_id, event_type=event_type, source=f"/svc/{self.source}", subject=ce_subject,
            workspace=workspace, attempt=attempt,
            traceparent=tracing.current_traceparent() if traceparent is None else traceparent, family=family,
            user=user,
        )
        if self.seed is not None and family == "run" and event_type in SIGNED_TYPES:
            sign_headers(self.seed, nats_subject=subject, headers=headers, body=data)
        try:
            ack = await self.js.publish(subject, data, headers=headers)
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.js.errors.NoStreamResponseError,
                nats.errors.NoRespondersError) as exc:
            raise TemporaryError(f"publish to {subject} failed: {exc!r}", delay=1.0) from exc
        return int(ack.seq)

    async def emit(
        self, *, workspace: str, run_id: str, attempt: int, event_type: str, payload: msgspec.Struct,
        dedup: str = "", user: str | None = None,
    ) -> int:
        """Publish a run lifecycle event with its deterministic id ``<run>.<attempt>.<type>[.<dedup>]``.

        ``ce-tauuser`` is ``user`` when given, else the verified submitter of the run event being handled
        (``identity.run_user``), else what ``user_lookup`` finds for the run."""
        if user is None:
            user = await self._run_user(run_id)
        with tracing.span(f"publish {event_type}", attributes={"taugrid.run_id": run_id}):
            return await self.publish(
                run_subject(workspace, run_id, event_type), payload, event_type=event_type, ce_subject=run_id,
                msg_id=message_id(run_id, attempt, event_type, suffix=dedup), workspace=workspace,
                attempt=attempt, user=user,
            )

    async def _run_user(self, run_id: str) -> str:
        handling = identity.run_user.get()
        if handling is not None and handling[0] == run_id:
            return handling[1]
        if self.user_lookup is not None:
            return await self.user_lookup(run_id)
        return ""

    async def close(self, *, drain: bool = True) -> None:
        """Drain (let subscriptions finish their messages) then close; ``drain=False`` closes at once, for a
        client whose every publish already awaited its ack and that may stop reading mid-stream."""
        if not self.nc.is_closed and not drain:
            with contextlib.suppress(nats.errors.Error):
                await self.nc.close()
            return
        if not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except (TimeoutError, nats.errors.Error):
                await self.nc.close()


def default_creds() -> str | None:
    """A NATS credentials file (``TAU_NATS_CREDS``), e.g. mounted from a Secret; None connects without."""
    return os.environ.get("TAU_NATS_CREDS") or None


async def connect(url: str | None = None, *, name: str, connect_timeout: float = 5.0,
                  max_reconnect_attempts: int = -1, creds: str | None = None, quiet: bool = False) -> Bus:
    """Connect with endless reconnects: a restarting server must not kill services. ``creds`` (default
    ``TAU_NATS_CREDS``) is a credentials file path.

    ``quiet`` (the CLI) logs connection errors at debug level: a person gets one clear error from the
    failed call instead of one warning per refused connection attempt.
    """

    async def on_error(exc: Exception) -> None:
        log.log(logging.DEBUG if quiet else logging.WARNING, "nats error (%s): %r", name, exc)

    async def on_disconnect() -> None:
        log.info("nats disconnected (%s)", name)

    async def on_reconnect() -> None:
        log.info("nats reconnected (%s)", name)

    try:
        nc = await nats.connect(
            url or default_url(), name=f"taugrid-{name}", connect_timeout=connect_timeout,
            max_reconnect_attempts=max_reconnect_attempts, reconnect_time_wait=0.5,
            error_cb=on_error, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
            allow_reconnect=True, user_credentials=creds or default_creds(),
        )
    except (OSError, nats.errors.Error) as exc:
        detail = "" if quiet else f": {exc}"
        raise TemporaryError(f"cannot reach the taugrid stack at {url or default_url()}{detail}", delay=1.0) from exc
    return Bus(nc, name)


def event_for_log(ev: Event) -> dict[str, Any]:
    return {"type": ev.type, "run": ev.subject, "attempt": ev.attempt, "seq": ev.seq}
