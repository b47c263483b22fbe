"""What the bus stores per run, and what nats-server holds in memory over that history (issue 27).

The embedded stack (simulated pods, the one-queue platform of bench/pipeline.py) runs ``--runs`` trivial runs,
``--batch`` at a time, each batch waited for until every run is sealed (``evidence.sealed``). Then, from the
JetStream account (the bootstrap identity): the bytes every stream, KV bucket (``KV_<bucket>``) and object store
(``OBJ_<store>``) gained over the runs, divided by the runs, with messages and subjects per run beside them and
the mean header and body bytes of a message (``SAMPLED`` of what each gained); HISTORY and AUDIT (which keep the
run events by run, sourced from RUNS through their feeds: ``topology.FEEDS``) read back whole and split by event
type, each copy read as RUNS stored it (``envelope.sourced``; events, header and body bytes of each type a run:
where a cut pays). RUNS, an interest stream, keeps an event only until every durable whose filter matches it
acked it, the feeds among them: the figures are read once it drained (``DRAIN_S`` at most), and what it still
holds is printed by event type;
nats-server's resident memory with the stack up, and after a restart of nats-server alone over that history
(the stack's own configuration and store, every stream's info read once so that each is loaded).

Targets (issue 27): ≤ 10 KB stored per finished run, logs aside (the LOGS stream and the evidence's attempt
logs are a run's own output, counted but not held to it); nats-server ≤ 100 MB resident after a restart over
5,000 runs, ≤ 200 MB over 100,000. Exits 1 when a target is missed or a run did not seal. ``--runs 300`` gives
the per-run figures in a few minutes (they do not depend on the machine's load); the restart target is judged at
5,000.

``--replicate N`` (``bench/replica.py``) then copies the measured runs' stored messages, in a copy of the store,
until it holds N runs (a replica, printed as such: not N real runs), restarts nats-server alone on it, and prints
its resident memory and its live heap by kind from Go's heap profile; ``--replicate-wait`` restarts it again once
RUNS' 600 s duplicate window has passed (``--replicate-recent K`` copies published after that wait); the last
restart is the figure judged (the one after the window with ``--replicate-wait``, else the one right after the
copies, which read higher while RUNS kept every event), and ``--replicate-attribute`` the live heap each store
takes. The 200 MB target is judged on a replica of 100,000 or more. (The what-if ``--replicate-keyed-by-run``
measured run history kept one subject a run before it was built; it is the design built now, so the flag is
gone.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import psutil
import replica  # bench/ is this script's directory, first on sys.path
from pipeline import PLATFORM, RUN, simulated_stack, stack_up

from taugrid.bus.envelope import SOURCE_HEADER, run_of, sourced
from taugrid.client import open_client
from taugrid.core.ids import new_submission_id
from taugrid.stack import natsserver

PER_RUN_TARGET_B = 10 * 1024
RESTART_RSS_TARGET_MB = 100.0
RESTART_TARGET_RUNS = 5000  # the history the restart target is stated for
REPLICA_RSS_TARGET_MB = 200.0
REPLICA_TARGET_RUNS = 100_000


@dataclass
class Store:
    """One stream as the account reports it: bytes, messages and subjects held."""

    name: str
    bytes: int
    messages: int
    subjects: int
    last_seq: int = 0
    first_seq: int = 0

    @property
    def kind(self) -> str:
        return "kv" if self.name.startswith("KV_") else "object" if self.name.startswith("OBJ_") else "stream"

    @property
    def logs(self) -> bool:
        return self.name == "LOGS"


async def stores(nc: Any) -> dict[str, Store]:
    """Every stream's state, by the JetStream API itself (nats-py's StreamState has no ``num_subjects``)."""
    names = msgspec.json.decode((await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=10)).data)["streams"]
    out: dict[str, Store] = {}
    for name in names or []:
        info = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.INFO.{name}", b"{}", timeout=10)).data)
        st = info["state"]
        out[name] = Store(name, int(st.get("bytes", 0)), int(st.get("messages", 0)), int(st.get("num_subjects", 0)),
                          int(st.get("last_seq", 0)), int(st.get("first_seq", 0)))
    return out


SAMPLED = 200  # messages read back from what each stream gained, to split its bytes into headers and bodies


async def split(nc: Any, name: str, first: int, last: int) -> tuple[float, float]:
    """Mean header and body bytes of up to ``SAMPLED`` messages spread evenly over sequences ``first``..``last``
    of stream ``name`` (by the JetStream API's message get: a stream need not allow direct gets); (0, 0) when
    none could be read."""
    heads = bodies = n = 0
    step = max(1, (last - first + 1) // SAMPLED)
    for seq in range(max(1, first), last + 1, step):
        reply = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.MSG.GET.{name}",
                                                      msgspec.json.encode({"seq": seq}), timeout=10)).data)
        msg = reply.get("message")
        if not msg:
            continue  # removed (a KV key rewritten, a TTL)
        heads += len(base64.b64decode(msg.get("hdrs") or ""))
        bodies += len(base64.b64decode(msg.get("data") or ""))
        n += 1
    return (heads / n, bodies / n) if n else (0.0, 0.0)


# streams whose messages the runs gained are read back whole and counted by event type: the run history and the
# audit copies (what RUNS still holds once it drained, ``drained``, is read the same way)
BY_TYPE = ("HISTORY", "AUDIT")
DRAIN_S = 60.0  # how long RUNS is given to let its acked events go before the stores are read


def event_type(subject: str) -> str:
    """A run event's ``stage.outcome`` (``.high`` kept: a high-lane request is its own row), else the subject's
    first token."""
    tokens = subject.split(".")
    return ".".join(tokens[3:]) if tokens[0] == "run" and len(tokens) >= 5 else tokens[0]


async def by_type(nc: Any, name: str, first: int, last: int) -> dict[str, tuple[int, int, int]]:
    """Every message of stream ``name`` from ``first`` to ``last`` read back, by event type: (messages, header
    bytes, body bytes). What a run's events cost each, so that a cut is aimed at the largest. A copy HISTORY or
    AUDIT keeps (one subject a run) is typed by the subject RUNS stored it under, from its ``Nats-Stream-Source``
    header, whose bytes count in its headers. Each get asks for the next message at or after a sequence, so the
    gaps of an interest stream cost nothing."""
    out: dict[str, tuple[int, int, int]] = {}
    seq = max(1, first)
    while seq <= last:
        reply = msgspec.json.decode((await nc.request(f"$JS.API.STREAM.MSG.GET.{name}", msgspec.json.encode(
            {"seq": seq, "next_by_subj": ">"}), timeout=10)).data)
        msg = reply.get("message")
        if not msg or int(msg.get("seq", 0)) > last:
            break  # nothing at or after seq (or past the range)
        seq = int(msg["seq"]) + 1
        raw = base64.b64decode(msg.get("hdrs") or "")
        subject = str(msg.get("subject", ""))
        origin = replica.parse_headers(raw).get(SOURCE_HEADER) if raw else None
        if origin is not None:
            subject, _ = sourced(origin, subject, 0)
        kind = event_type(subject)
        n, heads, bodies = out.get(kind, (0, 0, 0))
        out[kind] = (n + 1, heads + len(raw), bodies + len(base64.b64decode(msg.get("data") or "")))
    return out


async def drained(nc: Any, timeout: float = DRAIN_S) -> tuple[Store, float]:
    """RUNS once it holds nothing (its durables and the feeds acked every event), or after ``timeout`` seconds:
    its state and the seconds waited."""
    t0 = time.time()
    while True:
        runs = (await stores(nc))["RUNS"]
        if runs.messages == 0 or time.time() - t0 > timeout:
            return runs, time.time() - t0
        await asyncio.sleep(1.0)


def gained(before: dict[str, Store], after: dict[str, Store]) -> list[tuple[Store, int, int, int]]:
    """Each store that changed between two readings, most bytes gained first: (its state after, bytes, messages
    and subjects gained)."""
    out = []
    for name, s in after.items():
        b = before.get(name, Store(name, 0, 0, 0))
        if s.bytes != b.bytes or s.messages != b.messages:
            out.append((s, s.bytes - b.bytes, s.messages - b.messages, s.subjects - b.subjects))
    return sorted(out, key=lambda g: -g[1])


async def evidence_log_bytes(js: Any) -> int:
    """Bytes the evidence store holds for attempt logs (``runs/<run>/attempt-<n>.log``): a run's own output."""
    total = 0
    try:
        obs = await js.object_store("evidence")
        for info in await obs.list():
            if info.name.endswith(".log"):
                total += int(info.size or 0)
    except Exception as exc:  # noqa: BLE001 - an empty store raises; a figure we cannot read is said so
        print(f"evidence log objects not counted: {exc!r}", file=sys.stderr)
    return total


def nats_rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


async def drive(url: str, data: Path, runs: int, batch: int, timeout: float) -> dict[str, Any]:
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    client = await open_client(url, creds=state["user_creds"])
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    js = admin.bus.js
    sealed: set[str] = set()
    changed = asyncio.Event()

    async def on_sealed(msg: Any) -> None:
        sealed.add(run_of(msg))
        changed.set()

    await admin.bus.nc.subscribe("run.*.*.evidence.sealed", cb=on_sealed)
    text = RUN.format(name="store")
    # one warm-up run, so that what every stack writes once (platform, service keys, first-use state) is not
    # counted against the runs
    warm = await client.submit_text(RUN.format(name="warmup"), workspace="bench", submission_id=new_submission_id(),
                                    name="warmup")
    await _until(lambda: warm in sealed, changed, timeout)
    await asyncio.sleep(2.0)
    before = await stores(admin.bus.nc)
    log_before = await evidence_log_bytes(js)
    started: list[str] = []
    t0 = time.time()
    for i in range(0, runs, batch):
        ids = await asyncio.gather(*(client.submit_text(text, workspace="bench", submission_id=new_submission_id(),
                                                        name="store") for _ in range(min(batch, runs - i))))
        started.extend(ids)
        await _until(lambda ids=ids: all(r in sealed for r in ids), changed, timeout)
        print(f"  {len(started)} runs submitted, {sum(1 for r in started if r in sealed)} sealed, "
              f"{time.time() - t0:.0f} s", file=sys.stderr)
    await asyncio.sleep(3.0)  # projections and the last acks settle
    runs_left, drain_s = await drained(admin.bus.nc)
    after = await stores(admin.bus.nc)
    splits = {s.name: await split(admin.bus.nc, s.name, before.get(s.name, Store(s.name, 0, 0, 0)).last_seq + 1,
                                  s.last_seq) for s, *_ in gained(before, after)}
    types = {name: await by_type(admin.bus.nc, name, before.get(name, Store(name, 0, 0, 0)).last_seq + 1,
                                 after[name].last_seq) for name in BY_TYPE if name in after}
    # what RUNS still holds, whoever's run it is (the warm-up's included): nothing once every durable acked
    runs_held = await by_type(admin.bus.nc, "RUNS", runs_left.first_seq, runs_left.last_seq) \
        if runs_left.messages else {}
    log_after = await evidence_log_bytes(js)
    nats_pid = int(msgspec.json.decode((data / "stack.json").read_bytes())["nats_pid"])
    rss_up = nats_rss_mb(nats_pid)
    times = psutil.Process(nats_pid).cpu_times()
    await client.close()
    await admin.close()
    return {"before": before, "after": after, "splits": splits, "types": types, "evidence_logs": log_after - log_before,
            "rss_up": rss_up, "nats_cpu_s": times.user + times.system,
            "runs_left": runs_left, "drain_s": drain_s, "runs_held": runs_held,
            "started": len(started), "sealed": sum(1 for r in started if r in sealed), "wall_s": time.time() - t0}


async def _until(done: Any, changed: asyncio.Event, timeout: float) -> bool:
    deadline = time.time() + timeout
    while not done():
        if time.time() > deadline:
            return False
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=1.0)
    return True


async def restarted_rss(data: Path) -> tuple[float, float]:
    """nats-server alone on the stack's store and configuration: resident MB once every stream's info was read
    (each stream loaded), and again 5 s later."""
    proc, port = natsserver.start(data / "nats", auth_conf=data / "nats" / "auth.conf",
                                  log_file=data / "nats-restart.log")
    try:
        admin = await open_client(f"nats://127.0.0.1:{port}", creds=data / "creds" / "bootstrap.nk")
        try:
            deadline = time.time() + 120
            while True:  # JetStream answers once it has recovered every stream
                try:
                    await stores(admin.bus.nc)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            first = nats_rss_mb(proc.pid)
            await asyncio.sleep(5.0)
            await stores(admin.bus.nc)
            return first, nats_rss_mb(proc.pid)
        finally:
            await admin.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def print_restart(label: str, r: replica.Restart) -> None:
    print(f"  {label:<42}{r.rss_mb:8.1f} → {r.rss_later_mb:.1f} 5 s later; {r.subjects:,} subjects; "
          f"live heap after a GC {r.live_mb:.1f} (Go's heap {r.heap_sys_mb:.1f}); CPU to recover {r.cpu_s:.1f} s")
    for kind in r.kinds[:6]:
        print(f"      {kind.bytes / 2**20:8.1f} MB  {kind.kind}")


def replicated(data: Path, runs: int, *, wait: bool, recent: int, attribute: bool) -> bool:
    """A replica of the measured runs up to ``runs`` (bench/replica.py) in a copy of the store, nats-server
    restarted on it; True unless the 200 MB target is judged and missed."""
    store = data / "replica" / "js"
    shutil.copytree(data / "nats" / "js", store)
    log = data / "replica" / "nats.log"
    print(f"\nreplica (not real runs): the measured runs' stored messages copied up to {runs:,} runs, every store "
          "a run keeps, the run events published to RUNS and kept by HISTORY's and AUDIT's feeds "
          "(bench/replica.py says what a copy changes)")
    found = replica.measured(store, log)
    copies = max(0, runs - len(found))
    first = max(0, copies - recent) if wait else copies
    spent = replica.add_copies(store, log, found, 0, first)
    restarts = [("restart right away (every copy in the 600 s window)", replica.restart(store, log))]
    if wait:
        print(f"  waiting {replica.WINDOW_S:.0f} s for RUNS' duplicate window to pass", file=sys.stderr)
        with replica.server(store, log):  # up meanwhile, as a real one: TTLs expire (the purge markers' 600 s)
            time.sleep(replica.WINDOW_S + 5)
        spent += replica.add_copies(store, log, found, first, copies - first)
        restarts.append((f"restart after the window ({copies - first} copies since)", replica.restart(store, log)))
    print(f"nats-server resident memory (MB) over the replica ({copies:,} copies of {len(found)} runs, {spent:.0f} s "
          f"publishing and feeding; GOMEMLIMIT={os.environ.get('GOMEMLIMIT', 'unset')})")
    for label, r in restarts:
        print_restart(label, r)
    if attribute:
        print("  live heap each store takes (restarted without it):")
        for name, (subjects, mb) in replica.attribute(store, log).items():
            print(f"    {name:<18}{subjects / runs:6.2f} subjects a run  {mb:7.1f} MB  "
                  f"({mb * 2**20 / max(1, subjects):.0f} B a subject)")
    judged = runs >= REPLICA_TARGET_RUNS
    final = restarts[-1][1]
    ok = final.rss_later_mb <= REPLICA_RSS_TARGET_MB or not judged
    print(f"  target ≤ {REPLICA_RSS_TARGET_MB:g} MB after a restart over {REPLICA_TARGET_RUNS:,} runs: "
          + (("ok" if ok else "MISSED") + f" ({final.rss_later_mb:.1f} MB, a replica)" if judged
             else f"not judged ({runs:,} runs: {final.rss_later_mb:.1f} MB)"))
    return ok


def print_types(kinds: dict[str, tuple[int, int, int]], n: int) -> None:
    """One row an event type, most bytes first: events, header and body bytes a message, and both over ``n``."""
    for kind, (count, heads, bodies) in sorted(kinds.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"    {kind:<32}{count / n:8.2f}{heads / max(1, count):11.0f}{bodies / max(1, count):9.0f}"
              f"{(heads + bodies) / n:10.0f}")


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=RESTART_TARGET_RUNS, help="runs to store")
    ap.add_argument("--batch", type=int, default=250, help="runs submitted at once, each batch waited for")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for one batch to seal")
    ap.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    ap.add_argument("--replicate", type=int, default=0, metavar="N",
                    help="then a replica of the measured runs up to N runs, nats-server restarted on it")
    ap.add_argument("--replicate-wait", action="store_true",
                    help="restart the replica again once RUNS' 600 s duplicate window has passed (judged)")
    ap.add_argument("--replicate-recent", type=int, default=0, metavar="K",
                    help="with --replicate-wait, copies published after the wait (recent traffic)")
    ap.add_argument("--replicate-attribute", action="store_true",
                    help="the live heap each store of the replica takes (a restart without each)")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-storage-")
    with stack_up(data, env, tau, PLATFORM, keep=True) as url:
        got = asyncio.run(drive(url, data, args.runs, args.batch, args.timeout))
    disk = disk_bytes(data / "nats")
    rss_first, rss_later = asyncio.run(restarted_rss(data))

    n = max(1, got["started"])
    print(f"\ntaugrid storage bench: {got['started']} runs, {got['sealed']} sealed in {got['wall_s']:.0f} s; "
          "simulated pods, bytes the bus gained per run (JetStream account info)")
    print(f"  {'store':<22}{'kind':<8}{'B/run':>10}{'msgs/run':>10}{'subjects/run':>14}"
          f"{'headers/msg':>13}{'body/msg':>10}")
    total = logs = 0.0
    for s, nbytes, messages, subjects in gained(got["before"], got["after"]):
        per = nbytes / n
        total += per
        logs += per if s.logs else 0.0
        head, body = got["splits"].get(s.name, (0.0, 0.0))
        print(f"  {s.name:<22}{s.kind:<8}{per:10.0f}{messages / n:10.2f}{subjects / n:14.2f}{head:13.0f}{body:10.0f}"
              + ("   (logs)" if s.logs else ""))
    for name, kinds in got["types"].items():
        print(f"  {name} by event type, a run: {'events':>8}{'headers B':>11}{'body B':>9}{'stored B':>10}"
              "   (headers and body a message; stored: both, a run)")
        print_types(kinds, n)
    left: Store = got["runs_left"]
    print(f"  RUNS after {got['drain_s']:.0f} s (at most {DRAIN_S:.0f}): {left.messages} events, {left.bytes} B, "
          f"{left.subjects} subjects still held" + (" (drained)" if not left.messages else ", by event type, all of "
                                                     "them (headers and body a message; stored: both, in all):"))
    print_types(got["runs_held"], 1)
    ev_logs = got["evidence_logs"] / n
    stored = total - logs - ev_logs
    print(f"  {'all stores':<30}{total:10.0f} B/run; logs {logs:.0f} (LOGS) + {ev_logs:.0f} (evidence attempt logs)")
    ok = got["sealed"] == got["started"]
    ok_bytes = stored <= PER_RUN_TARGET_B
    print(f"  {'stored per run, logs aside':<30}{stored:10.0f} B     target ≤ {PER_RUN_TARGET_B} B  "
          + ("ok" if ok_bytes else "MISSED"))
    print(f"  on disk: {disk / 2**20:.1f} MB in all ({disk / n:.0f} B/run, the stack's first state included)")
    limit = os.environ.get("GOMEMLIMIT", "unset")  # the stack's nats-server inherits it (natsserver.start)
    print(f"nats-server resident memory (MB; Go's soft memory limit GOMEMLIMIT={limit})")
    print(f"  with the stack up, after the runs         {got['rss_up']:8.1f}   "
          f"(its CPU since it started: {got['nats_cpu_s']:.0f} s)")
    judged = got["started"] >= RESTART_TARGET_RUNS
    ok_rss = rss_later <= RESTART_RSS_TARGET_MB or not judged
    print(f"  after a restart over that history         {rss_first:8.1f} → {rss_later:.1f} 5 s later     "
          f"target ≤ {RESTART_RSS_TARGET_MB:g} MB over {RESTART_TARGET_RUNS} runs  "
          + (("ok" if ok_rss else "MISSED") if judged else f"(not judged: {got['started']} runs)"))
    ok_replica = True
    try:
        if args.replicate:
            ok_replica = replicated(data, args.replicate, wait=args.replicate_wait, recent=args.replicate_recent,
                                    attribute=args.replicate_attribute)
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(data)], check=False)
        else:
            print(f"data directory kept: {data}")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    sys.exit(0 if ok and ok_bytes and ok_rss and ok_replica else 1)


if __name__ == "__main__":
    main()
