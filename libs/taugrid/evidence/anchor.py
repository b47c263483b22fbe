"""Anchors: the ledger heads and AUDIT's position, signed and written to a file outside the bus.

Everything on the bus can be rewritten by someone holding a powerful enough credential (stream deletion needs the
break-glass identity, but a ledger or bundle can be replaced by their writers). An anchor fixes what was recorded
at a point in time somewhere the bus cannot reach: one JSON line per anchor appended to a file the operator keeps
(``$TAU_DATA_DIR/anchors/ledger.jsonl`` on the embedded stack, 0600), each signed with the anchor identity's
nkey (ed25519, base64url) over the canonical JSON of the line without its ``signature``:

``{"schema": "taugrid.anchor/v1", "time", "signer", "audit": {"first_seq", "last_seq", "last_digest",
"drift"}, "runs": {"<ws>/<run>": {"head", "entries", "digest"}}, "signature"}``

A sealed run's ledger is kept on the bus as its seal alone (``ledger.seal_only``): ``take`` records its head and
length from the seal, and ``check`` compares the entries ``store.read_ledger`` read back from the sealed bundle
(checked against that seal), so a ledger rewritten with its bundle has another digest or head than anchored.

``check`` first refuses any line not signed by the pinned anchor key (``trusted``: the key ``tau up`` pinned in the
operator's own folder, or ``tau verify --anchor-key``), never by whichever key signed the file's first line, since
whoever can rewrite the file can re-sign it with a key of their own. Then it compares a run's current ledger and
AUDIT with the anchors: for every anchor covering the run (a
later one may have recorded an already rewritten history) the ledger must still hold the anchored head at the
anchored position (a rewritten history has another head there, a truncated one has fewer entries),
a sealed digest must be unchanged, and AUDIT must still start where it started and hold the anchored last
message unchanged (a deleted and recreated AUDIT does not).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import nkeys

from taugrid.bus import kv, streams
from taugrid.bus.bootstrap import audit_drift, stored_retention
from taugrid.bus.connection import Bus
from taugrid.bus.envelope import SignatureInvalid, verify_form
from taugrid.bus.topology import AUDIT_STREAM
from taugrid.evidence import ledger as lg

SCHEMA = "taugrid.anchor/v1"
BUCKET = "ledger"


def _canonical(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(doc: dict[str, Any], seed: bytes | bytearray) -> dict[str, Any]:
    key = nkeys.from_seed(seed)
    signed = {**doc, "signer": key.public_key.decode()}
    signed["signature"] = base64.urlsafe_b64encode(key.sign(_canonical(signed))).rstrip(b"=").decode()
    return signed


def signature_problems(doc: dict[str, Any], *, trusted: str | None = None) -> list[str]:
    """Why an anchor line cannot be trusted (empty when its signature verifies, by ``trusted`` if given)."""
    signer = str(doc.get("signer", ""))
    if trusted and signer != trusted:
        return [f"anchor of {doc.get('time')} is signed by {signer}, not the pinned anchor key {trusted} "
                "(the file was re-signed or is another stack's)"]
    try:
        verify_form(_canonical(doc), public_key=signer, signature=str(doc.get("signature", "")))
    except SignatureInvalid as exc:
        return [f"anchor of {doc.get('time')} does not verify: {exc}"]
    return []


async def take(bus: Bus) -> dict[str, Any]:
    """The current ledger heads and AUDIT position (unsigned)."""
    runs: dict[str, dict[str, Any]] = {}
    for ledger in await kv.values(bus, BUCKET, lg.Ledger, decode=lg.decode):
        runs[f"{ledger.workspace}/{ledger.run_id}"] = {
            "head": ledger.head, "entries": ledger.count,  # a sealed one's from its seal: the KV keeps no entries
            "digest": ledger.seal.digest if ledger.seal is not None else "",
        }
    first, last = await streams.bounds(bus, AUDIT_STREAM)
    return {
        "schema": SCHEMA,
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "audit": {"first_seq": first, "last_seq": last,
                  "last_digest": await _digest_at(bus, last) if last else "",
                  # AUDIT's max age is the platform's retention.audit.max_age: a change there is no drift
                  "drift": await audit_drift(bus, (await stored_retention(bus)).audit.max_age)},
        "runs": runs,
    }


def append(path: Path, doc: dict[str, Any]) -> None:
    """Append one anchor line (the file is created 0600, its folder 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")


class Exporter:
    """Takes an anchor, signs it and appends it to ``path`` unless nothing changed since the last one (the
    embedded stack's supervisor and the chart's ``anchor`` service both run this every interval). Returns
    the AUDIT drift it saw, which the caller raises as an alarm."""

    def __init__(self, path: Path, seed: bytes | bytearray) -> None:
        self.path, self.seed = path, seed
        self.last = _unsigned_line(read(path)[-1]) if path.exists() and path.stat().st_size else ""

    async def export(self, bus: Bus) -> tuple[dict[str, Any] | None, list[str]]:
        """The signed anchor appended (None when nothing changed) and AUDIT's drift."""
        doc = await take(bus)
        line = _unsigned_line(doc)
        signed = None
        if line != self.last:
            signed = sign(doc, self.seed)
            append(self.path, signed)
            self.last = line
        return signed, list(doc["audit"]["drift"])


def _unsigned_line(doc: dict[str, Any]) -> str:
    """What an anchor records, without when and by whom: equal lines anchor the same history."""
    return json.dumps({k: v for k, v in doc.items() if k not in ("time", "signer", "signature")}, sort_keys=True)


def read(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def signed_by(anchors: list[dict[str, Any]], trusted: str) -> list[str]:
    """Every line's problems with its signature (each must be ``trusted``'s own): the first few, and how many."""
    problems = [p for doc in anchors for p in signature_problems(doc, trusted=trusted)]
    if len(problems) > 3:
        problems = [*problems[:3], f"… and {len(problems) - 3} more anchor(s) not signed by {trusted}"]
    return problems


async def check(bus: Bus, anchors: list[dict[str, Any]], *, run_id: str, workspace: str,
                ledger: lg.Ledger | None, trusted: str) -> list[str]:
    """What in the current ledger of the run, and in AUDIT, contradicts the anchors (signatures checked first:
    every line must be signed by ``trusted``, the pinned anchor key)."""
    problems = signed_by(anchors, trusted)
    if problems:
        return problems
    name = f"{workspace}/{run_id}"
    mine = [doc for doc in anchors if name in (doc.get("runs") or {})]
    if not mine:
        problems.append(f"no anchor in the file covers run {run_id}")
    count = ledger.count if ledger is not None else 0
    for doc in mine:  # every anchor: a later one may already have recorded a rewritten history
        want = doc["runs"][name]
        n = int(want["entries"])
        held = _hash_at(ledger, n - 1) if ledger is not None and 0 < n <= count else ""
        if count < n:
            problems.append(f"the ledger holds {count} entries; the anchor of {doc['time']} recorded {n} "
                            "(history was truncated or rewritten)")
        elif n and held is None:
            problems.append(f"the anchor of {doc['time']} recorded entry {n - 1}, which is in the run's sealed "
                            "bundle: read the ledger with its entries (store.read_ledger) to check it")
        elif n and held != want["head"]:
            problems.append(f"ledger entry {n - 1} hashes to {str(held)[:12]}…, the anchor of "
                            f"{doc['time']} recorded {str(want['head'])[:12]}… (history was rewritten)")
        elif want.get("digest") and ledger is not None and (ledger.seal is None
                                                             or ledger.seal.digest != want["digest"]):
            got = ledger.seal.digest[:12] if ledger.seal is not None else "nothing"
            problems.append(f"the ledger seals {got}…, the anchor of {doc['time']} recorded "
                            f"{str(want['digest'])[:12]}… (the sealed bundle was replaced)")
        if problems:
            break  # the earliest contradiction says it; later anchors would repeat it
    for audit in _first_and_last(anchors):
        if not audit.get("last_seq"):
            continue
        first, last = await streams.bounds(bus, AUDIT_STREAM)
        if last < audit["last_seq"] or first > audit["first_seq"]:
            problems.append(f"{AUDIT_STREAM} holds messages {first}..{last}; an anchor recorded "
                            f"{audit['first_seq']}..{audit['last_seq']} (AUDIT was emptied, shrunk or recreated)")
            break
        if await _digest_at(bus, int(audit["last_seq"])) != audit["last_digest"]:
            problems.append(f"{AUDIT_STREAM} message {audit['last_seq']} differs from the anchored one "
                            "(AUDIT was recreated)")
            break
    return problems


def _hash_at(ledger: lg.Ledger, index: int) -> str | None:
    """The hash of entry ``index``: held in the ledger, or the sealed head for the last entry of one stored as its
    seal alone; None for an earlier entry of that one (it is in the bundle)."""
    if ledger.entries:
        return ledger.entries[index].hash
    return ledger.head if index == ledger.count - 1 else None


def _first_and_last(anchors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """AUDIT as the earliest and the latest anchor saw it (one direct get each, however long the file)."""
    picked = [anchors[0], anchors[-1]] if len(anchors) > 1 else anchors[:1]
    return [dict(doc.get("audit") or {}) for doc in picked]


async def _digest_at(bus: Bus, seq: int) -> str:
    """sha256 of AUDIT's message at ``seq`` (subject, newline, body); empty when it is gone."""
    ev = await streams.at(bus, AUDIT_STREAM, seq)
    if ev is None:
        return ""
    return hashlib.sha256(ev.nats_subject.encode() + b"\n" + ev.data).hexdigest()
