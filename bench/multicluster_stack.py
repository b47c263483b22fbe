"""Many clusters through the whole pipeline (issue 28 item 5): `tau up --platform` with ``--sites`` local clusters
(10), each behind its own leaf nats-server with simulated pods, the dispatcher in front of them; ``--runs`` runs
(2000) submitted as fast as one client can, each a simulated pod of ``--duration`` seconds (60: a run the records
show running at the cut still runs when the loss is declared, the records lagging behind the sites). Once half are
submitted and ``site-0`` runs ``--cut-when`` (20) of them, ``site-0`` (every site has preference 0, so it is
nominated for every run) is cut: its server frozen (SIGSTOP: its link and its lease renewals stop while its local
cluster process runs on) for ``--cut-for`` seconds (30), past ``dispatch.worker_lost_timeout``
(``--lost-timeout``, 10 s), then let go (SIGCONT).

It exits 0 only when every run was sealed, each with exactly one terminal event (``exec.succeeded``) and one
``evidence.sealed``; no run ended at the cut cluster after it was declared lost; each run's last
``dispatch.chosen`` names the cluster its record says; and at least one run was requeued (a ``dispatch.withdrawn``
saying the cluster was lost) when the cut caught runs there. Printed: the runs each cluster ended, the runs
requeued, submit → chosen and submit → sealed percentiles, the time to seal everything after the cut, and the
capacity records the sites wrote to the hub (each writes its own when it changed, at most once a lease period).

    .venv/bin/python bench/multicluster_stack.py [--sites 10] [--runs 2000] [--mode AllAtOnce|Incremental]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import msgspec
from pipeline import one_queue_platform, pct  # bench/ is on sys.path

from taugrid.bus import sitecapacity
from taugrid.bus.replay import batches
from taugrid.client import Client, open_client
from taugrid.core.contracts import DispatchStep
from taugrid.core.ids import new_submission_id

RUN = ("name: {name}\nentrypoint: sim.py\ncompute: {{gpus: 0, cpu_request: '10m', memory_request: 1Mi}}\n"
       "runtime: {{env: {{SIMULATED_DURATION: '{duration}'}}}}\n")
TERMINAL = ("exec.succeeded", "exec.failed", "recovery.gave_up", "submit.rejected", "policy.rejected",
            "exec.cancelled")
VICTIM = "site-0"


def platform(sites: int, mode: str, lost_timeout: float) -> str:
    clusters = "".join(f"  - {{name: site-{i}, backend: local}}\n" for i in range(sites))
    dispatch = f"dispatch: {{mode: {mode}, worker_lost_timeout: {lost_timeout:g}"
    dispatch += ", incremental_step: 3, round_timeout: 10}\n" if mode == "Incremental" else "}\n"
    return one_queue_platform("bench") + "clusters:\n" + clusters + dispatch


def tau_command() -> list[str]:
    tau_bin = Path(sys.executable).parent / "tau"
    return [str(tau_bin)] if tau_bin.exists() else [sys.executable, "-m", "taugrid.cli.main"]


async def _holding(client: Client, cluster: str, *, at_least: int, timeout: float) -> None:
    """Until ``cluster`` runs ``at_least`` runs (their records say so), or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(r.cluster == cluster and r.state == "running" for r in await client.list()) >= at_least:
            return
        await asyncio.sleep(0.5)


async def burst(data: Path, args: argparse.Namespace) -> dict[str, object]:
    state = json.loads((data / "stack.json").read_text())
    victim_pid = next(s["nats_pid"] for s in state["sites"] if s["name"] == VICTIM)
    client = await open_client(state["nats_url"], max_reconnect_attempts=-1)
    ids: list[str] = []
    cut_at = restored_at = 0.0
    started = time.monotonic()
    try:
        for i in range(args.runs):
            name = f"mc{i}"
            ids.append(await client.submit_text(RUN.format(name=name, duration=args.duration), workspace="bench",
                                                submission_id=new_submission_id(), name=name))
            if i == args.runs // 2:  # mid-run: once the victim runs some of them
                await _holding(client, VICTIM, at_least=args.cut_when, timeout=args.timeout / 4)
                os.kill(victim_pid, signal.SIGSTOP)
                cut_at = time.monotonic()
            if cut_at and not restored_at and time.monotonic() - cut_at > args.cut_for:
                os.kill(victim_pid, signal.SIGCONT)
                restored_at = time.monotonic()
        submitted_s = time.monotonic() - started
        pending, deadline = set(ids), time.monotonic() + args.timeout
        while pending and time.monotonic() < deadline:
            if cut_at and not restored_at and time.monotonic() - cut_at > args.cut_for:
                os.kill(victim_pid, signal.SIGCONT)
                restored_at = time.monotonic()
            records = {r.run_id: r for r in await client.list()}
            pending = {run for run in pending if not (records.get(run) and records[run].evidence_digest)}
            if pending:
                await asyncio.sleep(2.0)
        sealed_s = time.monotonic() - cut_at
        if not restored_at:
            os.kill(victim_pid, signal.SIGCONT)
        events: dict[str, list[tuple[str, float, dict[str, object]]]] = defaultdict(list)
        async for batch in batches(client.bus, "run.bench.>"):
            for ev in batch:
                step = msgspec.to_builtins(ev.payload(DispatchStep)) if ev.type.startswith("dispatch.") else {}
                events[ev.subject].append((ev.type, ev.happened, step))
        records = {r.run_id: r for r in await client.list()}
        capacity_writes = await sitecapacity.writes(client.bus)
    finally:
        await client.close()
    return {"ids": ids, "events": events, "records": records, "never_sealed": sorted(pending),
            "submitted_s": submitted_s, "sealed_after_cut_s": sealed_s, "capacity_writes": capacity_writes}


def judge(result: dict[str, object], args: argparse.Namespace) -> bool:
    ids: list[str] = result["ids"]  # type: ignore[assignment]
    events: dict[str, list[tuple[str, float, dict[str, object]]]] = result["events"]  # type: ignore[assignment]
    records = result["records"]
    wrong, mismatched, requeued = [], [], []
    ended: Counter[str] = Counter()
    to_chosen, to_sealed = [], []
    for run in ids:
        evs = events.get(run, [])
        types = [t for t, _, _ in evs]
        if [t for t in types if t in TERMINAL] != ["exec.succeeded"] or types.count("evidence.sealed") != 1:
            wrong.append((run, types))
            continue
        chosen = [d.get("clusters", [""])[0] for t, _, d in evs if t == "dispatch.chosen"]
        record = records.get(run)  # type: ignore[attr-defined]
        if not chosen or record is None or record.cluster != chosen[-1]:
            mismatched.append((run, chosen, record.cluster if record else None))
        if any(t == "dispatch.withdrawn" and "lost" in str(d.get("reason", "")) for t, _, d in evs):
            requeued.append(run)
            if chosen and chosen[-1] == VICTIM:
                mismatched.append((run, chosen, "ended at the lost cluster"))
        ended[chosen[-1] if chosen else "?"] += 1
        submitted = next(at for t, at, _ in evs if t == "submit.requested")
        to_chosen.append(next(at for t, at, _ in reversed(evs) if t == "dispatch.chosen") - submitted)
        to_sealed.append(next(at for t, at, _ in evs if t == "evidence.sealed") - submitted)
    never = result["never_sealed"]
    ok = not never and not wrong and not mismatched and len(set(ids)) == args.runs and bool(requeued)
    total = max(1, sum(ended.values()))
    print(f"{args.sites} clusters ({args.mode}), {args.runs} runs of {args.duration:g} s, {VICTIM} cut for "
          f"{args.cut_for:g} s after {args.runs // 2 + 1} submissions (worker_lost_timeout {args.lost_timeout:g} s)")
    print(f"  submitted in {result['submitted_s']:.1f} s; all sealed {result['sealed_after_cut_s']:.1f} s after "
          f"the cut; {len(requeued)} run(s) requeued off {VICTIM}")
    print(f"  site capacity records written: {result['capacity_writes']} "
          f"({int(str(result['capacity_writes'])) / max(1, args.runs):.2f} a run, every site together)")
    print("  ended per cluster: " + ", ".join(f"{c} {n} ({100 * n / total:.0f} %)" for c, n in sorted(ended.items())))
    if to_chosen:
        print(f"  submit → chosen p50 {pct(to_chosen, 50):.1f} s, p95 {pct(to_chosen, 95):.1f} s; submit → sealed "
              f"p50 {pct(to_sealed, 50):.1f} s, p95 {pct(to_sealed, 95):.1f} s")
    for run in list(never)[:5]:  # type: ignore[call-overload]
        print(f"  never sealed: {run}")
    for run, types in wrong[:5]:
        print(f"  not exactly one end: {run}: {types}")
    for item in mismatched[:5]:
        print(f"  chosen/record mismatch: {item}")
    print("→ ok" if ok else "→ MISS")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds each simulated run lasts")
    ap.add_argument("--mode", choices=["AllAtOnce", "Incremental"], default="AllAtOnce")
    ap.add_argument("--lost-timeout", type=float, default=10.0, help="dispatch.worker_lost_timeout, seconds")
    ap.add_argument("--cut-for", type=float, default=30.0, help="seconds the cut cluster stays frozen")
    ap.add_argument("--cut-when", type=int, default=20, help="runs running at the cut cluster before it is cut")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for every run to be sealed")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs)")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="tau-bench-multicluster-"))
    env = {**os.environ, "TAU_DATA_DIR": str(data), "TAU_OPERATOR_DIR": str(data / "operator")}
    env.pop("TAU_NATS_URL", None)
    os.environ.update({"TAU_DATA_DIR": str(data)})  # this process's client finds the stack and its user there
    os.environ.pop("TAU_NATS_URL", None)
    (data / "platform.yaml").write_text(platform(args.sites, args.mode, args.lost_timeout))
    tau = tau_command()
    up = subprocess.run([*tau, "up", "--platform", str(data / "platform.yaml"), "--timeout", "600"], env=env,
                        capture_output=True, text=True)
    if up.returncode != 0:
        print(f"tau up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        sys.exit(1)
    try:
        ok = judge(asyncio.run(burst(data, args)), args)
    finally:
        subprocess.run([*tau, "down"], env=env, capture_output=True)
        if args.keep:
            print(f"data directory kept: {data}")
        else:
            subprocess.run(["rm", "-rf", str(data)], check=False)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
