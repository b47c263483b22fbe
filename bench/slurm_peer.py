"""Slurm beside taugrid in one run: the same tiny Python job on a private single-node Slurm and on the embedded
stack, start times stamped by the jobs themselves.

Slurm (Debian's ``slurm-wlm``) runs privately in a temp dir: its own munge key and munged, a slurm.conf with one
node, ``localhost``, declaring 64 CPUs (as taugrid's ClusterQueue has a 64-CPU quota; the real cores are shared
by both), one partition, select/cons_tres with CR_Core, proctrack/linuxproc, task/none, free ports, and
otherwise Slurm's default configuration (scheduler sched/backfill with its default parameters, unless
``--scheduler-parameters`` is given, which is printed). slurmctld, slurmd and munged are stopped and the dir
removed at the end, on failure too. taugrid runs as ``tau up`` in a temp data dir with real processes (not
TAU_LOCAL_SIMULATE), a platform of one ClusterQueue with a 64-CPU quota, 1-CPU runs whose entrypoint is the
job script in a small project directory (snapshot uploaded as by ``tau run``). Slurm runs first and is stopped
before taugrid starts, so neither loads the machine while the other is measured.

The job, on both: its first statement stamps ``time.time()``, which it appends to a file named by its job id
(``SLURM_JOB_ID`` / ``TAU_RUN_ID``); both run it with the same interpreter. How each submits, printed at the
start with Slurm's whole slurm.conf: Slurm, one ``sbatch --parsable --job-name=peer --ntasks=1 --cpus-per-task=1
--output=/dev/null --chdir=<project> --export=ALL,BENCH_STAMPS=<dir> <project>/job.py`` process per job;
taugrid, one ``Client.submit`` of the project's tau.yaml per job through one client; on both, at most
``--submit-concurrency`` (32) submissions in flight at once (the same for both). Figures, each side:
- burst: N jobs (``--burst``, 300) submitted as fast as that concurrency allows: jobs/s = N / (last start -
  first submit), the time to all started and the time to all submitted; for Slurm also the median time from
  submit to slurmctld's allocation, from allocation to slurmd's launch and from launch to the job's first
  statement (from its logs: where its time goes)
- idle: M jobs (``--idle``, 20) one at a time, each waited for to finish: submit → start p50 and p99 (with 20
  jobs p99 is the slowest)
Every job submitted counts: one that never starts counts with its wait until the bench gave up.

Exits 1 when taugrid is not ahead of Slurm on burst jobs/s or idle p99, when a taugrid run was lost (never
started or never succeeded), or when the Slurm side did not complete (the comparison would not be valid).
When Slurm is not installed (or ``--install`` could not install it) the bench says so and exits 2: no
comparison ran, so "ahead of Slurm" was not shown and the bench must not pass. With ``--install``, run as root
where apt-get exists, it installs ``slurm-wlm`` (``apt-get install --no-install-recommends``) and goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import psutil
from pipeline import (  # bench/ is this script's directory, first on sys.path
    Watch,
    one_queue_platform,
    pct,
    simulated_stack,
    stack_up,
)

from taugrid.client import open_client
from taugrid.core.ids import new_submission_id

SLURM_TOOLS = ("sbatch", "squeue", "sinfo", "scontrol", "slurmctld", "slurmd", "munged")
# The job itself, the same text on both systems; the first statement takes the start time.
JOB = """import time; started = time.time()
import os
job = os.environ.get("TAU_RUN_ID") or os.environ["SLURM_JOB_ID"]
with open(os.path.join(os.environ["BENCH_STAMPS"], job), "a") as f:
    f.write(repr(started) + "\\n")
"""
TAU_RUN = ("name: peer\nentrypoint: main.py\ncompute: {gpus: 0, cpu_request: '1', memory_request: 1Mi}\n"
           "runtime: {env: {BENCH_STAMPS: '%(stamps)s'}}\n")
SLURM_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
               "BOOT_FAIL", "DEADLINE"}


# ---------------------------------------------------------------- a private Slurm
def slurm_conf(root: Path, *, ctld_port: int, slurmd_port: int, munge_socket: Path, cpus: int = 64,
               scheduler_parameters: str = "") -> str:
    """slurm.conf for one node, ``localhost``, declaring ``cpus`` CPUs (config_overrides: slurmd reports the
    declared CPUs, not the real ones), every state, spool, pid and log file under ``root``; otherwise defaults."""
    lines = [
        "ClusterName=taubench",
        "SlurmctldHost=localhost",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
    ]
    if scheduler_parameters:
        lines.append(f"SchedulerParameters={scheduler_parameters}")
    lines += [
        f"NodeName=localhost CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 "
        "RealMemory=1000 State=UNKNOWN",
        "PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_missing() -> list[str]:
    return [t for t in SLURM_TOOLS if not shutil.which(t)]


def install_slurm() -> str:
    """Install Debian's slurm-wlm (munge comes with it); "" on success, else why not."""
    if os.geteuid() != 0:
        return "not running as root"
    if not shutil.which("apt-get"):
        return "no apt-get on this machine"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("installing slurm-wlm: apt-get update && apt-get install -y --no-install-recommends slurm-wlm", flush=True)
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "slurm-wlm"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            return f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"
    missing = slurm_missing()
    return f"installed, but still missing {', '.join(missing)}" if missing else ""


@dataclass
class LocalSlurm:
    """munged, slurmctld and slurmd in the foreground of processes this bench owns, all under ``root``."""

    root: Path
    cpus: int = 64
    scheduler_parameters: str = ""
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def start(self, timeout: float = 120) -> None:
        munge = self.root / "munge"
        for d in (self.root, munge, munge / "run"):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)  # munged wants its socket's directory reachable by every client
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        sock = munge / "run" / "munge.sock"
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={munge / 'run' / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}"])
        self._wait(lambda: sock.exists(), timeout, "munged never created its socket")
        (self.root / "slurm.conf").write_text(slurm_conf(
            self.root, ctld_port=free_port(), slurmd_port=free_port(), munge_socket=sock, cpus=self.cpus,
            scheduler_parameters=self.scheduler_parameters))
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._spawn("slurmd", ["slurmd", "-D"])
        self._wait(lambda: self.node_state() == "idle", timeout, "the node never became idle")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append((name, subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True)))

    def _wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while not done():
            dead = [n for n, p in self.procs if p.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"Slurm did not start: {what}; {', '.join(dead) or 'none'} exited\n"
                                   + self.log_tail())
            time.sleep(0.2)

    def scheduler(self) -> str:
        """Slurm's own account of its scheduler settings (``scontrol show config``)."""
        proc = subprocess.run(["scontrol", "show", "config"], env=self.env, capture_output=True, text=True)
        keys = ("SchedulerType", "SchedulerParameters", "SelectType ", "SelectTypeParameters")
        found = [" ".join(ln.split()) for ln in proc.stdout.splitlines() if ln.startswith(keys)]
        return "; ".join(found) or "unknown"

    def node_state(self) -> str:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self) -> None:
        if any(n == "slurmctld" and p.poll() is None for n, p in self.procs):
            subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=30)
        for name, p in reversed(self.procs):  # slurmd and slurmctld before munged, which they talk through
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop on SIGTERM; killing it", file=sys.stderr)
                p.kill()
                p.wait(timeout=15)
        self.procs.clear()
        self.kill_strays()

    def kill_strays(self) -> None:
        """slurmstepd detaches from slurmd and outlives it while its job runs (then retries its completion RPC
        for ever): stop the ones of this Slurm, known by the SLURM_CONF they inherited from our slurmd."""
        mine = f"SLURM_CONF={self.root / 'slurm.conf'}"
        for proc in psutil.process_iter(["name"]):
            try:
                if proc.info["name"] == "slurmstepd" and mine in "\n".join(
                        f"{k}={v}" for k, v in proc.environ().items()):
                    print(f"stopping a stray slurmstepd (pid {proc.pid})", file=sys.stderr)
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    @staticmethod
    def sbatch_argv(script: Path, stamps: Path) -> list[str]:
        """How every job is submitted: one batch script, one task on one CPU, its output discarded."""
        return ["sbatch", "--parsable", "--job-name=peer", "--ntasks=1", "--cpus-per-task=1", "--output=/dev/null",
                f"--chdir={script.parent}", f"--export=ALL,BENCH_STAMPS={stamps}", str(script)]

    async def sbatch(self, script: Path, stamps: Path) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self.sbatch_argv(script, stamps), env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed ({proc.returncode}): {err.decode().strip()}")
        return out.decode().strip().split(";")[0]

    async def job_states(self) -> dict[str, str]:
        """Every job slurmctld still holds (finished ones stay for MinJobAge, 300 s by default): id → state."""
        proc = await asyncio.create_subprocess_exec(
            "squeue", "-h", "-t", "all", "-o", "%i %T", env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return dict(ln.split(None, 1) for ln in out.decode().splitlines() if " " in ln.strip())

    async def job_state(self, job: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            "squeue", "-h", "-t", "all", "-j", job, "-o", "%T", env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return out.decode().strip()


def slurm_phases(log_dir: Path, side: Side) -> dict[str, float]:
    """Where Slurm's burst time went, from its own logs: the median seconds from a job's submit to slurmctld's
    ``sched: Allocate JobId=N``, from that to slurmd's ``Launching batch job N``, and from that to the job's own
    start stamp (NaN where a log has no line for the jobs). The logs' times are local and to the millisecond."""
    def stamped(path: Path, pattern: str) -> dict[str, float]:
        found: dict[str, float] = {}
        text = path.read_text(errors="replace") if path.exists() else ""
        for at, job in re.findall(r"^\[([0-9T:.-]+)\] " + pattern, text, flags=re.M):
            found.setdefault(job, dt.datetime.fromisoformat(at).timestamp())
        return found

    allocated = stamped(log_dir / "slurmctld.log", r"sched: Allocate JobId=(\d+) ")
    launched = stamped(log_dir / "slurmd.log", r"Launching batch job (\d+) ")
    jobs = dict(side.burst_submitted)

    def median(pairs: list[tuple[float | None, float | None]]) -> float:
        gaps = sorted(b - a for a, b in pairs if a is not None and b is not None)
        return gaps[len(gaps) // 2] if gaps else float("nan")

    return {
        "submit → allocated": median([(jobs[j], allocated.get(j)) for j in jobs]),
        "allocated → launched": median([(allocated.get(j), launched.get(j)) for j in jobs]),
        "launched → started": median([(launched.get(j), side.burst_started.get(j)) for j in jobs]),
    }


# ---------------------------------------------------------------- shared measurement
@dataclass
class Side:
    """One system's figures: every job submitted, when, and when it started (None: never)."""

    name: str
    burst_submitted: list[tuple[str, float]] = field(default_factory=list)
    burst_started: dict[str, float] = field(default_factory=dict)
    burst_gave_up: float = 0.0
    burst_submit_s: float = float("nan")  # from the first submission sent to the last one answered
    idle_ms: list[float] = field(default_factory=list)
    idle_lost: int = 0
    failed: int = 0  # jobs that started but did not end well (Slurm: not COMPLETED; taugrid: not succeeded)
    warmup_s: float = float("nan")

    def burst_figures(self) -> dict[str, float]:
        if not self.burst_submitted:
            return {"jobs_per_s": float("nan"), "all_started_s": float("nan")}
        first = min(at for _, at in self.burst_submitted)
        last = max(self.burst_started.get(j, self.burst_gave_up) for j, _ in self.burst_submitted)
        span = max(1e-9, last - first)
        return {"jobs_per_s": len(self.burst_submitted) / span, "all_started_s": span}

    @property
    def lost(self) -> int:
        return self.idle_lost + sum(1 for j, _ in self.burst_submitted if j not in self.burst_started)


def first_stamp(stamps: Path, job: str) -> float | None:
    try:
        text = (stamps / job).read_text()
    except FileNotFoundError:
        return None
    values = [float(v) for v in text.split() if v]
    return min(values) if values else None


async def until_stamped(stamps: Path, job: str, timeout: float) -> float | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        at = first_stamp(stamps, job)
        if at is not None:
            return at
        await asyncio.sleep(0.005)  # a stat: cheap, and finer than either system's latency
    return None


async def until_burst_started(side: Side, stamps: Path, deadline: float) -> None:
    """Collect the burst's start stamps until every job has one or the deadline passes (then ``burst_gave_up``
    is when the bench gave up), printing progress every 10 s."""
    first = min((at for _, at in side.burst_submitted), default=time.time())
    shown = time.time()
    while time.time() < deadline:
        for job, _ in side.burst_submitted:
            if job not in side.burst_started and (at := first_stamp(stamps, job)) is not None:
                side.burst_started[job] = at
        if len(side.burst_started) == len(side.burst_submitted):
            break
        if time.time() - shown >= 10:
            shown = time.time()
            print(f"  {side.name} burst: {len(side.burst_started)}/{len(side.burst_submitted)} started "
                  f"after {shown - first:.0f} s", flush=True)
        await asyncio.sleep(0.05)
    side.burst_gave_up = time.time()


def write_job(directory: Path, python: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "main.py").write_text(JOB)
    script = directory / "job.py"
    script.write_text(f"#!{python}\n{JOB}")
    script.chmod(0o755)
    return script


# ---------------------------------------------------------------- Slurm side
async def warm_and_idle(side: Side, run_one: Callable[[float], Awaitable[float | None]], warm_timeout: float,
                        args: argparse.Namespace) -> None:
    """One warm-up job (not among the figures; a lost one counts), then ``args.idle`` jobs one at a time:
    ``run_one(timeout)`` submits one, waits for its start and returns submit → start (None: never started, which
    counts with its wait until the bench gave up)."""
    warm = await run_one(warm_timeout)
    side.warmup_s = float("nan") if warm is None else warm
    await asyncio.sleep(1.0)
    for _ in range(args.idle):
        t0 = time.time()
        waited = await run_one(args.idle_timeout)
        if waited is None:
            side.idle_lost += 1
            waited = time.time() - t0
        side.idle_ms.append(1000 * waited)
        await asyncio.sleep(0.3)


async def slurm_side(slurm: LocalSlurm, script: Path, stamps: Path, args: argparse.Namespace) -> Side:
    side = Side("Slurm")

    async def run_one(timeout: float) -> float | None:
        t0 = time.time()
        job = await slurm.sbatch(script, stamps)
        at = await until_stamped(stamps, job, timeout)
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            state = await slurm.job_state(job)
            if state in SLURM_ENDED:
                break
            await asyncio.sleep(0.1)
        if state != "COMPLETED":
            side.failed += 1
        return None if at is None else at - t0

    await warm_and_idle(side, run_one, 120, args)

    gate = asyncio.Semaphore(args.submit_concurrency)

    async def submit() -> None:
        async with gate:
            at = time.time()
            job = await slurm.sbatch(script, stamps)
            side.burst_submitted.append((job, at))

    began = time.time()
    await asyncio.gather(*(submit() for _ in range(args.burst)))
    side.burst_submit_s = time.time() - began
    deadline = time.time() + args.timeout
    await until_burst_started(side, stamps, deadline)
    # every job of the burst must also end well (not part of the figures), and none may outlive the daemons
    states: dict[str, str] = {}
    burst = [j for j, _ in side.burst_submitted]
    while True:
        states = await slurm.job_states()
        # a job no longer listed ended over MinJobAge (300 s) ago: slurmctld forgets only finished jobs
        if all(states.get(j, "COMPLETED") in SLURM_ENDED for j in burst) or \
                time.time() > max(deadline, side.burst_gave_up + 60):
            break
        await asyncio.sleep(0.5)
    side.failed += sum(1 for j in burst if states.get(j, "COMPLETED") != "COMPLETED")
    return side


# ---------------------------------------------------------------- taugrid side
async def taugrid_side(url: str, data: Path, project: Path, stamps: Path, args: argparse.Namespace) -> Side:
    state = msgspec.json.decode((data / "stack.json").read_bytes())
    # Submissions are signed by the stack's owner (a platform user); the bootstrap identity sees every run end.
    client = await open_client(url, creds=state["user_creds"])
    admin = await open_client(url, creds=data / "creds" / "bootstrap.nk")
    watch = Watch()
    await watch.start(admin.bus.nc)
    side = Side("taugrid")
    config = project / "tau.yaml"

    async def submit() -> tuple[str, float]:
        at = time.time()
        run_id = await client.submit(config, workspace="peer", submission_id=new_submission_id())
        return run_id, at

    async def run_one(timeout: float) -> float | None:
        run_id, t0 = await submit()
        at = await until_stamped(stamps, run_id, timeout)
        await watch.until(lambda: run_id in watch.ended, timeout=timeout)
        if watch.ended.get(run_id, (0.0, ""))[1] != "exec.succeeded":
            side.failed += 1
        return None if at is None else at - t0

    try:
        # Warm-up: the services are still importing when `tau up` returns on a busy machine (as Slurm's warm-up
        # job, it is not among the figures, but a lost one counts).
        await warm_and_idle(side, run_one, 300, args)

        gate = asyncio.Semaphore(args.submit_concurrency)  # as many in flight as Slurm's sbatch processes

        async def gated() -> tuple[str, float]:
            async with gate:
                return await submit()

        began = time.time()
        side.burst_submitted = list(await asyncio.gather(*(gated() for _ in range(args.burst))))
        side.burst_submit_s = time.time() - began
        deadline = time.time() + args.timeout
        await until_burst_started(side, stamps, deadline)
        # every run of the burst must also end well: wait for the ends (not part of the figures)
        burst = [r for r, _ in side.burst_submitted]
        await watch.until(lambda: all(r in watch.ended for r in burst), timeout=max(30.0, deadline - time.time()))
        side.failed += sum(1 for r in burst if watch.ended.get(r, (0.0, ""))[1] != "exec.succeeded")
    finally:
        await client.close()
        await admin.close()
    return side


# ---------------------------------------------------------------- the verdict
def compare(slurm: Side, tau: Side) -> tuple[list[tuple[str, str, str, str, str]], bool]:
    """Rows (figure, Slurm, taugrid, target, verdict) and whether taugrid is ahead on both scored figures with
    no run lost on either side."""
    sb, tb = slurm.burst_figures(), tau.burst_figures()
    s99, t99 = pct(slurm.idle_ms, 99), pct(tau.idle_ms, 99)
    burst_ok = tb["jobs_per_s"] > sb["jobs_per_s"]
    idle_ok = t99 < s99
    tau_whole = tau.lost == 0 and tau.failed == 0
    slurm_whole = slurm.lost == 0 and slurm.failed == 0
    n_s, n_t = len(slurm.burst_submitted) + len(slurm.idle_ms), len(tau.burst_submitted) + len(tau.idle_ms)
    rows = [
        ("burst: jobs/s (N / last start - first submit)", f"{sb['jobs_per_s']:.1f}", f"{tb['jobs_per_s']:.1f}",
         "ahead of Slurm", "ok" if burst_ok else "MISSED"),
        ("burst: time to all started (s)", f"{sb['all_started_s']:.1f}", f"{tb['all_started_s']:.1f}", "", ""),
        ("idle: submit → start p50 (ms)", f"{pct(slurm.idle_ms, 50):.0f}", f"{pct(tau.idle_ms, 50):.0f}", "", ""),
        ("idle: submit → start p99 (ms)", f"{s99:.0f}", f"{t99:.0f}", "ahead of Slurm",
         "ok" if idle_ok else "MISSED"),
        ("jobs lost (never started) / ended badly", f"{slurm.lost} / {slurm.failed} of {n_s}",
         f"{tau.lost} / {tau.failed} of {n_t}", "none", "ok" if tau_whole and slurm_whole else "MISSED"),
        ("burst: time to all submitted (s)", f"{slurm.burst_submit_s:.1f}", f"{tau.burst_submit_s:.1f}", "", ""),
    ]
    return rows, burst_ok and idle_ok and tau_whole and slurm_whole


def print_table(rows: list[tuple[str, str, str, str, str]]) -> None:
    print(f"\n  {'figure':<46}{'Slurm':>16}{'taugrid':>16}  {'target':<16}")
    for label, s, t, target, verdict in rows:
        print(f"  {label:<46}{s:>16}{t:>16}  {target:<16}{verdict}")


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--burst", type=int, default=300, help="jobs submitted at once on each system")
    ap.add_argument("--idle", type=int, default=20, help="jobs submitted one at a time on each idle system")
    ap.add_argument("--cpus", type=int, default=64, help="CPUs of Slurm's node and of taugrid's quota")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for a burst's jobs to start")
    ap.add_argument("--idle-timeout", type=float, default=60, help="seconds to wait for one idle job")
    ap.add_argument("--submit-concurrency", type=int, default=32,
                    help="submissions in flight at once in the burst, on both systems (Slurm: sbatch processes; "
                         "taugrid: Client.submit calls)")
    ap.add_argument("--scheduler-parameters", default="",
                    help="SchedulerParameters for slurm.conf (default: none, Slurm's defaults)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter both systems run the job with")
    ap.add_argument("--install", action="store_true",
                    help="when Slurm is absent, install slurm-wlm with apt-get (only as root where apt-get exists)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (Slurm's logs, the stack's data dir)")
    args = ap.parse_args()

    missing = slurm_missing()
    if missing and args.install:
        why = install_slurm()
        if why:
            print(f"Slurm is not installed here (missing {', '.join(missing)}) and could not be installed: {why}; "
                  "no side-by-side comparison in this run, so the target is not shown")
            sys.exit(2)
        missing = []
    if missing:
        print(f"Slurm is not installed here (missing {', '.join(missing)}); no side-by-side comparison in this run "
              "(--install installs Debian's slurm-wlm when run as root where apt-get exists)")
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks stop the daemons

    work = Path(tempfile.mkdtemp(prefix="tau-bench-slurm-"))
    work.chmod(0o755)
    project = work / "project"
    script = write_job(project, args.python)
    sched = args.scheduler_parameters or "none (Slurm's defaults)"
    print(f"Slurm beside taugrid: {args.burst} jobs in a burst ({args.submit_concurrency} submissions in flight "
          f"at once on both), {args.idle} one at a time, {args.cpus} CPUs each; job interpreter {args.python}; "
          f"Slurm SchedulerParameters: {sched}; work dir {work}", flush=True)
    print(f"Slurm submits: {' '.join(LocalSlurm.sbatch_argv(script, Path('<stamps>')))} (one process per job); "
          "taugrid submits: Client.submit(<project>/tau.yaml) per job, one client", flush=True)
    slurm = LocalSlurm(work / "slurm", cpus=args.cpus, scheduler_parameters=args.scheduler_parameters)
    try:
        version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip()
        try:
            slurm.start()
            print(f"Slurm: {version} up (slurmctld, slurmd, munged in {slurm.root}); {slurm.scheduler()}; "
                  "its slurm.conf:\n" + "".join(f"    {ln}\n" for ln in
                                                 (slurm.root / "slurm.conf").read_text().splitlines()), flush=True)
            slurm_stamps = work / "stamps-slurm"
            slurm_stamps.mkdir()
            s_side = asyncio.run(slurm_side(slurm, script, slurm_stamps, args))
        finally:
            slurm.stop()
        phases = "; ".join(f"{k} {v:.2f} s" for k, v in slurm_phases(slurm.root / "log", s_side).items())
        print(f"Slurm done: {len(s_side.burst_started)}/{args.burst} burst jobs started; burst medians: {phases}",
              flush=True)

        tau_stamps = work / "stamps-taugrid"
        tau_stamps.mkdir()
        (project / "tau.yaml").write_text(TAU_RUN % {"stamps": tau_stamps})
        os.environ["TAU_PYTHON"] = args.python  # the run's interpreter pin, as `TAU_PYTHON=… tau run` records it
        data, env, tau = simulated_stack("tau-bench-slurm-stack-")
        env.pop("TAU_LOCAL_SIMULATE", None)  # real processes
        env["TAU_CONTAINER_ENGINES"] = ""
        platform = one_queue_platform("peer", cpu_quota=args.cpus, memory_quota="1000Gi")
        with stack_up(data, env, tau, platform, keep=args.keep) as url:
            print(f"taugrid: embedded stack up (data dir {data}), real processes", flush=True)
            t_side = asyncio.run(taugrid_side(url, data, project, tau_stamps, args))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work dir kept: {work}")

    print(f"\nwarm-up job submit → start: Slurm {s_side.warmup_s:.2f} s, taugrid {t_side.warmup_s:.2f} s "
          "(not in the figures)")
    rows, ok = compare(s_side, t_side)
    print_table(rows)
    print(f"load average during the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
