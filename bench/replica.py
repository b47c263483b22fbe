"""A replica of measured runs, many times over, and nats-server's memory after a restart on it (issue 27).

Storing 100,000 real runs takes the embedded stack a long while on two cores (half an hour or more before run
history was kept by run; 5,000 runs sealed in 50-75 s since), so ``bench/storage.py
--replicate N`` measures a restart over N runs differently: it takes the messages its real runs left in the store
(``COPIED``: every stream, KV bucket and object store a run keeps anything in) and publishes copies of them, in a
copy of the store, until it holds N runs' worth. Each copy has a new run id, submission id and object nuid of the
same length (in subjects, headers and bodies; a gzip or deflate body keeps its bytes, ids and all), a new
``Nats-Msg-Id`` of the same length, and no ``Nats-Expected-*`` header (a copy is not a compare-and-set); an
object's metadata subject is its new name's base64. A run's events are taken from HISTORY (RUNS, an interest
stream, keeps nothing of a finished run) as RUNS stored them (their subject from the ``Nats-Stream-Source`` header
the server wrote, which a publish may not carry) and published to RUNS: HISTORY and AUDIT take them through their
own feeds (``topology.FEEDS``), so the server writes their copies and headers itself, as it does for a running
stack, and RUNS lets each event go once the feeds stored it. The stack is not running meanwhile, so the services'
durables on RUNS would hold every copy (an interest stream keeps an event until each durable whose filter matches
acked it): ``add_copies`` deletes them first and makes them again, with their own settings, at the end of RUNS
once it drained, which is what a running stack's durables are at once they acked every finished run's events.
Messages carrying a
``Nats-TTL`` are copied too and expire as theirs would (the local cluster's purge markers after 600 s; the
submission-id keys after 24 h, so a restart within a day counts them, as a real one would).

Then nats-server alone restarts on that store, with Go's heap profile served (``prof_port``): its resident memory
once every stream answered and 5 s later, and its live heap after a forced GC by kind (``KINDS``, from each
allocation's stack). ``attribute`` restarts it once without each store's directory to say what each holds.

What a replica is not: its copies were all stored within a minute or two, so a restart right away finds every
one of them inside RUNS' 600 s duplicate window (the server re-reads what RUNS still holds of them to rebuild its
message ids, which a history spread over days would not make it do; once the feeds drained RUNS that is nothing,
and the two restarts read alike); a restart once that window has passed separates the two. Its timestamps, block
boundaries and message order are the replica's, not a month of traffic's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import re
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import psutil

from taugrid.bus.envelope import SOURCE_HEADER, sourced
from taugrid.bus.topology import AUDIT_STREAM, FEEDS, HISTORY_STREAM
from taugrid.core.ids import new_submission_id
from taugrid.ports import free_port
from taugrid.stack import natsserver

# the stores a run keeps messages in, whose messages are copied; HISTORY's and AUDIT's are published to RUNS as the
# events they were (AUDIT's kinds are in AUDIT only), and HISTORY and AUDIT take them through their feeds
COPIED = ("HISTORY", "AUDIT", "KV_run_state", "KV_ledger", "KV_submissions", "KV_local_cluster", "KV_manifests",
          "OBJ_evidence")
# the stores whose share of the live heap `attribute` measures (RUNS holds nothing of a finished run)
ATTRIBUTED = ("HISTORY", "AUDIT", "OBJ_evidence", "KV_run_state", "KV_ledger", "KV_submissions")
FEED_DURABLES = frozenset(f.durable for f in FEEDS)
DRAIN_S = 3600.0  # how long the feeds are given to take every copy out of RUNS
RUN_ID = re.compile(rb"store-[0-9a-f]{16}")  # bench/storage.py names its measured runs `store`
CHUNK = re.compile(r"^\$O\.evidence\.C\.[^.]+\.([0-9A-Za-z]+)$")
WINDOW_S = 600.0  # RUNS' duplicate window: a restart later than this after the last copy does not re-read them


@dataclass
class Stored:
    """One message as a store holds it."""

    stream: str
    subject: str
    headers: dict[str, str]
    data: bytes


@dataclass
class Template:
    """Every message one measured run left in the stores, and the ids a copy substitutes."""

    run_id: bytes
    submission_id: bytes = b""
    nuids: list[bytes] = field(default_factory=list)
    messages: list[Stored] = field(default_factory=list)


Copy = tuple[str, dict[str, str], bytes]  # subject, headers, body


def parse_headers(raw: bytes) -> dict[str, str]:
    """A stored message's headers (``NATS/1.0`` and ``key: value`` lines)."""
    out: dict[str, str] = {}
    for line in raw.decode(errors="replace").split("\r\n")[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            out[key.strip()] = value.strip()
    return out


async def read_stream(nc: Any, name: str) -> list[Stored]:
    """Every message stream ``name`` holds (none when it does not exist), by the JetStream API's message get.
    HISTORY's and AUDIT's are read as the RUNS events they copy: RUNS' subject, without the source header
    (``as_published``)."""
    info = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.INFO.{name}", b"{}", timeout=10)).data)
    if "error" in info:
        return []
    state = info["state"]
    out = []
    for seq in range(int(state.get("first_seq", 0)) or 1, int(state.get("last_seq", 0)) + 1):
        reply = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.MSG.GET.{name}",
                                                      msgspec.json.encode({"seq": seq}), timeout=10)).data)
        msg = reply.get("message")
        if msg:
            stored = Stored(name, str(msg["subject"]), parse_headers(base64.b64decode(msg.get("hdrs") or "")),
                            base64.b64decode(msg.get("data") or ""))
            out.append(as_published(stored) if name in (HISTORY_STREAM, AUDIT_STREAM) else stored)
    return out


def as_published(m: Stored) -> Stored:
    """A HISTORY or AUDIT copy as its event was published to RUNS: RUNS' subject (``envelope.sourced``), every
    header but the server's source header (a publish carrying one is refused)."""
    origin = m.headers.get(SOURCE_HEADER)
    if origin is None:
        raise RuntimeError(f"{m.stream} message on {m.subject} has no {SOURCE_HEADER} header")
    subject, _ = sourced(origin, m.subject, 0)
    return Stored("RUNS", subject, {k: v for k, v in m.headers.items() if k != SOURCE_HEADER}, m.data)


def group(messages: list[Stored]) -> list[Template]:
    """The measured runs' messages by run: a message whose subject or body names a run id is that run's, an
    object chunk is the run's whose object metadata names its nuid, a submission-id key (its value a run id)
    gives the run's submission id. What names no measured run (the warm-up run, what a stack writes once, the
    workspace's base bundle) is left out."""
    runs: dict[bytes, Template] = {}
    chunk_owner: dict[bytes, Template] = {}
    for m in messages:
        if m.stream == "OBJ_evidence" and ".M." in m.subject:
            meta = msgspec.json.decode(m.data)
            found = RUN_ID.search(str(meta.get("name", "")).encode())
            if found:
                t = runs.setdefault(found.group(), Template(found.group()))
                nuid = str(meta["nuid"]).rsplit(".", 1)[-1].encode()
                t.nuids.append(nuid)
                chunk_owner[nuid] = t
    for m in messages:
        chunk = CHUNK.match(m.subject)
        if chunk:
            owner = chunk_owner.get(chunk.group(1).encode())
            if owner is not None:
                owner.messages.append(m)
            continue
        found = RUN_ID.search(m.subject.encode()) or RUN_ID.search(m.data)
        if found is None:
            continue
        t = runs.setdefault(found.group(), Template(found.group()))
        t.messages.append(m)
        if m.stream == "KV_submissions" and not m.subject.startswith("$KV.submissions.id."):
            t.submission_id = m.subject.rsplit(".", 1)[-1].encode()
    return [t for t in runs.values() if t.messages]


async def templates(url: str) -> list[Template]:
    """The measured runs of the store the server at ``url`` holds, each with every message it left in ``COPIED``."""
    nc = await nats.connect(url)
    try:
        return group([m for name in COPIED for m in await read_stream(nc, name)])
    finally:
        await nc.close()


def copy_of(t: Template) -> list[Copy]:
    """``t``'s messages with a new run id, submission id, nuids and message ids, each as long as the one it
    replaces, and no ``Nats-Expected-*`` header."""
    subs = {t.run_id: t.run_id[: -16] + secrets.token_hex(8).encode()}
    if t.submission_id:
        fresh = new_submission_id().encode()  # time-ordered, as the measured ones
        subs[t.submission_id] = fresh if len(fresh) == len(t.submission_id) else \
            secrets.token_hex(len(t.submission_id)).encode()[: len(t.submission_id)]
    for nuid in t.nuids:
        subs[nuid] = secrets.token_hex(len(nuid)).encode()[: len(nuid)]

    def sub(b: bytes) -> bytes:
        for old, new in subs.items():
            b = b.replace(old, new)
        return b

    out = []
    for m in t.messages:
        data = sub(m.data)
        subject = sub(m.subject.encode()).decode()
        if m.stream == "OBJ_evidence" and ".M." in subject:  # a metadata subject is its object's name in base64
            name = str(msgspec.json.decode(data)["name"])
            subject = "$O.evidence.M." + base64.urlsafe_b64encode(name.encode()).decode()
        headers = {}
        for key, value in m.headers.items():
            if key.startswith("Nats-Expected-"):
                continue
            if key == "Nats-Msg-Id":
                head, colon, tail = value.partition(":")
                value = secrets.token_urlsafe(len(head))[: len(head)] + colon + tail
            headers[key] = sub(value.encode()).decode()
        out.append((subject, headers, data))
    return out


async def publish(url: str, copies: Iterator[list[Copy]], *, window: int = 4000) -> tuple[int, int]:
    """Publish every copy, at most ``window`` unacknowledged; returns (messages published, refused by the
    server), the first refusal printed."""
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    acked = 0
    refused: list[bytes] = []

    async def on_ack(msg: Any) -> None:
        nonlocal acked
        acked += 1
        if b'"error"' in msg.data:
            refused.append(msg.data)

    await nc.subscribe(inbox + ".*", cb=on_ack)
    sent = 0
    for run in copies:
        for subject, headers, data in run:
            await nc.publish(subject, data, reply=f"{inbox}.{sent}", headers=headers or None)
            sent += 1
            while sent - acked > window:
                await asyncio.sleep(0.001)
    deadline = time.time() + 600
    while acked < sent and time.time() < deadline:
        await asyncio.sleep(0.05)
    await nc.close()
    if refused:
        print(f"  {len(refused)} copies refused, the first: {refused[0][:300]!r}")
    return sent, len(refused) + (sent - acked)


def server_conf(store: Path, port: int, prof_port: int) -> str:
    """The embedded stack's JetStream settings (``natsserver._conf``) with Go's profile port and without its users
    (a replica is published and read as the global account, where the stack's users live too)."""
    return (f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{store}"\n  max_file_store: 64G\n'
            f"  max_memory_store: 256M\n}}\nmax_payload: 8MB\nprof_port: {prof_port}\n")


@contextlib.contextmanager
def server(store: Path, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], int]]:
    """nats-server alone on ``store`` (a stack's ``nats/js``): yields its URL, its process and its profile port;
    stopped afterwards."""
    port, prof = free_port(), free_port()
    conf = store.parent / "replica.conf"
    conf.write_text(server_conf(store, port, prof))
    with open(log, "ab") as out:
        proc = subprocess.Popen([natsserver.binary(), "-c", str(conf)], stdout=out, stderr=out,
                                start_new_session=True)
    try:
        natsserver.wait_port(port, timeout=300)
        yield f"nats://127.0.0.1:{port}", proc, prof
    finally:
        proc.terminate()
        proc.wait(timeout=120)


async def subjects_held(url: str) -> int:
    """Once JetStream answers for every stream (it has recovered them): the subjects they hold in all."""
    nc = await nats.connect(url)
    try:
        deadline = time.time() + 300
        while True:
            try:
                names = msgspec.json.decode((await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=10)).data)
                total = 0
                for name in names["streams"] or []:
                    info = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.INFO.{name}", b"{}",
                                                                 timeout=30)).data)
                    total += int(info["state"].get("num_subjects", 0))
                return total
            except Exception:
                if time.time() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await nc.close()


# what a live allocation is for, by the first of these functions on its stack (any frame)
KINDS = (
    ("rebuildDedupe", "duplicate window re-read (message ids and the blocks loaded for them)"),
    ("storeMsgId", "duplicate window message ids"),
    ("recoverFullState", "per-subject index (psim)"),
    ("populateGlobalPerSubjectInfo", "per-subject index (psim)"),
    ("indexCacheBuf", "loaded blocks' per-subject state (fss)"),
    ("generatePerSubjectInfo", "loaded blocks' per-subject state (fss)"),
    ("getMsgBlockBuf", "loaded message blocks"),
    ("thw.", "per-message TTL wheel"),
    ("stree.", "subject trees, other"),
)


@dataclass
class HeapKind:
    """Live heap of one kind (``KINDS``), scaled for Go's sampling as pprof scales it."""

    kind: str
    objects: float = 0.0
    bytes: float = 0.0


def classify(frames: list[str]) -> str:
    for needle, kind in KINDS:
        if any(needle in f for f in frames):
            return kind
    return "other"


def records(text: str) -> list[tuple[int, int, list[str]]]:
    """(in-use objects, in-use bytes, functions innermost first) of each record of a text heap profile."""
    out: list[tuple[int, int, list[str]]] = []
    for block in text.split("\n")[1:]:
        if re.match(r"^\d+: \d+ \[", block):
            head = block.split("[", 1)[0].split(":")
            out.append((int(head[0]), int(head[1]), []))
        elif block.startswith("#\t") and out:
            parts = block.split()
            if len(parts) >= 3:
                out[-1][2].append(parts[2])
        elif block.startswith("# runtime.MemStats"):
            break
    return out


def by_kind(text: str) -> tuple[dict[str, int], list[HeapKind]]:
    """A text heap profile's MemStats figures and its live heap by kind, most first. Go samples one allocation per
    ``rate`` bytes on average (the header's ``heap/<2×rate>``), so each record is scaled by 1/(1-e^(-size/rate)), as
    pprof does."""
    first = text.split("\n", 1)[0]
    rate = int(first.rsplit("heap/", 1)[1]) / 2 if "heap/" in first else 512 * 1024
    stats = {}
    for line in text.splitlines():
        if line.startswith("# ") and " = " in line:
            key, value = line[2:].split(" = ", 1)
            if value.strip().isdigit():
                stats[key.strip()] = int(value)
    kinds: dict[str, HeapKind] = {}
    for objects, nbytes, frames in records(text):
        if objects == 0:
            continue
        scale = 1.0 / (1.0 - math.exp(-(nbytes / objects) / rate))
        kind = kinds.setdefault(classify(frames), HeapKind(classify(frames)))
        kind.objects += objects * scale
        kind.bytes += nbytes * scale
    return stats, sorted(kinds.values(), key=lambda k: -k.bytes)


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


@dataclass
class Restart:
    """nats-server restarted on a store: what it holds and what its memory is made of."""

    subjects: int
    rss_mb: float  # once every stream answered
    rss_later_mb: float  # 5 s later
    live_mb: float  # Go's HeapAlloc after a forced GC
    heap_sys_mb: float  # what Go holds for its heap, in use or not
    kinds: list[HeapKind]
    cpu_s: float  # the server's CPU from its start until every stream answered


def restart(store: Path, log: Path, *, later_s: float = 5.0) -> Restart:
    """nats-server alone restarted on ``store``: resident memory once every stream answered and ``later_s``
    later, then its heap profile after a forced GC."""
    with server(store, log) as (url, proc, prof):
        subjects = asyncio.run(subjects_held(url))
        first = rss_mb(proc.pid)
        times = psutil.Process(proc.pid).cpu_times()
        time.sleep(later_s)
        later = rss_mb(proc.pid)
        text = urllib.request.urlopen(f"http://127.0.0.1:{prof}/debug/pprof/heap?gc=1&debug=1",  # noqa: S310
                                      timeout=120).read().decode()
    stats, kinds = by_kind(text)
    return Restart(subjects, first, later, stats.get("HeapAlloc", 0) / 2**20, stats.get("HeapSys", 0) / 2**20,
                   kinds, times.user + times.system)


def attribute(store: Path, log: Path, names: tuple[str, ...] = ATTRIBUTED) -> dict[str, tuple[int, float]]:
    """Each store's share: (subjects, live heap MB) it takes, from restarts of nats-server without its directory
    (moved aside and back) against one with every store. The live heap of two restarts differs by a few MB
    besides (which blocks the server happened to load)."""
    streams = store / "jetstream" / "$G" / "streams"
    aside = store.parent / "aside"
    aside.mkdir(exist_ok=True)
    whole = restart(store, log, later_s=0.0)
    out: dict[str, tuple[int, float]] = {}
    for name in names:
        if not (streams / name).is_dir():
            continue
        shutil.move(str(streams / name), str(aside / name))
        try:
            without = restart(store, log, later_s=0.0)
        finally:
            shutil.move(str(aside / name), str(streams / name))
        out[name] = (whole.subjects - without.subjects, whole.live_mb - without.live_mb)
    return out


def measured(store: Path, log: Path) -> list[Template]:
    """The measured runs ``store`` holds (nats-server started on it to read them)."""
    with server(store, log) as (url, _proc, _prof):
        found = asyncio.run(templates(url))
    if not found:
        raise RuntimeError(f"no measured run (`store-…`) in {store}")
    return found


def add_copies(store: Path, log: Path, found: list[Template], start: int, count: int) -> float:
    """Publish copies ``start`` … ``start + count - 1`` of the measured runs (taken in turn) into ``store``, the
    services' durables on RUNS set aside meanwhile (``without_service_durables``) and RUNS drained by the feeds;
    returns the seconds it took. Raises when the server refused any, or RUNS did not drain in ``DRAIN_S``."""
    with server(store, log) as (url, _proc, _prof):
        t0 = time.time()

        async def copied() -> tuple[int, int]:
            async with without_service_durables(url):
                return await publish(url, (copy_of(found[i % len(found)]) for i in range(start, start + count)))

        sent, refused = asyncio.run(copied())
        if refused:
            raise RuntimeError(f"{refused} of {sent} copied messages were refused (see above)")
        return time.time() - t0


async def _runs_state(nc: Any) -> dict[str, Any]:
    state: dict[str, Any] = (await _api(nc, "$JS.API.STREAM.INFO.RUNS", {}))["state"]
    return state


@contextlib.asynccontextmanager
async def without_service_durables(url: str) -> Any:
    """The durables of RUNS other than the feeds deleted (their settings kept), and made again afterwards from the
    end of RUNS once the feeds took every event out of it (``DRAIN_S`` at most; printed as it goes): the copies
    are finished runs, which a running stack's durables would have acked, so none of them holds one."""
    nc = await nats.connect(url)
    try:
        names = (await _api(nc, "$JS.API.CONSUMER.NAMES.RUNS", {})).get("consumers") or []
        kept = {}
        for name in names:
            if name in FEED_DURABLES:
                continue
            kept[name] = (await _api(nc, f"$JS.API.CONSUMER.INFO.RUNS.{name}", {}))["config"]
            await _api(nc, f"$JS.API.CONSUMER.DELETE.RUNS.{name}", {})
        yield
        t0 = time.time()
        said = t0
        while True:
            state = await _runs_state(nc)
            held = int(state.get("messages", 0))
            if held == 0:
                break
            if time.time() - t0 > DRAIN_S:
                raise RuntimeError(f"RUNS still holds {held} events {DRAIN_S:.0f} s after the copies: the feeds "
                                   "did not take them")
            if time.time() - said > 60:
                print(f"  RUNS still holds {held:,} events, {time.time() - t0:.0f} s after the copies")
                said = time.time()
            await asyncio.sleep(2)
        print(f"  RUNS drained {time.time() - t0:.0f} s after the copies; {len(kept)} service durables made again "
              f"from sequence {int(state['last_seq']) + 1:,}")
        for name, config in kept.items():
            config = {**config, "deliver_policy": "by_start_sequence", "opt_start_seq": int(state["last_seq"]) + 1}
            await _api(nc, f"$JS.API.CONSUMER.CREATE.RUNS.{name}", {"stream_name": "RUNS", "config": config})
    finally:
        await nc.close()


async def _api(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = msgspec.json.decode((await nc.request(subject, msgspec.json.encode(body), timeout=60)).data)
    if "error" in reply:
        raise RuntimeError(f"{subject}: {reply['error']}")
    return reply
