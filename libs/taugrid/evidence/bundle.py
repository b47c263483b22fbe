"""Assemble a run's evidence bundle from its events, its log chunks, its output directories and its ledger.

Invariant: the bundle is a pure function of its inputs — no wall-clock, host or ordering-by-arrival values —
so collecting the same run twice yields byte-identical canonical JSON and therefore the same digest. Times in
the bundle are the events' own ``ce-time`` values. Only ``scan_dir`` touches the filesystem (the run's output
and checkpoint directories, when they exist on this machine).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

import taugrid
from taugrid.bus.envelope import SIGNATURE_SCHEME, Event, run_traceparent
from taugrid.core import contracts as c
from taugrid.core.redaction import Redactor
from taugrid.core.states import TRANSITIONS
from taugrid.core.usage import Seen, fold
from taugrid.evidence.ledger import GENESIS, Entry, Seal, canonical, entry_hash, sha256

SCHEMA = "taugrid.evidence.bundle/v1"
INLINE_LOG_BYTES = 256 * 1024  # an attempt's log larger than this is stored as its own object
METRICS_BUDGET = 1 << 20  # metrics*.jsonl text carried inline, all files together
MAX_FILES = 10_000

_EXITS = ("exec.succeeded", "exec.failed", "exec.cancelled")


def terminal_state(event_type: str) -> str:
    return TRANSITIONS[event_type][1] if event_type in TRANSITIONS else event_type


def bundle_name(run_id: str) -> str:
    return f"runs/{run_id}/bundle.json"


def log_name(run_id: str, attempt: int) -> str:
    return f"runs/{run_id}/attempt-{attempt}.log"


def render_logs(chunks: Iterable[c.LogChunk]) -> tuple[str, int]:
    """One attempt's log text in (pod, seq) order, each chunk once; lines are prefixed by pod when several."""
    unique: dict[tuple[str, str, int], c.LogChunk] = {}
    for ch in chunks:
        unique.setdefault((ch.pod, ch.stream, ch.seq), ch)
    ordered = sorted(unique.values(), key=lambda ch: (ch.pod, ch.seq, ch.stream))
    several = len({ch.pod for ch in ordered}) > 1
    lines = [f"{ch.pod}| {line}" if several else line for ch in ordered for line in ch.lines]
    return ("\n".join(lines) + "\n") if lines else "", len(unique)


def log_section(run_id: str, attempt: int, text: str, chunks: int) -> tuple[dict[str, Any], bytes | None]:
    """The bundle's record of one attempt's log, and the bytes to store separately when it is large."""
    data = text.encode()
    section: dict[str, Any] = {
        "chunks": chunks,
        "lines": text.count("\n"),
        "bytes": len(data),
        "sha256": sha256(data),
    }
    if len(data) > INLINE_LOG_BYTES:
        section["object"] = log_name(run_id, attempt)
        return section, data
    section["text"] = text
    return section, None


class Keeper:
    """Copies of small output files for the object store, within a byte budget shared by one run's directories
    (``TAU_EVIDENCE_KEEP_OUTPUTS``; 0 keeps none). Named by content, so a file listed twice is stored once.
    Where the outputs live on a volume the CLI cannot reach (Kubernetes), these copies are what
    ``tau outputs --copy`` fetches."""

    def __init__(self, run_id: str, budget: int) -> None:
        self.run_id, self.budget = run_id, budget
        self.blobs: dict[str, bytes] = {}

    def offer(self, data: bytes, digest: str) -> str:
        """The object name the file (its bytes, as hashed) is kept under, or "" when it does not fit the
        budget."""
        name = f"runs/{self.run_id}/outputs/{digest}"
        if name in self.blobs:
            return name
        if len(data) > self.budget:
            return ""
        self.blobs[name] = data
        self.budget -= len(data)
        return name


def scan_dir(path: str, *, metrics: bool, keeper: Keeper | None = None) -> dict[str, Any]:
    """Files under ``path`` (relative path, size, sha256, and the object holding a copy when ``keeper`` kept
    one) and, when asked, metrics*.jsonl contents.

    The directory is the run's own, written by the run's OS user, and this reads it as root: a link is never
    followed (listed by descriptors, each file opened one name at a time without following one), so a run
    cannot have a key or another workspace's file hashed, kept or inlined as if it were its output."""
    out: dict[str, Any] = {"path": path, "present": False, "files": [], "truncated": False}
    if metrics:
        out["metrics"] = []
    try:
        root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW) if path else -1
    except OSError:
        return out
    if root_fd < 0:
        return out
    try:
        out["present"] = True
        files = sorted(_regular_files(root_fd))
        if len(files) > MAX_FILES:
            files, out["truncated"] = files[:MAX_FILES], True
        budget = METRICS_BUDGET
        for rel in files:
            try:
                size, digest, data = _hash_file(root_fd, rel, keep=keeper.budget if keeper is not None else 0,
                                                head=max(budget, 0) if metrics else 0)
            except OSError as exc:
                out["files"].append({"path": rel, "error": str(exc)})
                continue
            entry: dict[str, Any] = {"path": rel, "size": size, "sha256": digest}
            kept = keeper.offer(data, digest) if keeper is not None and len(data) == size else ""
            if kept:
                entry["object"] = kept
            out["files"].append(entry)
            name = rel.rsplit("/", 1)[-1]
            if metrics and name.startswith("metrics") and name.endswith(".jsonl"):
                raw = data[: max(budget, 0)]
                budget -= len(raw)
                out["metrics"].append(
                    {"path": rel, "text": raw.decode(errors="replace"), "truncated": len(raw) < size}
                )
    finally:
        os.close(root_fd)
    return out


def _regular_files(root_fd: int) -> list[str]:
    """Relative paths of the regular files under the directory ``root_fd`` (links neither listed nor followed)."""
    found: list[str] = []
    for dirpath, _dirs, names, dir_fd in os.fwalk(".", dir_fd=root_fd):
        for name in names:
            try:
                regular = stat.S_ISREG(os.lstat(name, dir_fd=dir_fd).st_mode)
            except OSError:
                continue
            if regular:
                found.append(os.path.normpath(os.path.join(dirpath, name)))
    return found


def _hash_file(root_fd: int, rel: str, *, keep: int, head: int) -> tuple[int, str, bytes]:
    """(size, sha256, the bytes when the file is at most ``max(keep, head)`` bytes long, else its first ``head``)
    of ``rel`` under ``root_fd``, reached without following a link."""
    *parents, name = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parents:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            raise OSError(f"{rel} is no longer a regular file")
        h = hashlib.sha256()
        size = 0
        kept = bytearray()
        limit = max(keep, head)
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
            size += len(block)
            if len(kept) < limit:
                kept += block[: limit - len(kept)]
        data = bytes(kept) if size <= limit else bytes(kept[:head])
    return size, h.hexdigest(), data


def event_records(events: list[Event], *, trace: str = "") -> list[dict[str, Any]]:
    """The bundle's records of ``events`` (``event_record``), each with its ``traceparent`` when it differs from
    the record's before (from ``trace``: the run's derived one, ``envelope.run_traceparent``, which most runs'
    events carry, or "" as earlier bundles count): the ledger entries keep it, so the chain is recomputed from
    these records (``chain_of``), and a run's events mostly carry one (issue 27: ~60 B of a bundle, repeated;
    the first record's too, from the run's, ~35 B stored)."""
    records, before = [], trace
    for ev in events:
        record = event_record(ev)
        if ev.traceparent != before:
            record["traceparent"] = before = ev.traceparent
        records.append(record)
    return records


def event_record(ev: Event) -> dict[str, Any]:
    """The bundle's record of one event; one whose payload does not decode (hostile nesting, not JSON) is kept
    with ``data: null`` and why, so the run is still sealed and its ledger still matches AUDIT."""
    record: dict[str, Any] = {
        "seq": ev.seq,
        "id": ev.id,
        "type": ev.type,
        "attempt": ev.attempt,
        "time": ev.time,
        "source": ev.source,
        "workspace": ev.workspace,
        "payload_sha256": sha256(ev.data or b""),
    }
    try:
        record["data"] = ev.as_dict()
    except msgspec.DecodeError as exc:
        record.update(data=None, undecodable=str(exc))
    return record


# The events ``build`` reads as typed payloads (the rest only as plain JSON).
_TYPED: dict[str, type[msgspec.Struct]] = {
    "submit.requested": c.SubmitRequested, "submit.accepted": c.SubmitAccepted, "policy.approved": c.PolicyApproved,
    "render.applied": c.RenderApplied, "render.failed": c.RenderFailed,
}


def readable(ev: Event) -> bool:
    """Whether the bundle can derive anything from ``ev``: its payload decodes (as the type ``build`` reads)."""
    try:
        ev.as_dict()
        if ev.type in _TYPED:
            ev.payload(_TYPED[ev.type])
    except msgspec.DecodeError:
        return False
    return True


def _epoch(ce_time: str) -> float:
    """An event's ``ce-time`` (RFC 3339, ``Z``) as epoch seconds; 0 when it is not one."""
    try:
        return dt.datetime.fromisoformat(ce_time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def accounting(run_id: str, workspace: str, records: list[dict[str, Any]], *, gpu_hour_price: float,
               price_revision: int) -> dict[str, Any]:
    """The run's accounting from its bundled event records (``event_record``): the fold ``tau usage`` makes
    (``core/usage.py``: queue wait, running time, GPU-seconds by fraction, estimated cost), over the events'
    own ``ce-time`` (so ``tau verify`` recomputes it from the bundle alone), up to the terminal event.
    ``gpu_hour_price``: the run's compute profile's price in the platform revision it was approved against
    (``price_revision``; 0 when that revision is no longer kept)."""
    seen = []
    for rec in records:
        resolved = None
        if rec.get("type") == "policy.approved":
            try:
                resolved = msgspec.convert((rec.get("data") or {}).get("run"), type=c.ResolvedRun)
            except msgspec.ValidationError:
                resolved = None
        pods = (rec.get("data") or {}).get("new_count") if rec.get("type") == "exec.resized" else 0
        seen.append(Seen(str(rec.get("type", "")), run_id, workspace, _epoch(str(rec.get("time", ""))),
                         resolved=resolved, pods=pods if isinstance(pods, int) else 0))
    end = max((s.at for s in seen), default=0.0)
    usage = next(iter(fold(seen, prices={}, now=end)), None)
    if usage is None:
        return {"queued_s": 0.0, "running_s": 0.0, "gpus": 0.0, "gpu_seconds": 0.0, "profile": "", "queue": "",
                "gpu_hour_price": gpu_hour_price, "price_revision": price_revision, "cost": 0.0, "clock": "ce-time"}
    return {
        "queued_s": round(usage.queued_s, 3),
        "running_s": round(usage.running_s, 3),
        "gpus": usage.gpus,
        "gpu_seconds": round(usage.gpu_seconds, 3),
        "profile": usage.profile,
        "queue": usage.queue,
        "gpu_hour_price": gpu_hour_price,
        "price_revision": price_revision,
        "cost": round(usage.gpu_seconds / 3600 * gpu_hour_price, 6),
        "clock": "ce-time",
    }


def build(
    *,
    run_id: str,
    workspace: str,
    seal: Seal,
    ledger: tuple[Entry, ...],
    events: list[Event],
    logs: dict[int, dict[str, Any]],
    outputs: dict[str, Any],
    gpu_hour_price: float = 0.0,
    price_revision: int = 0,
    manifests: Mapping[str, list[dict[str, Any]] | str] | None = None,
) -> dict[str, Any]:
    """The bundle as plain JSON values. ``events``: the run's events up to the terminal one, inclusive.
    ``manifests``: by digest, the manifests of each ``render.applied`` that names them by digest alone (issue 27,
    ``bus/manifests.py``), already checked against it, or why they could not be had (the attempt's ``render``
    then says so under ``manifests_missing``)."""
    terminal = ledger[seal.index]
    config: dict[str, Any] = {}
    resolved: c.ResolvedRun | None = None
    platform_revision = 0
    source = {"object": "", "digest": ""}
    attempts: dict[int, dict[str, Any]] = {}
    recovery: list[dict[str, Any]] = []
    identity: dict[str, Any] = {}

    def attempt(n: int) -> dict[str, Any]:
        return attempts.setdefault(
            n,
            {
                "attempt": n,
                "render": None,
                "render_failed": None,
                "admitted": None,
                "running": None,
                "exit": None,
            },
        )

    requested = False
    for ev in filter(readable, events):  # an undecodable one is only listed (``event_record``)
        data = ev.as_dict()
        if ev.type == "submit.requested":
            if requested:  # the first stored is the run's; the submitter never answers a later one (anyone
                continue   # in the workspace may publish on the run's subject), so it is only listed
            requested = True
            req: c.SubmitRequested = ev.payload(c.SubmitRequested)
            config.setdefault("text", req.config_text)
            config.setdefault("path", req.config_path)
            config.update(submission_id=req.submission_id)
            source = {"object": req.source_object, "digest": req.source_digest}
            identity.update(signer=ev.signer, signature=ev.signature, signed=signed_attributes(ev))
        elif ev.type == "submit.accepted":
            acc: c.SubmitAccepted = ev.payload(c.SubmitAccepted)
            if acc.config_text:  # the submitter's copy is authoritative when both carry it
                config.update(text=acc.config_text, path=acc.config_path)
            config.update(config_hash=acc.config_hash, parsed=acc.config, user=acc.user)
            identity.update(user=acc.user, verified_signer=acc.signer)
            source = {
                "object": acc.source_object or source["object"],
                "digest": acc.source_digest or source["digest"],
            }
        elif ev.type == "policy.approved":
            pa: c.PolicyApproved = ev.payload(c.PolicyApproved)
            resolved, platform_revision = pa.run, pa.platform_revision or pa.run.platform_revision
            source = {
                "object": pa.run.source_object or source["object"],
                "digest": pa.run.source_digest or source["digest"],
            }
        elif ev.type == "render.applied":
            ra: c.RenderApplied = ev.payload(c.RenderApplied)
            render = msgspec.to_builtins(ra)
            if not ra.manifests:  # stored by digest, not carried (an earlier release's event carries them)
                got = (manifests or {}).get(ra.digest, "not read at the seal")
                render.update({"manifests": got} if isinstance(got, list) else {"manifests_missing": got})
            attempt(ra.attempt)["render"] = render
        elif ev.type == "render.failed":
            rf: c.RenderFailed = ev.payload(c.RenderFailed)
            attempt(rf.attempt)["render_failed"] = msgspec.to_builtins(rf)
        elif ev.type == "admission.admitted":
            attempt(ev.attempt)["admitted"] = data
        elif ev.type == "exec.running":
            attempt(ev.attempt)["running"] = data
        elif ev.type == "exec.resized":  # an elastic run's resizes, in order
            attempt(ev.attempt).setdefault("resizes", []).append({"seq": ev.seq, "time": ev.time, **data})
        elif ev.type in _EXITS:
            attempt(ev.attempt)["exit"] = {"event": ev.type, "seq": ev.seq, "time": ev.time, **data}
        elif ev.type in ("recovery.retrying", "recovery.gave_up"):
            recovery.append({"event": ev.type, "attempt": ev.attempt, "seq": ev.seq, **data})
    for n in logs:
        attempt(n)
    # no config.sha256: it is its text's (``config_sha256``), written only where ``redacted`` blanks a secret in it
    if not config.get("config_hash") and resolved is not None:  # issue 27: the policy's hash of the parse it
        config["config_hash"] = resolved.config_hash            # resolved (an earlier submit.accepted carries it)
    trace = run_traceparent(run_id)  # what the first record is counted from: the run's, not written (issue 27)
    records = event_records(events, trace=trace)
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "workspace": workspace,
        "terminal": {
            "event_id": terminal.event_id,
            "type": terminal.type,
            "state": terminal_state(terminal.type),
            "attempt": terminal.attempt,
            "seq": terminal.seq,
            "time": terminal.time,
        },
        "config": config,
        "identity": identity,
        "resolved": msgspec.to_builtins(resolved) if resolved is not None else None,
        "source": source,
        "platform": {"revision": platform_revision, "taugrid_version": taugrid.__version__},
        "attempts": [{**attempts[n], "logs": logs.get(n)} for n in sorted(attempts)],
        "recovery": recovery,
        "outputs": outputs,
        "accounting": accounting(run_id, workspace, records, gpu_hour_price=gpu_hour_price,
                                 price_revision=price_revision),
        "events": records,
        "ledger": ledger_section(terminal.hash, ledger, records, trace=trace),
    }


CHAINED_FROM_EVENTS = "events"  # a bundle's ``ledger.entries`` when they are its event records, chained
# the same, its first record's traceparent, where it names none, its run's derived one (``run_traceparent`` of the
# bundle's ``run_id``), not "" as an earlier bundle's "events" reads
CHAINED_FROM_RUN_EVENTS = "run-events"
CHAINED = (CHAINED_FROM_EVENTS, CHAINED_FROM_RUN_EVENTS)


def ledger_section(head: str, entries: tuple[Entry, ...], records: list[dict[str, Any]], *,
                   trace: str = "") -> dict[str, Any]:
    """The bundle's ``ledger``: its entries as ``CHAINED_FROM_EVENTS`` when they are exactly the chain of its event
    records (``chain_of``), else listed with its head (issue 27: each listed entry repeats its event's attributes
    next to two sha256 hex strings that deflate cannot shrink, ~490 of a trivial run's ~1,520 stored bytes). An
    entry's hash is a function of its event's attributes and the hash before it, so a hash written down vouches
    for nothing a reader cannot recompute: what pins the chain is its head, which the seal, ``evidence.sealed``
    in AUDIT and the anchors keep, and the bundle's digest. Listed still when an event of the chain is not among
    the records (aged out of RUNS before the seal of a ledger an earlier release kept per event). ``trace``: the
    traceparent the records were counted from (``event_records``): the run's, or "" (``CHAINED_FROM_EVENTS``)."""
    try:
        derived = chain_of(records, trace=trace) == list(entries)
    except msgspec.ValidationError:
        derived = False
    if derived:  # its head too is the chain's: recomputed, not written (~45 B)
        return {"entries": CHAINED_FROM_RUN_EVENTS if trace else CHAINED_FROM_EVENTS}
    return {"head": head, "entries": [msgspec.to_builtins(e) for e in entries]}


def chain_of(records: list[Any], *, trace: str = "") -> list[Entry]:
    """The ledger entries of a bundle's event records (``event_records``: a record without ``traceparent`` has
    the one before it, the first ``trace``), in their order, chained from ``GENESIS`` as ``ledger.extend`` chains
    the events themselves. ``msgspec.ValidationError`` (a ``ValueError``) when a record is not one (a bundle
    modified: its digest no longer matches the seal's either)."""
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise msgspec.ValidationError("the bundle's events are not a list of event records")
    fields, traceparent = [], trace
    for i, r in enumerate(records):
        traceparent = r.get("traceparent", traceparent)
        fields.append({"index": i, "seq": r.get("seq"), "event_id": r.get("id"), "type": r.get("type"),
                       "attempt": r.get("attempt"), "time": r.get("time"), "source": r.get("source"),
                       "traceparent": traceparent, "payload_sha256": r.get("payload_sha256"), "prev": ""})
    drafts = msgspec.convert(fields, type=list[Entry])
    chain: list[Entry] = []
    prev = GENESIS
    for draft in drafts:
        entry = msgspec.structs.replace(draft, prev=prev)
        entry = msgspec.structs.replace(entry, hash=entry_hash(entry))
        chain.append(entry)
        prev = entry.hash
    return chain


def redacted(bundle: dict[str, Any], redact: Redactor) -> dict[str, Any]:
    """``bundle`` with every form of the workspace's secret values blanked wherever a person's data sits (the
    config, the resolved run, attempts, recovery, outputs, event payloads), whatever name carried them. Left as
    they are: the ledger, the identity (hashes and signatures that ``tau verify`` re-checks), each event's own
    attributes, and the logs (blanked before their sha256 was taken, ``store.collect``)."""
    if not redact:
        return bundle
    out = dict(bundle)
    for key in ("config", "resolved", "recovery", "outputs"):
        out[key] = redact.doc(bundle[key])
    text = bundle["config"].get("text")
    if isinstance(text, str) and out["config"].get("text") != text:  # the sealed text's sha256 is the original's
        out["config"] = {**out["config"], "sha256": sha256(text.encode())}
    out["attempts"] = [{k: v if k == "logs" else redact.doc(v) for k, v in a.items()} for a in bundle["attempts"]]
    out["events"] = [{**rec, "data": redact.doc(rec["data"])} for rec in bundle["events"]]
    return out


def config_sha256(doc: Mapping[str, Any]) -> str | None:
    """The sha256 of the user's config text as submitted: the one the bundle records (a text a secret was blanked
    in, ``redacted``; every bundle sealed before issue 27's cut), else its text's (issue 27: ~40 B of a bundle
    whose text differs from its base's); None when the bundle holds no text."""
    config = doc.get("config")
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("sha256"), str):
        return str(config["sha256"])
    return sha256(config["text"].encode()) if isinstance(config.get("text"), str) else None


def signed_attributes(ev: Event) -> dict[str, str]:
    """What the submission's signature covers (``envelope.canonical_form``), so ``tau verify`` can re-check it
    against the sealed public key without the original message."""
    return {"scheme": SIGNATURE_SCHEME, "nats_subject": ev.nats_subject, "id": ev.id, "type": ev.ce_type,
            "subject": ev.subject, "time": ev.time, "body_sha256": sha256(ev.data)}


def encode(bundle: dict[str, Any]) -> bytes:
    return canonical(bundle)
