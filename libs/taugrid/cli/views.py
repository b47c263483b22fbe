"""Human views of runs: the phase tree, tables, event lines. JSON views are the records themselves."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import msgspec

from taugrid.cli.common import color
from taugrid.client.summaries import event_detail
from taugrid.core import nesting
from taugrid.core.events import RUN_EVENTS, ce_type
from taugrid.core.limits import EVENT_MAX_DEPTH
from taugrid.core.states import OPTIONAL_PHASES, PHASE_NAMES, RunRecord

if TYPE_CHECKING:
    from taugrid.bus.envelope import Event

_MARK = {
    "done": ("✔", "green"),
    "active": ("●", "yellow"),
    "pending": ("○", "white"),
    "warning": ("!", "yellow"),
    "failed": ("✘", "red"),
    "skipped": ("-", "white"),
}
_STATE_COLOR = {"succeeded": "green", "failed": "red", "rejected": "red", "cancelled": "magenta"}

STATUS_SCHEMA = "taugrid.io/status/v1"
_LABEL = {"admission": "kueue admission", "image-pull": "image pull", "container-start": "container start"}


def elapsed(start: float | None, end: float | None) -> str:
    if not start:
        return ""
    secs = max(0.0, (end or time.time()) - start)
    return f"{secs:.1f}s" if secs < 120 else f"{secs / 60:.1f}m"


def phase_tree(record: RunRecord) -> str:
    state = color(record.state, _STATE_COLOR.get(record.state, "yellow"))
    lines = [
        f"run {record.run_id}  ({record.name or '?'}, workspace {record.workspace})  state {state}  "
        f"attempt {record.attempt}"
    ]
    by_name = {p.name: p for p in record.phases}
    for name in PHASE_NAMES:
        p = by_name.get(name)
        if p is None and name in OPTIONAL_PHASES:
            continue
        if name == "raycluster" and record.object_kind != "RayJob" and (p is None or p.status == "skipped"):
            continue  # only a RayJob has a RayCluster
        status = p.status if p else "pending"
        mark, fg = _MARK.get(status, ("?", "white"))
        detail = p.detail if p else ""
        took = elapsed(p.started, p.finished) if p else ""
        lines.append(f"  {color(mark, fg)} {_LABEL.get(name, name):<16} {took:>7}  {detail}".rstrip())
        if p and p.hint:
            lines.append(f"      tip: {p.hint}")
    if record.cluster:
        lines.append(f"  cluster: {record.cluster}" + (f" ({record.cluster_reason})" if record.cluster_reason else ""))
    elif record.cluster_reason:  # chosen once, the choice reopened since (docs §13d)
        lines.append(f"  cluster: none now ({record.cluster_reason})")
    lines += pod_lines(record)
    lines += topology_lines(record)
    if record.resized:  # an elastic run: how many pods it has now, and why (exec.resized)
        lines.append(f"  size: {record.size} pods (last resize: {record.resized})")
    if record.state == "queued" and record.position is not None:
        lines.append(f"  waiting: {record.position} run(s) ahead in ClusterQueue {record.cluster_queue}")
    if record.reason and record.state in ("failed", "rejected", "cancelled", "failing", "retrying"):
        lines.append(f"  reason: {record.reason}" + (f" — {record.message}" if record.message else ""))
    if record.exit_code is not None:
        lines.append(f"  exit code: {record.exit_code}")
    if record.environment:
        lines.append(f"  python: {environment_line(record.environment)}")
        if record.environment.get("warning"):
            lines.append(f"  warning: {record.environment['warning']}")
    if record.evidence_digest:
        lines.append(f"  evidence: {record.evidence_digest}")
    return "\n".join(lines)


def environment_line(env: dict[str, str]) -> str:
    """``/path/to/python (3.12.3, environment ab12… reused, from VIRTUAL_ENV)`` from what the backend reported."""
    if env.get("container"):
        return f"the image's, in container {env['container']} ({env.get('engine', '')})".replace(" ()", "")
    parts = [env.get("python_version", "")]
    if env.get("env"):
        parts.append(f"environment {env['env']} " + ("reused" if env.get("env_cached") == "true" else "built"))
    if env.get("source"):
        parts.append(f"from {env['source']}")
    inner = ", ".join(p for p in parts if p)
    return f"{env.get('python', '?')}" + (f" ({inner})" if inner else "")


def pod_lines(record: RunRecord) -> list[str]:
    """The current attempt's pods and their containers (init first), as TauGrid's status tables show them."""
    if not record.pods:
        return []
    lines = ["  pods:"]
    for pod in record.pods:
        lines.append(f"    {pod.name}  {pod.phase or '?'}  node {pod.node or '-'}")
        for ct in pod.containers:
            state = ct.state or "-"
            if ct.reason:
                state += f" ({ct.reason})"
            if ct.exit_code is not None:
                state += f" exit {ct.exit_code}"
            if ct.restarts:
                state += f", {ct.restarts} restarts"
            lines.append(f"      {ct.kind:<4} {ct.name:<16} {state}")
    return lines


def topology_lines(record: RunRecord) -> list[str]:
    """Where admission placed the current attempt by topology: per TAS pod set, its domains in rank order with
    the ranks (pod indices, JOB_COMPLETION_INDEX) each one holds."""
    lines = []
    for ps in record.topology:
        lines.append(f"  topology ({ps.pod_set}): {' / '.join(ps.levels)}")
        first = 0
        for d in ps.domains:
            ranks = f"rank {first}" if d.count == 1 else f"ranks {first}-{first + d.count - 1}"
            lines.append(f"    {' / '.join(d.values)}  {ranks}")
            first += d.count
    return lines


def status_json(record: RunRecord) -> dict[str, Any]:
    data: dict[str, Any] = msgspec.to_builtins(record)
    data.pop("history", None)
    return {"schemaVersion": STATUS_SCHEMA, **data}


def table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    out = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip()]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    return "\n".join(out)


def event_line(ev: Event) -> str:
    return f"{ev.time}  {ev.subject:<28} a{ev.attempt}  {ev.type:<20} {ev.source:<24} {event_detail(ev)}"


def stage_line(ev: Event) -> str:
    """One stage of a followed run, compact: the run id and time are already known to the reader."""
    return f"{ev.type:<20} {event_detail(ev)}".rstrip()


def attempt_separator(attempt: int, why: str = "") -> str:
    return color(f"── attempt {attempt}" + (f" ({why})" if why else "") + " ──", "cyan")


def terminal_reason(record: RunRecord) -> str:
    """Why a run is where it is, one line: a rejection's first reason, who cancelled, the give-up message."""
    if record.state == "cancelled":
        if record.cancel_requested:
            return f"cancelled by {record.cancelled_by or 'a user'}"
        return record.message or record.reason
    if record.state == "succeeded":
        return ""
    return record.reason or record.message


_JSON = msgspec.json.Encoder()


class _JsonLine(msgspec.Struct):
    """One line of ``event_json_lines``: ``Event.to_json()``'s keys in its order (a struct encodes in one C pass,
    where a dict per event cost as much as reading the event), ``undecodable`` only when the data is not read."""

    id: str
    type: str
    short_type: str
    source: str
    subject: str
    time: str
    workspace: str
    attempt: int
    traceparent: str
    seq: int
    user: str
    signer: str
    data: Any
    undecodable: str | msgspec.UnsetType = msgspec.UNSET


def event_json_lines(events: list[Event]) -> bytes:
    """JSON Lines of ``Event.to_json()`` for a batch, in one buffer: the payload, already JSON on the wire, is
    checked and embedded as it is instead of being decoded to Python values and encoded again; a run event's
    goes through its contract Struct (decoded and encoded in C), so the fields its publisher left out at their
    defaults (``core/wirejson``) are printed, as ``Event.as_dict`` gives them. A payload that does not decode
    (not JSON, or nested past ``EVENT_MAX_DEPTH``) is ``"data": null`` with ``"undecodable"`` saying why.

    A payload no longer than ``EVENT_MAX_DEPTH`` bytes cannot nest deeper (each level takes a bracket), so only a
    longer one is measured (``nesting.nests_deeper``); each contract's decoder is built once (``_run_decoder``):
    ``msgspec.json.decode`` with a ``type`` looks the type up on every call, which cost as much as the decoding.
    A type's decoder and full name are looked up once a batch (a dict), not through two caches an event."""
    lines = []
    unset = msgspec.UNSET
    raw = _RAW.decode
    kinds: dict[str, tuple[str, msgspec.json.Decoder[Any] | None]] = {}  # a batch holds a few types, over and over
    for ev in events:
        data: Any = ev.data
        undecodable: str | msgspec.UnsetType = unset
        kind = kinds.get(ev.type)
        if kind is None:
            kind = kinds[ev.type] = (_ce_type(ev.type), _run_decoder(ev.type))
        try:
            if data[:1] == b"{" and (len(data) <= EVENT_MAX_DEPTH or not nesting.nests_deeper(data)):
                decoder = kind[1] if ev.nats_subject.startswith("run.") else None
                if decoder is None:
                    data = raw(data)  # validates, keeps the bytes
                else:  # its Struct, whole when encoded; a body that is not its Struct's is shown as stored
                    try:
                        data = decoder.decode(data)
                    except msgspec.ValidationError:
                        data = raw(data)
            else:
                data = ev.as_dict()
        except msgspec.DecodeError as exc:
            data, undecodable = None, str(exc)
        lines.append(_JsonLine(ev.id, kind[0], ev.type, ev.source, ev.subject, ev.time, ev.workspace,
                               ev.attempt, ev.traceparent, ev.seq, ev.user, ev.signer, data, undecodable))
    return _JSON.encode_lines(lines)


_RAW = msgspec.json.Decoder(msgspec.Raw)


@functools.lru_cache(maxsize=1024)
def _run_decoder(short: str) -> msgspec.json.Decoder[Any] | None:
    """The decoder of a run event type's contract Struct (None for a type without one)."""
    kind = RUN_EVENTS.get(short)
    return msgspec.json.Decoder(kind) if kind is not None else None


@functools.lru_cache(maxsize=1024)
def _ce_type(short: str) -> str:
    return ce_type(short)
