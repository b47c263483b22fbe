"""CloudEvents 1.0 in NATS binary mode, and the signature that says who authored a request.

The payload is the message body (JSON from a msgspec Struct); the attributes travel as ``ce-*`` headers beside
the W3C ``traceparent`` (no ``content-type``: every body is ``application/json``). ``Nats-Msg-Id`` equals
``ce-id`` and is deterministic, so a republish by a redelivered handler is dropped by the stream's dedup window.

Identity. ``ce-tauuser`` (a CloudEvents extension) names the run's *verified* submitter on every event a
service publishes after the submitter checked the submission; a client's own value is never trusted.
A request a person makes (``submit.requested``, ``cancel.requested``) is signed with their NATS user nkey
(ed25519): ``tau-signer`` carries the public key (``U…``, 56 characters) and ``tau-signature`` the
64-byte signature, base64url without padding (RFC 4648 §5), over the UTF-8 bytes of ``canonical_form``:
seven lines joined by ``\n`` with no trailing newline::

    tau-sig-v1
    <NATS subject, e.g. run.default.hello-3f2a.submit.requested>
    <ce-id>
    <ce-type>
    <ce-subject>
    <ce-time>
    <sha256 of the message body, 64 lowercase hex digits>

Any client that can compute ed25519 over these bytes with an nkey can submit (``docs/architecture.md`` §4).

Compact headers (issue 27). A service's event is stored without the headers a reader derives (``compact``, done
by ``Bus.publish`` after signing): ``ce-specversion`` (always ``1.0``), ``ce-id`` where it equals
``Nats-Msg-Id``, ``ce-attempt`` when 1, on a run event ``ce-type``, ``ce-subject`` and ``ce-workspace`` (its
subject says them), on a log chunk ``ce-subject`` and ``ce-workspace``, on a watch change (``k8s.<cluster>.<kind>.
<ns>.<name>.<change>``) ``ce-type``, and ``tau-signer`` (the key of the
service ``ce-source`` names, which the checker looks up: ``authors``). Each is left out only when the value
``from_message``/``expanded`` derive is exactly the one signed, so the signature covers the same bytes as
before and a header that is present still has to agree with the subject. People's requests keep every header.

Short message ids and store-stamped times (issue 27). A run event's ``Nats-Msg-Id`` is not its ``ce-id``
(``<run>.<attempt>.<stage>.<outcome>[.<suffix>]``, ~40-60 bytes) but ``dedup_key`` of it, 16 characters (96 bits
of its sha256), with ``:<suffix>`` after them when it has one: the stream deduplicates as before (the key is as
deterministic as the id), and a reader derives the ``ce-id`` from the subject, ``ce-attempt`` and the suffix
(``from_message``; the signature covers the derived id, so a changed suffix fails it). A message stored before
keeps its long ``Nats-Msg-Id`` and reads as it did. A service's run event whose author stamps "now" carries no
``ce-time``: its time is when RUNS stored it, which the server stamps and no publisher sets (``from_message``
writes it as a ``ce-time`` would be, from ``stored``), and its signature covers the time as absent, so a
``ce-time`` added later fails the check, as does one taken off an event signed with it. A relayed time (a run
event made from a watch event keeps the watch event's time) and a person's request (its signed ``ce-time`` is
checked for freshness) keep theirs.

Derived traceparents (issue 27). A run's events carry the trace of its submission from hop to hop, the same
``traceparent`` on every one (~70 bytes on each of a run's ~12 stored events). A client that submits outside any
trace (no ambient OpenTelemetry context: ``tracing.span``'s ``root``) starts the run's trace at ``run_traceparent``
of its run id: ``00-<hex of sha256(run id)[:16]>-<hex of sha256(run id)[16:24]>-01``. A run event or log chunk whose
``traceparent`` is exactly that of the run its subject names is stored without it (``compact``; a person's request
too, ``Bus.publish``), and ``from_message`` gives an event of a run (or log chunk) that has none that value. Any
other traceparent (a submission made inside a trace of the submitter's own, a span an exporting service started)
is stored as it is and read as it is, and so is one stored before. No signature covers a traceparent (neither
``canonical_form`` nor ``service_form``), so leaving it out changes no signed byte; a reader's derived value is a
function of the subject the server vouches for, and an event that carries one is read with that one, as before.
Since then a run event stored with no traceparent (a timer's event, a request from a client that sends none) reads
as in the run's derived trace, where it read as in none.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import datetime as dt
import functools
import hashlib
from typing import Any, TypeVar

import msgspec
import nacl.exceptions
import nacl.signing
import nkeys

from taugrid.core import nesting
from taugrid.core.events import CE_PREFIX, HIGH_LANE, RUN_EVENTS, ce_type, lane_of, short_type
from taugrid.core.ids import token

T = TypeVar("T")

SPEC_VERSION = "1.0"

USER_HEADER = "ce-tauuser"
SIGNER_HEADER = "tau-signer"
SIGNATURE_HEADER = "tau-signature"
SIGNATURE_SCHEME = "tau-sig-v1"
DELEGATION_HEADER = "tau-delegation"  # see access/delegation.py
# Requests people publish; every other run event comes from a service and is never signed.
SIGNED_TYPES = frozenset({"submit.requested", "cancel.requested"})


class Event(msgspec.Struct):
    """A decoded event: CloudEvents attributes plus the raw payload and where it sat in the stream. Built by
    keyword everywhere but ``from_message``, which passes its fields in order (``_FIELDS``): with nineteen
    keywords msgspec's matching of names cost more than the rest of reading a replayed event's envelope."""

    id: str
    type: str  # short form, e.g. "policy.approved"
    source: str
    subject: str  # the run id (or node name for node events)
    time: str
    data: bytes
    nats_subject: str = ""
    workspace: str = ""
    attempt: int = 1
    traceparent: str = ""
    seq: int = 0
    ce_type: str = ""  # the full CloudEvents type as received (part of the signed form)
    user: str = ""  # ce-tauuser: the run's verified submitter (trust it only from a service, see consumer)
    signer: str = ""  # tau-signer: the author's public nkey on a signed request
    signature: str = ""  # tau-signature
    delegation: str = ""  # tau-delegation: a person's token letting the signer act for them (access/delegation.py)
    stored: float = 0.0  # when the stream stored it (epoch seconds; 0 when not read from a stream)
    # Why the headers contradict the subject ("" when they agree): such a message is refused before any handler
    # sees it (``consumer``) and left out of every reading (``replay``); its fields hold the subject's values.
    problem: str = ""
    headers: dict[str, str] = msgspec.field(default_factory=dict)  # as received (a service signature covers them)

    @property
    def happened(self) -> float:
        """When it happened, by its own ``ce-time`` (epoch seconds), else when it was stored. Accounting reads
        this, as the evidence's does: a watch-derived event carries the time the cluster saw the change, where
        its stored time also holds the admission watcher's backlog, which put exec.running late and counted a
        2 s run as 1.65 s."""
        try:
            return dt.datetime.fromisoformat(self.time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return self.stored

    @property
    def lane(self) -> str:
        """The priority lane its subject travels in (``events.HIGH_LANE`` or "")."""
        return lane_of(self.nats_subject)

    # Every payload read goes through core.nesting: a body nested past EVENT_MAX_DEPTH is a DecodeError (dead-
    # lettered with its reason, shown as undecodable), never a RecursionError in whoever reads it.
    def payload(self, kind: builtins.type[T]) -> T:  # builtins: the field ``type`` shadows it in this body
        return nesting.decode(self.data, kind)

    def as_dict(self) -> dict[str, Any]:
        """The data as plain JSON values (for logs, `tau events`, the state projection). A run event's is read
        through its contract Struct, so a field its publisher left out at its default (``core/wirejson``) is
        there with that default, as it always was; a payload that is not its Struct's is read as it is."""
        if not self.data:
            return {}
        kind = RUN_EVENTS.get(self.type) if self.nats_subject.startswith("run.") else None
        if kind is not None:
            try:
                typed: dict[str, Any] = msgspec.to_builtins(nesting.decode(self.data, kind))
                return typed
            except msgspec.ValidationError:
                pass
        value = nesting.decode_any(self.data)
        return value if isinstance(value, dict) else {"value": value}

    def run_payload(self) -> msgspec.Struct:
        return nesting.decode(self.data, RUN_EVENTS[self.type])

    def to_json(self) -> dict[str, Any]:
        return {**self.to_json_head(), "data": self.as_dict()}

    def to_json_head(self) -> dict[str, Any]:
        """``to_json`` without the decoded data (a writer that embeds the raw JSON adds it)."""
        return {
            "id": self.id,
            "type": ce_type(self.type),
            "short_type": self.type,
            "source": self.source,
            "subject": self.subject,
            "time": self.time,
            "workspace": self.workspace,
            "attempt": self.attempt,
            "traceparent": self.traceparent,
            "seq": self.seq,
            "user": self.user,
            "signer": self.signer,
        }


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def headers_for(
    *, event_id: str, event_type: str, source: str, subject: str, workspace: str, attempt: int,
    traceparent: str, family: str = "run", user: str = "", time: str = "", dedup: bool = True,
    store_stamped: bool = False,
) -> dict[str, str]:
    """``time``: when the fact happened, where the publisher only relays it (a run event made from a watch
    event keeps the watch event's time); "" is now, and with ``store_stamped`` (a service's run event:
    ``store_stamps``) no ``ce-time`` at all: the reader takes the time the stream stored it. ``dedup=False``: no
    ``Nats-Msg-Id``, for a publisher whose ids do not repeat (the local cluster's watch changes: each is its
    object's next resourceVersion; only a restart between a publish and saving the workload repeats one, and
    that repeat reaches the admission watcher alone, whose run events are deterministic and dropped by RUNS'
    window), so the stream holds no id for it (issue 27: ~48 bytes on each stored message, and ids the server
    keeps and re-reads at a restart)."""
    headers = {
        "ce-specversion": SPEC_VERSION,
        "ce-id": event_id,
        "ce-type": ce_type(event_type, family=family),
        "ce-source": source,
        "ce-subject": subject,
        "ce-workspace": workspace,
        "ce-attempt": str(attempt),
        # no content-type: every body is JSON (the contract's defaultContentType), and 32 bytes on each of a
        # run's ~40 stored messages were ~1.3 KB a run (issue 27)
    }
    if time or not store_stamped:
        headers["ce-time"] = time or now_iso()
    if dedup:
        headers["Nats-Msg-Id"] = event_id
    if traceparent:
        headers["traceparent"] = traceparent
    if user:
        headers[USER_HEADER] = user
    return headers


def from_message(subject: str, headers: dict[str, str] | None, data: bytes, seq: int = 0,
                 stored: float = 0.0) -> Event:
    """Decode a message. What the server vouches for is its subject, so a run event's workspace, run and type
    are the subject's (``run.<ws>.<run>.<stage>.<outcome>[.<lane>]``), and a log chunk's workspace and run too
    (``log.<ws>.<run>.<attempt>``); a ``ce-type``, ``ce-workspace`` or ``ce-subject`` header that says otherwise
    sets ``problem`` (the message is refused, never read with the header's value). A message with no
    CloudEvents headers still yields an Event.

    Every message a service or a replay reads comes through here (a long replay: tens of thousands a second),
    so the lane is looked up only when the last token could name one, and the header values it compares are
    reduced through small caches (a stream holds a few types and workspaces over and over)."""
    h = headers or {}
    get = h.get
    origin = get(SOURCE_HEADER)
    if origin is not None:  # a copy HISTORY or AUDIT keeps: read as RUNS stored it
        subject, seq = sourced(origin, subject, seq)
    ce = get("ce-type", "")
    traceparent = get("traceparent")
    parts = subject.split(".")
    if parts[-1] == HIGH_LANE and lane_of(subject):
        parts = parts[:-1]  # the lane token
    workspace, about = get("ce-workspace", ""), get("ce-subject", "")
    problem = ""
    run_event = parts[0] == "run" and len(parts) == 5
    if run_event:
        kind = f"{parts[3]}.{parts[4]}"
        if ce or workspace or about:  # a compact event has none of them: nothing to compare
            problem = _disagreement(ce and _short_type(ce), kind, "ce-type") or \
                _disagreement(workspace and _token(workspace), parts[1], "ce-workspace") or \
                _disagreement(about and _token(about), parts[2], "ce-subject")
        workspace, about = parts[1], parts[2]
        if traceparent is None:  # left out by ``compact``: the run's derived trace
            traceparent = run_traceparent(about)
    else:
        if ce:
            kind = _short_type(ce)
        elif parts[0] == "k8s" and len(parts) == 6:  # a watch change left its ce-type out (``compact``)
            kind, ce = f"{parts[2]}.{parts[5]}", f"{_K8S_TYPE_PREFIX}{parts[2]}.{parts[5]}.v1"
        else:
            kind = ".".join(parts[3:5] if parts[0] == "run" else parts[-2:])
        if parts[0] == "log" and len(parts) == 4:
            problem = _disagreement(workspace and _token(workspace), parts[1], "ce-workspace") or \
                _disagreement(about and _token(about), parts[2], "ce-subject")
            workspace, about = parts[1], parts[2]
            if traceparent is None:
                traceparent = run_traceparent(about)
    if problem:
        problem = f"{problem} on {subject}: the subject decides, so this message is refused"
    elif not ce and run_event:
        ce = _run_ce_type(kind)  # left out by ``compact``: the subject says it
    attempt_text = get("ce-attempt", "1")
    try:
        attempt = 1 if attempt_text == "1" else int(attempt_text)
    except ValueError:
        attempt = 1
    event_id = get("ce-id")
    if event_id is None:
        event_id = get("Nats-Msg-Id", "")
        if run_event and _is_short_id(event_id):  # ``compact``'s key: the id is the subject's, the suffix its own
            base = f"{parts[2]}.{attempt_text}.{kind}"
            event_id = base if len(event_id) == DEDUP_KEY_CHARS else f"{base}.{event_id[DEDUP_KEY_CHARS + 1:]}"
    time = get("ce-time")
    if time is None:  # a service's run event stamped "now" is stamped by the store (``store_stamps``)
        time = store_time(stored) if stored and run_event and kind not in SIGNED_TYPES else ""
    return Event(  # in ``_FIELDS`` order
        event_id,  # id
        kind,  # type
        get("ce-source", ""),  # source
        about,  # subject
        time,  # time
        data,
        subject,  # nats_subject
        workspace,
        attempt,
        traceparent or "",
        seq,
        ce,  # ce_type
        get(USER_HEADER, ""),  # user
        get(SIGNER_HEADER, ""),  # signer
        get(SIGNATURE_HEADER, ""),  # signature
        get(DELEGATION_HEADER, ""),  # delegation
        stored,
        problem,
        h,  # headers
    )


# Written by nats-server on a message a stream sourced (a publish carrying it is refused, error 10227, and sourcing
# replaces one a message carried): ``<stream>[:C=<consumer>] <seq> <filter> <dest> <subject> <id>``.
SOURCE_HEADER = "Nats-Stream-Source"


def sourced(origin: str, subject: str, seq: int) -> tuple[str, int]:
    """(subject, sequence) a message a stream sourced from RUNS had there, from its source header ``origin``
    (HISTORY and AUDIT keep a run's events under one subject a run: ``topology.FEEDS``); a copy of another
    stream's message keeps the ``subject`` and ``seq`` it is stored under."""
    parts = origin.split(" ", 5)
    if len(parts) >= 5 and parts[0].partition(":")[0] == "RUNS" and parts[1].isdigit():
        return parts[4], int(parts[1])
    return subject, seq


# ``from_message`` passes Event's fields by position, in this order; an Event whose fields moved would be read
# wrong without a word, so the module refuses to load instead.
_FIELDS = ("id", "type", "source", "subject", "time", "data", "nats_subject", "workspace", "attempt", "traceparent",
           "seq", "ce_type", "user", "signer", "signature", "delegation", "stored", "problem", "headers")
if Event.__struct_fields__ != _FIELDS:
    raise ImportError(f"envelope.from_message passes Event's fields in the order {_FIELDS}, not the Struct's")


_RUN_TYPE_PREFIX = f"{CE_PREFIX}run."
_K8S_TYPE_PREFIX = f"{CE_PREFIX}k8s."  # k8s.<cluster>.<kind>.<ns>.<name>.<change>: io.taugrid.k8s.<kind>.<change>.v1
# The run-event headers ``compact`` may leave out because the subject says them, and how a reader derives each
# from the subject's tokens (laneless): the workspace, the run and the type.
_FROM_RUN_SUBJECT = (("ce-workspace", 1), ("ce-subject", 2))


def _laneless_parts(subject: str) -> list[str]:
    parts = subject.split(".")
    if parts[-1] == HIGH_LANE and lane_of(subject):
        parts = parts[:-1]
    return parts


@functools.lru_cache(maxsize=4096)  # a replay reads a run's events together; a hash per event was ~0.4 us
def run_traceparent(run_id: str) -> str:
    """The ``traceparent`` of run ``run_id`` submitted outside any trace (module docstring, "Derived
    traceparents"): trace id and span id the first 16 and next 8 bytes of sha256 of the run id, sampled (01).
    An all-zero id (invalid in W3C trace context) would need a sha256 starting with 64 zero bits."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-01"


def derived_traceparent(nats_subject: str, traceparent: str) -> bool:
    """Whether ``traceparent`` on a message published on ``nats_subject`` is the one a reader derives for it
    (``run_traceparent`` of the run a run event's or log chunk's subject names), so it need not be stored."""
    parts = _laneless_parts(nats_subject)
    return ((parts[0] == "run" and len(parts) == 5) or (parts[0] == "log" and len(parts) == 4)) \
        and traceparent == run_traceparent(parts[2])


DEDUP_KEY_CHARS = 16  # 12 bytes of sha256, base64url: 96 bits
_SUFFIX_MARK = ":"  # never in a run id or a subject token, so a long id (``<run>.<attempt>…``) never reads as a key


def dedup_key(event_id: str) -> str:
    """The short ``Nats-Msg-Id`` of an event whose ``ce-id`` is ``event_id``: 96 bits of its sha256, as
    deterministic as the id (a repeat is dropped by the stream's window) and as unlikely to meet another's within
    it as a random 96-bit value; one that does on another subject is caught as a squatted id (``Bus.publish``)."""
    return base64.urlsafe_b64encode(hashlib.sha256(event_id.encode()).digest()[:12]).decode()


def _short_id(parts: list[str], attempt_text: str, event_id: str) -> str:
    """A run event's short ``Nats-Msg-Id`` (``dedup_key``, then ``:<suffix>`` when the id has one) when its
    ``event_id`` is the one its laneless subject ``parts`` and attempt derive, else "" (the id is kept)."""
    base = f"{parts[2]}.{attempt_text}.{parts[3]}.{parts[4]}"
    if event_id == base:
        return dedup_key(event_id)
    if event_id.startswith(base + "."):
        return f"{dedup_key(event_id)}{_SUFFIX_MARK}{event_id[len(base) + 1:]}"
    return ""


def _is_short_id(msg_id: str) -> bool:
    """Whether a run event's ``Nats-Msg-Id`` is a short one (``_short_id``) rather than a long id stored before."""
    return len(msg_id) >= DEDUP_KEY_CHARS and msg_id[DEDUP_KEY_CHARS:DEDUP_KEY_CHARS + 1] in ("", _SUFFIX_MARK) \
        and "." not in msg_id[:DEDUP_KEY_CHARS]


def store_stamps(nats_subject: str) -> bool:
    """Whether an event published on ``nats_subject`` at "now" leaves its time to the store (no ``ce-time``): a
    service's run event; a person's request keeps the ``ce-time`` it signs (its freshness is checked)."""
    parts = _laneless_parts(nats_subject)
    return parts[0] == "run" and len(parts) == 5 and f"{parts[3]}.{parts[4]}" not in SIGNED_TYPES


_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()
_MILLIS = tuple(f"{ms:03d}Z" for ms in range(1000))  # a store time's tail, not formatted for each event read


@functools.lru_cache(maxsize=1024)
def _second_text(second: int) -> str:
    """``<date>T<hh:mm:ss>.`` of epoch second ``second`` (a replay reads many events of one second)."""
    day, in_day = divmod(second, 86_400)
    hour, rest = divmod(in_day, 3_600)
    minute, sec = divmod(rest, 60)
    return f"{dt.date.fromordinal(_EPOCH_DAY + day).isoformat()}T{hour:02d}:{minute:02d}:{sec:02d}."


def store_time(stored: float) -> str:
    """``stored`` (epoch seconds) as a ``ce-time`` is written (``now_iso``: RFC 3339, UTC, milliseconds). Rounded
    to the microsecond first exactly as ``datetime.fromtimestamp`` rounds (the fraction, half to even), which is
    how nats-py reads a delivery's timestamp: a delivery's time (those microseconds) and a replay's or a direct
    get's (the nanoseconds / 1e9) then give one message the same text, at a millisecond's edge too (rounding
    ``stored * 1e6`` instead gave another millisecond for about one message in two thousand)."""
    second = int(stored)
    micro = round((stored - second) * 1_000_000)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    return _second_text(second) + _MILLIS[micro // 1000]


def compact(nats_subject: str, headers: dict[str, str], *, service_signed: bool) -> dict[str, str]:
    """The headers a service's event is stored with: ``headers`` (as signed) less those a reader derives with
    exactly the same value (the module docstring lists them; ``expanded`` puts them back). A value that differs
    from the derived one (a run id that is not its own subject token, a ``ce-id`` the squatting rule moved off
    ``Nats-Msg-Id``, an attempt past 1, a traceparent other than the run's derived one) is kept.
    ``service_signed``: ``tau-signer`` goes too (the checker takes the key of the service ``ce-source`` names)."""
    out = dict(headers)
    if out.get("ce-specversion") == SPEC_VERSION:
        del out["ce-specversion"]
    parts = _laneless_parts(nats_subject)
    if parts[0] == "run" and len(parts) == 5 and "ce-id" in out and out.get("Nats-Msg-Id") == out["ce-id"]:
        short = _short_id(parts, out.get("ce-attempt", "1"), out["ce-id"])
        if short:
            out["Nats-Msg-Id"] = short
            del out["ce-id"]
    if "ce-id" in out and out.get("Nats-Msg-Id") == out["ce-id"]:
        del out["ce-id"]
    if out.get("ce-attempt") == "1":
        del out["ce-attempt"]
    if (parts[0] == "run" and len(parts) == 5) or (parts[0] == "log" and len(parts) == 4):
        for name, index in _FROM_RUN_SUBJECT:
            if out.get(name) == parts[index]:
                del out[name]
        if out.get("traceparent") == run_traceparent(parts[2]):
            del out["traceparent"]
        if parts[0] == "run" and out.get("ce-type") == f"{_RUN_TYPE_PREFIX}{parts[3]}.{parts[4]}.v1":
            del out["ce-type"]
    elif parts[0] == "k8s" and len(parts) == 6 and out.get("ce-type") == f"{_K8S_TYPE_PREFIX}{parts[2]}.{parts[5]}.v1":
        del out["ce-type"]
    if service_signed:
        out.pop(SIGNER_HEADER, None)
    return out


def expanded(event: Event) -> dict[str, str]:
    """The event's headers with those ``compact`` left out put back (as ``from_message`` derived them): what
    its author signed. A header that was stored is taken as it is (``from_message`` refused any that disagrees
    with the subject)."""
    h = event.headers
    parts = _laneless_parts(event.nats_subject)
    derived = {"ce-specversion": SPEC_VERSION, "ce-id": event.id, "ce-attempt": "1"}
    if event.ce_type:
        derived["ce-type"] = event.ce_type
    if event.traceparent:  # no signature covers it; put back so the headers read as they were published
        derived["traceparent"] = event.traceparent
    if (parts[0] == "run" and len(parts) == 5) or (parts[0] == "log" and len(parts) == 4):
        derived.update((name, parts[index]) for name, index in _FROM_RUN_SUBJECT)
    return {**derived, **h} if any(name not in h for name in derived) else h


def ordering_key(nats_subject: str, headers: dict[str, str] | None) -> str:
    """What a consumer keeps in order: the run (``ce-subject``, which a run event or log chunk may leave out
    for its subject to say), else the subject itself."""
    about = (headers or {}).get("ce-subject")
    if about:
        return about
    parts = _laneless_parts(nats_subject)
    if (parts[0] == "run" and len(parts) == 5) or (parts[0] == "log" and len(parts) == 4):
        return parts[2]
    return nats_subject


def with_id(nats_subject: str, headers: dict[str, str] | None) -> dict[str, str]:
    """A copy of the headers of a message stored on ``nats_subject`` with its ``ce-id`` written out, for a copy
    that is stored under another ``Nats-Msg-Id`` (the DLQ's, a replay's): a compact event's id is read from its
    ``Nats-Msg-Id`` (as it is, or derived from a short one with the subject), and the id (which its signature
    covers) must not become the copy's. Its time is not written out: a store-stamped event (``store_stamps``) is
    signed without one, and a copy stored again takes the time it is stored at."""
    out = dict(headers or {})
    if "ce-id" not in out and out.get("Nats-Msg-Id"):
        out["ce-id"] = from_message(nats_subject, out, b"").id
    return out


def run_of(msg: Any) -> str:
    """The run a received message (anything with ``subject`` and ``headers``) is about: its ``ce-subject``, else
    the run its subject names; for a plain subscriber, which need not decode the whole event."""
    return from_message(msg.subject or "", msg.headers, b"").subject


# Pure functions of a header value, bounded so a publisher's endless distinct values cannot grow them.
_short_type = functools.lru_cache(maxsize=4096)(short_type)
_token = functools.lru_cache(maxsize=4096)(token)


@functools.lru_cache(maxsize=4096)
def _run_ce_type(kind: str) -> str:
    return f"{_RUN_TYPE_PREFIX}{kind}.v1"


def _disagreement(claimed: str, actual: str, header: str) -> str:
    """Why ``header`` (``claimed``, "" when absent) contradicts the subject's ``actual`` value; "" when not."""
    return f"{header} says {claimed!r} where the subject says {actual!r}" if claimed and claimed != actual else ""


# ---------------------------------------------------------------- signatures


class SignatureInvalid(ValueError):
    """A request whose signature is missing, malformed or does not match; the message says which."""


SIGNATURE_MAX_AGE_S = 300.0  # a signed request must be stored within this long of its ce-time (either way)


def staleness(event: Event) -> float | None:
    """Seconds between a signed request's ``ce-time`` and when the stream stored it, when that is more than
    ``SIGNATURE_MAX_AGE_S`` (a replay of an old request, or a badly wrong clock); None when fresh or when the
    event was not read from a stream. The signature covers ``ce-time``, so a replay cannot refresh it, and the
    stored time is the server's. ``Nats-Msg-Id`` is not signed, so deduplication alone does not stop replays."""
    if not event.stored:
        return None
    try:
        signed = dt.datetime.fromisoformat(event.time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")
    gap = abs(event.stored - signed)
    return gap if gap > SIGNATURE_MAX_AGE_S else None


def canonical_form(*, nats_subject: str, event_id: str, event_type: str, subject: str, time: str,
                   body: bytes | None = None, body_sha256: str = "") -> bytes:
    """The exact bytes a request's author signs (see the module docstring); the body, or its sha256 hex."""
    digest = hashlib.sha256(body).hexdigest() if body is not None else body_sha256
    return "\n".join([SIGNATURE_SCHEME, nats_subject, event_id, event_type, subject, time, digest]).encode()


def sign_headers(seed: bytes, *, nats_subject: str, headers: dict[str, str], body: bytes) -> None:
    """Add ``tau-signer`` and ``tau-signature`` to ``headers`` (which already hold the ``ce-*`` attributes)."""
    key = nkeys.from_seed(seed)
    form = canonical_form(nats_subject=nats_subject, event_id=headers["ce-id"], event_type=headers["ce-type"],
                          subject=headers["ce-subject"], time=headers["ce-time"], body=body)
    headers[SIGNER_HEADER] = key.public_key.decode()
    headers[SIGNATURE_HEADER] = base64.urlsafe_b64encode(key.sign(form)).rstrip(b"=").decode()


def public_key_bytes(public_key: str) -> bytes:
    """The raw ed25519 key inside a user nkey (``U…``); raises ``SignatureInvalid`` if it is not one."""
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError) as exc:
        raise SignatureInvalid(f"signer {public_key!r} is not a NATS user public key") from exc
    if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER:
        raise SignatureInvalid(f"signer {public_key!r} is not a NATS user public key (U…)")
    if bytes(nkeys.crc16_checksum(raw[:33])) != raw[33:]:
        raise SignatureInvalid(f"signer {public_key!r} has a bad checksum")
    return raw[1:33]


@functools.lru_cache(maxsize=1024)
def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    """The verifying key of a user nkey, kept: every event a stage handles is checked against one of a few
    services' keys, and decoding the nkey (base32, checksum) for each cost about a tenth of the check (issue 30).
    An invalid key raises each time (``lru_cache`` keeps no exception)."""
    return nacl.signing.VerifyKey(public_key_bytes(public_key))


def verify_form(form: bytes, *, public_key: str, signature: str) -> None:
    """Check ``signature`` (base64url) over ``form`` by ``public_key``; raises ``SignatureInvalid``."""
    if not public_key or not signature:
        raise SignatureInvalid(f"unsigned request: no {SIGNER_HEADER}/{SIGNATURE_HEADER} header")
    key = _verify_key(public_key)
    try:
        sig = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    except (binascii.Error, ValueError) as exc:
        raise SignatureInvalid(f"{SIGNATURE_HEADER} is not base64url") from exc
    try:
        key.verify(form, sig)
    except (nacl.exceptions.BadSignatureError, ValueError) as exc:
        raise SignatureInvalid("signature does not match the request (tampered, or signed by another key)") \
            from exc


SERVICE_SIGNATURE_SCHEME = "tau-svc-v1"


def service_form(*, nats_subject: str, headers: dict[str, str], body: bytes) -> bytes:
    """The bytes a service signs for every event it publishes: the request form's lines plus the attributes a
    stage acts on that the request form leaves out (``ce-source``, ``ce-workspace``, ``ce-attempt``,
    ``ce-tauuser``), under its own scheme line so a person's signature can never pass for a service's."""
    return "\n".join([
        SERVICE_SIGNATURE_SCHEME, nats_subject, headers.get("ce-id", ""), headers.get("ce-type", ""),
        headers.get("ce-subject", ""), headers.get("ce-time", ""), headers.get("ce-source", ""),
        headers.get("ce-workspace", ""), headers.get("ce-attempt", ""), headers.get(USER_HEADER, ""),
        hashlib.sha256(body).hexdigest(),
    ]).encode()


def sign_service_headers(key: nkeys.KeyPair, *, nats_subject: str, headers: dict[str, str], body: bytes) -> None:
    """Sign a service's event (``service_form``) with the service's bus key, already loaded (``key``)."""
    form = service_form(nats_subject=nats_subject, headers=headers, body=body)
    headers[SIGNER_HEADER] = key.public_key.decode()
    headers[SIGNATURE_HEADER] = base64.urlsafe_b64encode(key.sign(form)).rstrip(b"=").decode()


def verify_service_signature(event: Event, *, public_key: str = "") -> str:
    """Check a service's signature over the event as received, the headers ``compact`` left out put back
    (``expanded``); by ``public_key`` (the key of the service its ``ce-source`` names) where the event carries
    no ``tau-signer``. Returns the key that verified."""
    key = event.signer or public_key
    verify_form(received_service_form(event), public_key=key, signature=event.signature)
    return key


def received_service_form(event: Event) -> bytes:
    """``service_form`` of a received event over ``expanded(event)``, read straight from the event: a stored
    header where there is one, else the value ``expanded`` derives (``ce-id`` the event's, ``ce-type`` its full
    type, ``ce-attempt`` 1, a run event's or log chunk's ``ce-workspace`` and ``ce-subject`` its subject's),
    without building the expanded headers for every event a stage checks (tests/bus/test_signatures.py
    compares the two)."""
    h = event.headers
    get = h.get
    parts = _laneless_parts(event.nats_subject)
    from_subject = (parts[0] == "run" and len(parts) == 5) or (parts[0] == "log" and len(parts) == 4)
    workspace = get("ce-workspace")
    if workspace is None:
        workspace = parts[1] if from_subject else ""
    about = get("ce-subject")
    if about is None:
        about = parts[2] if from_subject else ""
    return "\n".join([
        SERVICE_SIGNATURE_SCHEME, event.nats_subject, get("ce-id", event.id), get("ce-type", event.ce_type),
        about, get("ce-time", ""), get("ce-source", ""), workspace, get("ce-attempt", "1"), get(USER_HEADER, ""),
        hashlib.sha256(event.data).hexdigest(),
    ]).encode()


def signed_form(event: Event) -> bytes:
    return canonical_form(nats_subject=event.nats_subject, event_id=event.id, event_type=event.ce_type,
                          subject=event.subject, time=event.time, body=event.data)


def verify_signature(event: Event) -> str:
    """Check a request's signature against its own headers and body; returns the signer's public key."""
    verify_form(signed_form(event), public_key=event.signer, signature=event.signature)
    return event.signer
