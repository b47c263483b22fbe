"""Connection to NATS with reconnect and error callbacks, credentials, and typed publish helpers.

Invariants: every publish to a stream waits for the JetStream ack (so "published" means "stored") and carries a
deterministic ``Nats-Msg-Id``. A connection authenticates with the nkey seed in ``creds`` (else the file named by
``TAU_NATS_CREDS``; none means an open server). A server that requires TLS is verified against the system's
CAs, or against ``ca`` (else ``TAU_NATS_CA``/``TAU_NATS_CA_PEM``), the private CA of a platform's bus. The
server answers a forbidden publish or subscribe with an asynchronous permissions error, not a reply: it is
matched to the waiting call here and raised as ``PermissionDenied`` at once instead of a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import secrets
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from taugrid import settings
from taugrid.bus import creds as credentials
from taugrid.bus import identity, natsheaders, rawmsgs, tracing
from taugrid.bus.envelope import (
    DELEGATION_HEADER,
    SIGNED_TYPES,
    SOURCE_HEADER,
    Event,
    compact,
    dedup_key,
    derived_traceparent,
    headers_for,
    run_traceparent,
    sign_headers,
    sign_service_headers,
    sourced,
    store_stamps,
)
from taugrid.bus.errors import CLOSED, DENIED, MISSING, NO_RESPONDERS, TIMEOUT, UNAVAILABLE
from taugrid.bus.topology import AUDIT_STREAM, HISTORY_STREAM, audit_subject, history_subject
from taugrid.core import wirejson
from taugrid.core.errors import PermanentError, PermissionDenied, TemporaryError
from taugrid.core.events import HIGH_LANE, lane_of, message_id, run_subject
from taugrid.core.limits import EVENT_MAX_BYTES, size_text

natsheaders.install()  # every message nats-py receives: the same headers, parsed faster (see the module)

log = logging.getLogger("taugrid.bus")

DEFAULT_URL = "nats://127.0.0.1:4222"
CA_ENV = "TAU_NATS_CA"  # a PEM file of the CA that signed the bus's TLS certificate (e.g. cert-manager's ca.crt)
CA_PEM_ENV = "TAU_NATS_CA_PEM"  # the same CA as PEM text, for containers that get no file (run pods)
T = TypeVar("T")
PUBLISH_TIMEOUT_S = 10.0  # how long a publish into a stream waits for the server's ack (nats-py's JetStream default)
_VIOLATION = re.compile(r'Permissions Violation for (Publish|Subscription) to "?([^"\s]+)"?', re.IGNORECASE)


class _PubAck(msgspec.Struct):
    """The server's answer to a publish into a stream: its sequence, or the error (``code``, ``err_code``);
    ``duplicate``: the message id was stored already, at ``seq``, within the stream's duplicate window."""

    seq: int = 0
    error: dict[str, Any] | None = None
    stream: str = ""
    duplicate: bool = False


def _pub_ack(reply: Msg) -> _PubAck:
    ack = msgspec.json.decode(reply.data, type=_PubAck)
    if ack.error is not None:
        nats.js.errors.APIError.from_error(ack.error)  # raises
    return ack


def stored_seq(reply: Msg) -> int:
    """The stream sequence a JetStream publish ack names; the error it carries raised as nats-py raises it
    (``APIError.from_error``: e.g. ``err_code`` 10071 for a compare-and-set against a stale revision)."""
    return _pub_ack(reply).seq


def _laneless(subject: str) -> str:
    """``subject`` without its lane token: a stage that repeats an event in the other lane (the platform's lanes
    changed between a publish and a redelivery) repeats that event, the duplicate it always was, not a squat."""
    return subject.removesuffix(f".{HIGH_LANE}") if lane_of(subject) else subject


# The streams people publish into (their submissions and cancels): there anyone may store a message under any
# ``Nats-Msg-Id``, so a duplicate ack there is checked against the subject it was stored on (``Bus.publish``).
PEOPLE_WRITABLE_STREAMS = frozenset({"RUNS"})


class Replies:
    """The requests a service sends for every message it handles (acks, KV writes, publishes into a stream),
    answered on one wildcard subscription of its own inbox: a request is a counter, a future and a publish (nats-py's
    ``request`` adds a NUID, random bytes, a done callback and a ``wait_for`` timer to each), and one sweep every
    ``SWEEP_S`` while any wait fails those whose time is up with ``nats.errors.TimeoutError``. A request made
    ``guarded`` is failed with ``PermissionDenied`` when the server refuses something on the connection meanwhile
    (``Bus.denied``), as ``Bus.guarded`` does."""

    SWEEP_S = 0.25

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._sid: int | None = None  # the inbox subscription's, once its answers come as the wire gave them
        self._pending: dict[str, tuple[asyncio.Future[Msg], float, bool]] = {}
        self._count = 0
        self._sweep: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._later: list[asyncio.Future[None]] = []  # answers whose status line nats-py's parser reads
        self._gathered: dict[str, list[Msg]] = {}  # a request answered by several messages: those so far

    async def request(self, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None,
                      guarded: bool = False, gathered: list[Msg] | None = None) -> Msg:
        """The answer to one request. ``gathered``: the request is answered by several messages and a status that
        ends them (a batch direct get: its messages, then ``204 EOB``; or a status alone, a 404 when there is
        nothing); the messages are put there in the order they came, and the status is the answer. ``timeout``:
        for the whole."""
        if not self.prefix:
            async with self._lock:
                if not self.prefix:
                    prefix = self.nc.new_inbox() + "."
                    sub = await self.nc.subscribe(prefix + "*", cb=self._answer)
                    # answers handed over as the wire gave them (``rawmsgs.route``, where this nats-py is the one
                    # it was checked against): no Msg built, queue put and task woken by nats-py for each (an
                    # ack's confirmation, a publish's ack: several for every message a service handles); a Msg
                    # is made only for an answer a request still waits for
                    if rawmsgs.route(self.nc, sub._id, self._frames):
                        self._sid = sub._id
                    self.prefix = prefix
        self._count += 1
        token = str(self._count)
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[Msg] = loop.create_future()
        self._pending[token] = (waiting, time.monotonic() + timeout, guarded)
        if gathered is not None:
            self._gathered[token] = gathered
        if self._sweep is None:
            self._sweep = loop.call_later(self.SWEEP_S, self._expire)
        try:
            await self.nc.publish(subject, payload, reply=self.prefix + token, headers=headers)
            reply = await waiting
        finally:
            self._pending.pop(token, None)
            if gathered is not None:
                self._gathered.pop(token, None)
        if reply.headers and reply.headers.get("Status") == "503":
            raise nats.errors.NoRespondersError
        return reply

    async def _answer(self, msg: Msg) -> None:
        self._deliver(msg.subject[len(self.prefix):], msg)

    def _deliver(self, token: str, msg: Msg) -> None:
        """``msg`` to the request of ``token``: its answer, or one of several it gathers (``gathered``) until the
        status that ends them."""
        found = self._pending.get(token)
        if found is None or found[0].done():
            return
        gathered = self._gathered.get(token)
        if gathered is not None and not (msg.headers and msg.headers.get("Status")):
            gathered.append(msg)
            return
        found[0].set_result(msg)

    def _frames(self, frames: list[rawmsgs.Raw]) -> None:
        """Answers as the reading loop found them (``rawmsgs.route``): each to the request it answers, as nats-py
        would have read it (``Client._build_message``; the headers by its own parser: a plain block here, one
        with a status line, as a 503 or a direct get's 404 is, through ``Client._process_headers``)."""
        skip = len(self.prefix)
        for subject, reply, block, data in frames:
            token = subject[skip:].decode()
            found = self._pending.get(token)
            if found is None or found[0].done():
                continue
            headers: dict[str, str] | None = None
            if block is not None:
                if len(block) <= _HEADER_LINE_END or block[_HEADER_LINE_SIZE] == _BLANK:
                    self._later.append(asyncio.ensure_future(self._answer_raw(subject, reply, block, data)))
                    self._later[-1].add_done_callback(self._later.remove)
                    continue
                headers = natsheaders.parse_header_lines(block[_HEADER_LINE_END:]) or None
            self._deliver(token, Msg(self.nc, subject.decode(), reply.decode(), data, headers, _sid=self._sid))

    async def _answer_raw(self, subject: bytes, reply: bytes, block: bytes, data: bytes) -> None:
        headers = await self.nc._process_headers(block)
        await self._answer(Msg(self.nc, subject.decode(), reply.decode(), data, headers, _sid=self._sid))

    def _expire(self) -> None:
        now = time.monotonic()
        for waiting, deadline, _ in self._pending.values():
            if deadline <= now and not waiting.done():
                waiting.set_exception(nats.errors.TimeoutError())
        self._sweep = asyncio.get_running_loop().call_later(self.SWEEP_S, self._expire) if self._pending else None

    def refuse(self, error: Exception) -> None:
        """Fail every guarded request still waiting with ``error``."""
        for waiting, _, guarded in self._pending.values():
            if guarded and not waiting.done():
                waiting.set_exception(error)


# A header block's first line (``NATS/1.0``, then a blank and a status for a status line) and where the headers
# after it start: nats-py's ``NATS_HDR_LINE`` and CRLF.
_HEADER_LINE_SIZE = len(b"NATS/1.0")
_HEADER_LINE_END = _HEADER_LINE_SIZE + 2
_BLANK = 0x20

_UNREACHABLE: tuple[type[Exception], ...] = (OSError, *UNAVAILABLE)  # connecting: no route, or no server


class PayloadTooLarge(PermanentError):
    """An event over ``EVENT_MAX_BYTES``: refused before it reaches the server, with its size and the limit."""


def default_url() -> str:
    """``TAU_NATS_URL``, else the embedded stack's usual address (``DEFAULT_URL``)."""
    return settings.current().bus.url


class Bus:
    """One service's handle on NATS: JetStream, KV buckets, the evidence object store."""

    def __init__(self, nc: Client, source: str, *, identity: credentials.Identity | None = None) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self.source = source
        self.identity = identity  # None on a server without authentication
        # What this connection signs its events with (``authors``: a stage acts only on events its author
        # signed); loaded once, since a publish is on every hop. None without a seed (no authentication).
        self.signing_key = identity.keypair() if identity is not None and identity.seed else None
        self.authors: Any = None  # authors.Authors of this connection, made by the first consumer that checks
        self._kv: dict[str, KeyValue] = {}
        self._obs: dict[str, ObjectStore] = {}
        # A person's nkey seed: their submit/cancel requests are signed with it (the client sets it).
        self.seed: bytes | None = None
        # run id → its verified submitter, for events emitted outside a run event's handler (a service sets
        # it: ``runrecord.VerifiedUsers``); None leaves ``ce-tauuser`` off unless the caller names the user.
        self.user_lookup: Callable[[str, str], Awaitable[str]] | None = None  # (workspace, run id) → user
        self._denials: list[asyncio.Future[str]] = []
        self.replies = Replies(nc)

    def denied(self, kind: str, subject: str) -> None:
        """The server refused ``kind`` (publish or subscription) on ``subject``: fail every guarded call."""
        log.warning("permission denied (%s): %s to %s", self.source, kind, subject)
        for fut in self._denials:
            if not fut.done():
                fut.set_result(f"{kind.lower()} to {subject}")
        self.replies.refuse(PermissionDenied(self._refusal(f"{kind.lower()} to {subject}")))

    def _refusal(self, what: str) -> str:
        who = self.identity.name if self.identity else "this connection"
        return f"the bus refused {what} for {who}: not allowed by your credentials (see `tau whoami`)"

    async def guarded(self, call: Awaitable[T]) -> T:
        """Await ``call``, but raise ``PermissionDenied`` as soon as the server refuses something on this
        connection meanwhile (its refusal is asynchronous, so the call itself would only time out)."""
        refusal: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._denials.append(refusal)
        task = asyncio.ensure_future(call)
        # Whatever ends the wait (an answer, a refusal, the caller cancelled or its connection closed), the call's
        # own outcome counts as seen: no "Task exception was never retrieved" at exit.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            waited: set[asyncio.Future[Any]] = {task, refusal}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
            if not refusal.done():
                return task.result()
            task.cancel()
            raise PermissionDenied(self._refusal(refusal.result()))
        finally:
            self._denials.remove(refusal)
            if not refusal.done():
                refusal.cancel()
            if not task.done():  # the caller was cancelled: the call goes with it
                task.cancel()

    async def kv(self, bucket: str) -> KeyValue:
        if bucket not in self._kv:
            self._kv[bucket] = await self.js.key_value(bucket)
        return self._kv[bucket]

    async def objects(self, store: str = "") -> ObjectStore:
        """An object store: ``evidence`` (bundles, logs, kept outputs) unless ``store`` names another
        (``topology.SOURCES_STORE`` for source snapshots)."""
        from taugrid.bus.topology import OBJECT_STORE

        name = store or OBJECT_STORE
        if name not in self._obs:
            self._obs[name] = await self.js.object_store(name)
        return self._obs[name]

    async def publish(
        self, subject: str, payload: msgspec.Struct | bytes, *, event_type: str, ce_subject: str,
        msg_id: str, workspace: str = "", attempt: int = 1, family: str = "run",
        traceparent: str | None = None, user: str = "", delegation: str = "", time: str = "", dedup: bool = True,
    ) -> int:
        """Publish one CloudEvent into a stream and return its stream sequence. A person's request
        (``SIGNED_TYPES``) is signed with ``self.seed`` when the bus has one. ``time``: see ``headers_for``; a
        service's run event published "now" carries none (``envelope.store_stamps``: the store's time is its).
        ``dedup=False`` leaves out ``Nats-Msg-Id`` (``msg_id`` is still the ``ce-id``), for a publisher whose ids
        never repeat, so the stream has nothing to drop (see ``headers_for``)."""
        request = family == "run" and event_type in SIGNED_TYPES
        if isinstance(payload, bytes):
            data = payload
        elif family in ("run", "backend") and not request:  # every run's: fields at defaults left out (wirejson)
            data = wirejson.encode(payload)
        else:
            data = msgspec.json.encode(payload)
        if len(data) > EVENT_MAX_BYTES:
            raise PayloadTooLarge(
                f"{event_type} for {ce_subject} is {len(data)} bytes; events are limited to "
                f"{size_text(EVENT_MAX_BYTES)} (the server's max_payload is 8 MB)"
            )
        headers = headers_for(
            event_id=msg_id, event_type=event_type, source=f"/svc/{self.source}", subject=ce_subject,
            workspace=workspace, attempt=attempt,
            traceparent=tracing.current_traceparent() if traceparent is None else traceparent, family=family,
            user=user, time=time, dedup=dedup, store_stamped=not request and store_stamps(subject),
        )
        if request and dedup:  # the request keeps its ce-id: a short key deduplicates it as well (issue 27)
            headers["Nats-Msg-Id"] = dedup_key(msg_id)
        if request and derived_traceparent(subject, headers.get("traceparent", "")):
            del headers["traceparent"]  # the run's derived trace, which a reader gives it (envelope; issue 27)
        if delegation and event_type in SIGNED_TYPES:  # signed with our key, on behalf of the token's person
            headers[DELEGATION_HEADER] = delegation
        service_signed = False
        if self.seed is not None and request:
            sign_headers(self.seed, nats_subject=subject, headers=headers, body=data)
        elif self.signing_key is not None and family != "log":  # log chunks are read by people only, never acted on
            sign_service_headers(self.signing_key, nats_subject=subject, headers=headers, body=data)
            service_signed = True
        # a service's event is stored without the headers readers derive (envelope.compact; issue 27); a
        # person's request keeps all of them, as the published contract asks of every client
        ack = await self._store(subject, data, headers if request else
                                compact(subject, headers, service_signed=service_signed))
        if ack.duplicate and ack.stream in PEOPLE_WRITABLE_STREAMS and event_type not in SIGNED_TYPES:
            squatter = await self.subject_at(ack.stream, ack.seq) or await self._kept_subject(subject, ack.seq)
            if _laneless(squatter) != _laneless(subject):
                # Someone stored another message under this event's id first (a researcher may set any
                # Nats-Msg-Id on her own cancel subject, and so made a colleague's exec.succeeded vanish as a
                # "duplicate"): the event is not stored. It goes again under an id nobody else can compute
                # (ce-id, which the signature covers, stays the deterministic one).
                log.warning("message id %s of %s was taken by a message on %s (seq %d): publishing under the "
                            "service's own id", msg_id, subject, squatter, ack.seq)
                headers["Nats-Msg-Id"] = self._unforgeable_id(subject, msg_id)
                ack = await self._store(subject, data, compact(subject, headers, service_signed=service_signed))
        return ack.seq

    async def _kept_subject(self, subject: str, seq: int) -> str:
        """The subject RUNS stored its message ``seq`` under, read from the history of ``subject``'s run once RUNS
        let it go (interest retention, issue 27: RUNS keeps an event only until its readers acked it, and its
        duplicate window still holds the id): "" when that run's history holds no message ``seq``, which is then
        another run's, a squatter's. The original was stored before this duplicate, so its copy is in HISTORY
        within milliseconds; it is looked for a second at most."""
        parts = _laneless(subject).split(".")
        if len(parts) != 5 or parts[0] != "run":
            return ""
        ws, run = parts[1], parts[2]
        where = ((HISTORY_STREAM, history_subject(ws, run)), (AUDIT_STREAM, audit_subject(ws, run)))
        for pause in (0.0, 0.01, 0.05, 0.2, 0.7):
            await asyncio.sleep(pause)
            for stream, kept in where:
                at = 1
                while True:  # the run's copies, by direct gets on its one subject (``bus/history.py`` reads them so)
                    try:
                        msg = await self.replies.request(f"$JS.API.DIRECT.GET.{stream}",
                                                         msgspec.json.encode({"seq": at, "next_by_subj": kept}),
                                                         timeout=5.0, guarded=True)
                    except NO_RESPONDERS:
                        break  # an earlier release's AUDIT answers no direct gets
                    except (*TIMEOUT, *CLOSED) as exc:
                        raise TemporaryError(f"reading {kept} from {stream} failed: {exc!r}", delay=1.0) from exc
                    headers = msg.headers or {}
                    if headers.get("Status") or SOURCE_HEADER not in headers:
                        break  # 404: no more of the run's copies
                    stored, origin = sourced(headers[SOURCE_HEADER], "", 0)
                    if origin == seq:
                        return stored
                    at = int(headers.get("Nats-Sequence") or 0) + 1
                    if at <= 1:
                        break
        return ""

    def _unforgeable_id(self, subject: str, msg_id: str) -> str:
        """A message id for ``msg_id`` on ``subject`` that only holders of this service's key can compute, the
        same for every replica and every repeat (an ed25519 signature is deterministic), so a repeat is still
        deduplicated; a random one on a bus without credentials (where nothing stops anyone anyway)."""
        if self.signing_key is None:
            return f"{msg_id}.{secrets.token_hex(16)}"
        mark = self.signing_key.sign(f"tau-msg-id-v1\n{subject}\n{msg_id}".encode())
        return f"{msg_id}.{base64.urlsafe_b64encode(mark[:16]).rstrip(b'=').decode()}"

    async def _store(self, subject: str, data: bytes, headers: dict[str, str]) -> _PubAck:
        try:
            reply = await self.replies.request(subject, data, headers=headers, timeout=PUBLISH_TIMEOUT_S, guarded=True)
        except (*TIMEOUT, *CLOSED, *NO_RESPONDERS) as exc:
            raise TemporaryError(f"publish to {subject} failed: {exc!r}", delay=1.0) from exc
        return _pub_ack(reply)

    async def subject_at(self, stream: str, seq: int) -> str:
        """The subject of the message ``stream`` stores at ``seq`` ("" when it is gone)."""
        try:
            msg = await self.guarded(self.js.get_msg(stream, seq))
        except MISSING:
            return ""
        except (*TIMEOUT, *CLOSED, *NO_RESPONDERS) as exc:
            raise TemporaryError(f"reading {stream} message {seq} failed: {exc!r}", delay=1.0) from exc
        return msg.subject or ""

    async def emit(
        self, *, workspace: str, run_id: str, attempt: int, event_type: str, payload: msgspec.Struct,
        dedup: str = "", user: str | None = None, delegation: str = "", lane: str = "", time: str = "",
    ) -> int:
        """Publish a run lifecycle event with its deterministic id ``<run>.<attempt>.<type>[.<dedup>]``, in
        ``lane`` (``events.HIGH_LANE`` or "": see ``core/events.py``; the message id is the same in either).

        ``ce-tauuser`` is ``user`` when given, else the verified submitter of the run event being handled
        (``identity.run_user``), else what ``user_lookup`` finds for the run. ``time``: when it happened, for
        an event relayed from another (``headers_for``); "" is now."""
        if user is None:
            user = await self._run_user(workspace, run_id)
        subject = run_subject(workspace, run_id, event_type, lane=lane)
        # outside a trace (a client's submission or cancel, a service's timer), the run's derived one, which the
        # bus does not store (envelope.run_traceparent; issue 27), where a new random trace was started each time
        with tracing.span(f"publish {event_type}", attributes={"taugrid.run_id": run_id},
                          root=run_traceparent(subject.split(".")[2])):
            return await self.publish(
                subject, payload, event_type=event_type,
                ce_subject=run_id,
                msg_id=message_id(run_id, attempt, event_type, suffix=dedup), workspace=workspace,
                attempt=attempt, user=user, delegation=delegation, time=time,
            )

    async def _run_user(self, workspace: str, run_id: str) -> str:
        handling = identity.run_user.get()
        if handling is not None and handling[0] == run_id:
            return handling[1]
        if self.user_lookup is not None:
            return await self.user_lookup(workspace, run_id)
        return ""

    async def close(self, *, drain: bool = True) -> None:
        """Drain (let subscriptions finish their messages) then close; ``drain=False`` closes at once, for a
        client whose every publish already awaited its ack and that may stop reading mid-stream."""
        if not self.nc.is_closed and not drain:
            with contextlib.suppress(*UNAVAILABLE):
                await self.nc.close()
            return
        if not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except UNAVAILABLE:
                await self.nc.close()


def default_creds() -> str | None:
    """A NATS credentials file (``TAU_NATS_CREDS``), e.g. mounted from a Secret; None connects without."""
    found = settings.current().bus.creds
    return str(found) if found else None


def tls_context(ca: Path | str | None = None) -> ssl.SSLContext | None:
    """The TLS context for a bus whose certificate a private CA signed: ``ca`` (a PEM file), else the file named
    by ``TAU_NATS_CA``, else the PEM text in ``TAU_NATS_CA_PEM`` (what the renderer gives run pods' source
    fetch); None leaves verification to the system's CAs. Used whenever the server requires TLS."""
    given = settings.current().bus
    path = Path(ca).expanduser() if ca else given.ca
    pem = given.ca_pem if path is None else ""
    if path is None and not pem:
        return None
    try:
        return ssl.create_default_context(cafile=str(path)) if path else ssl.create_default_context(cadata=pem)
    except (OSError, ssl.SSLError, ValueError) as exc:
        where = str(path) if path else CA_PEM_ENV
        raise PermanentError(f"cannot use {where} as the bus's CA certificate ({exc}); fix {CA_ENV} or "
                             "`tau login --ca FILE` (a PEM file, e.g. the ca.crt of the bus's TLS Secret)") from exc


async def connect(url: str | None = None, *, name: str, connect_timeout: float = 5.0,
                  max_reconnect_attempts: int = -1, creds: Path | str | None = None, quiet: bool = False,
                  ca: Path | str | None = None) -> Bus:
    """Connect with endless reconnects (``max_reconnect_attempts=-1``): a restarting server must not kill
    services. Raises ``TemporaryError`` when the server cannot be reached, ``PermissionDenied`` when it refuses
    the credentials.

    ``url`` may name several servers of one cluster, comma separated. ``creds`` is a credentials file (an nkey
    seed, ``creds.write``); without it ``TAU_NATS_CREDS`` is used if
    set. ``ca`` (else ``TAU_NATS_CA``) is the CA that signed the server's TLS certificate; a certificate it does
    not vouch for is a ``PermanentError``. ``quiet`` (the CLI) logs connection errors at debug level: a person
    gets one clear error from the failed call instead of one warning per refused connection attempt.
    """
    creds_path = Path(creds).expanduser() if creds else settings.current().bus.creds
    identity_ = credentials.load(creds_path, name=name) if creds_path else None
    bus_ref: list[Bus] = []
    refused = asyncio.Event()
    untrusted: list[ssl.SSLCertVerificationError] = []

    async def on_error(exc: Exception) -> None:
        found = _VIOLATION.search(str(exc))
        if found and bus_ref:
            bus_ref[0].denied(found.group(1), found.group(2))
            return
        if not bus_ref and (isinstance(exc, DENIED)
                            or "authorization violation" in str(exc).lower()):
            refused.set()
        if not bus_ref and isinstance(exc, ssl.SSLCertVerificationError):
            untrusted.append(exc)  # nats-py would retry (and hang) on a certificate no retry will fix
            refused.set()
        log.log(logging.DEBUG if quiet else logging.WARNING, "nats error (%s): %r", name, exc)

    async def on_disconnect() -> None:
        log.info("nats disconnected (%s)", name)

    async def on_reconnect() -> None:
        log.info("nats reconnected (%s)", name)

    # Replies and deliveries come only to this identity's own inbox (the server lets it subscribe nowhere else).
    auth: dict[str, Any] = (
        {"nkeys_seed_str": identity_.seed, "inbox_prefix": f"_INBOX.{identity_.public_key}"} if identity_ else {}
    )
    where = url or default_url()
    tls = tls_context(ca)
    if tls is not None:
        auth["tls"] = tls
    nc = Client()
    # A few tries to connect at all (callers retry unreachable servers themselves); once connected, reconnect
    # as configured (forever for services). nats-py retries a refused login forever, so a refusal ends it here.
    # nats-py annotates its seconds as int, but takes (and we need) fractions
    # A JetStream cluster's servers, comma separated (``tau up --ha``, the chart's replicas): nats-py keeps them all
    # in its pool and reconnects to another when its server dies.
    servers = [u.strip() for u in where.split(",") if u.strip()]
    websocket = [u for u in servers if u.lower().startswith(("ws://", "wss://"))]
    if websocket:  # nats-py's WebSocket transport is not loaded (``taugrid.bus._NatsWithoutWebSocket``)
        raise PermanentError(f"NATS URL {websocket[0]}: taugrid connects over nats:// or tls:// (the server's client "
                             "port, 4222 by default), not WebSocket")
    connecting = asyncio.ensure_future(nc.connect(
        servers, name=f"taugrid-{name}", connect_timeout=connect_timeout,  # type: ignore[arg-type]
        max_reconnect_attempts=2 if max_reconnect_attempts < 0 else max(1, max_reconnect_attempts),
        reconnect_time_wait=0.5, error_cb=on_error, disconnected_cb=on_disconnect,  # type: ignore[arg-type]
        reconnected_cb=on_reconnect, allow_reconnect=True, **auth,
    ))
    refusal = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait({connecting, refusal}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        refusal.cancel()
    if untrusted:
        connecting.cancel()
        await nc.close()
        raise PermanentError(
            f"cannot verify the TLS certificate of NATS at {where} ({untrusted[0].verify_message}): pass the CA "
            f"that signed it with `tau login --ca FILE` or {CA_ENV} (the ca.crt of the bus's TLS Secret)")
    if refused.is_set():
        connecting.cancel()
        await nc.close()
        who = f"the credentials in {creds_path}" if creds_path else "a connection without credentials"
        raise PermissionDenied(
            f"NATS at {where} refused {who} (authorization violation): "
            + ("ask your platform admin for valid credentials" if creds_path else
               f"set {credentials.CREDS_ENV} or run `tau login --server URL --creds FILE`")
        )
    try:
        connecting.result()
    except _UNREACHABLE as exc:
        detail = "" if quiet else f": {exc}"
        raise TemporaryError(f"cannot reach the taugrid stack at {where}{detail}", delay=1.0) from exc
    # nats-py reads 0 as "forever"; ours is "-1 forever, else at least one more try".
    nc.options["max_reconnect_attempts"] = -1 if max_reconnect_attempts < 0 else max(1, max_reconnect_attempts)
    bus = Bus(nc, name, identity=identity_)
    bus_ref.append(bus)
    return bus


def event_for_log(ev: Event) -> dict[str, Any]:
    return {"type": ev.type, "run": ev.subject, "attempt": ev.attempt, "seq": ev.seq}
