"""CloudEvents 1.0 in NATS binary mode.

The payload is the message body (JSON from a msgspec Struct); the attributes travel as ``ce-*`` headers beside
the W3C ``traceparent``. ``Nats-Msg-Id`` equals ``ce-id`` and is deterministic, so a republish by a redelivered
handler is dropped by the stream's dedup window.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar

import msgspec

from taugrid.core.events import RUN_EVENTS, ce_type, short_type

T = TypeVar("T")

SPEC_VERSION = "1.0"


class Event(msgspec.Struct, kw_only=True):
    """A decoded event: CloudEvents attributes plus the raw payload and where it sat in the stream."""

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

    def payload(self, kind: type[T]) -> T:
        return msgspec.json.decode(self.data, type=kind)

    def as_dict(self) -> dict[str, Any]:
        """The data as plain JSON values (for logs, `tau events`, the state projection)."""
        if not self.data:
            return {}
        value = msgspec.json.decode(self.data)
        return value if isinstance(value, dict) else {"value": value}

    def run_payload(self) -> msgspec.Struct:
        return msgspec.json.decode(self.data, type=RUN_EVENTS[self.type])

    def to_json(self) -> dict[str, Any]:
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
            "data": self.as_dict(),
        }


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def headers_for(
    *, event_id: str, event_type: str, source: str, subject: str, workspace: str, attempt: int,
    traceparent: str, family: str = "run",
) -> dict[str, str]:
    headers = {
        "ce-specversion": SPEC_VERSION,
        "ce-id": event_id,
        "ce-type": ce_type(event_type, family=family),
        "ce-source": source,
        "ce-subject": subject,
        "ce-time": now_iso(),
        "ce-workspace": workspace,
        "ce-attempt": str(attempt),
        "content-type": "application/json",
        "Nats-Msg-Id": event_id,
    }
    if traceparent:
        headers["traceparent"] = traceparent
    return headers


def from_message(subject: str, headers: dict[str, str] | None, data: bytes, seq: int = 0) -> Event:
    """Decode a message; a message with no CloudEvents headers still yields an Event (type from the subject)."""
    h = headers or {}
    ce = h.get("ce-type", "")
    kind = short_type(ce) if ce else ".".join(subject.split(".")[-2:])
    try:
        attempt = int(h.get("ce-attempt", "1"))
    except ValueError:
        attempt = 1
    return Event(
        id=h.get("ce-id", h.get("Nats-Msg-Id", "")),
        type=kind,
        source=h.get("ce-source", ""),
        subject=h.get("ce-subject", ""),
        time=h.get("ce-time", ""),
        data=data,
        nats_subject=subject,
        workspace=h.get("ce-workspace", ""),
        attempt=attempt,
        traceparent=h.get("traceparent", ""),
        seq=seq,
    )
