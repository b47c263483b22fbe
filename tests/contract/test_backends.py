"""The backend contract: the same tau.yaml gives the same sequence of run events on both backends.

Each backend gets its own nats-server (module scope, parameterised): the durable consumers are shared
server-wide, so the two stacks must never compete for one durable, nor with the rest of the suite. The
services run in-process as ``ConsumerLoop`` tasks on their real durables: submitter (+ run-state projection),
policy, renderer, admission-watcher, recovery. Only the renderer's backend differs:

* **local**: ``LocalBackend`` → the local-cluster controller (its BACKEND durable plus ``tick()`` every
  0.1 s), which admits against the platform's quota and runs each pod as a real OS process (``sh -c``).
* **kubernetes**: ``KubernetesBackend`` → server-side apply into ``FakeKube`` (kmock, real HTTP), the
  kube-bridge (lease, list+watch, checkpoints) republishing its watch events on ``k8s.>``, the emulated cluster
  (tests/kube/cluster.py: Kueue admission and the Job controller, every pod run by the real local kubelet as
  host processes, its status PATCHed over HTTP) and the real log shipper following the pods' log endpoint onto
  LOGS. The renderer points the source-fetch init container at this stack's nats-server, so the submitted
  project reaches each pod through the real ``tau-source-fetch`` (``python -m taugrid.sources.fetch``).

Both run the same work for real: shell one-liners, ``examples/quickstart`` (its checkpoints, metrics and log
lines compared file for file and line for line), a failing script, a two-pod Indexed Job that rendezvouses
through the environment torchrun's agent would set, and a RayJob whose entrypoint is a plain script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from taugrid import runrecord
from taugrid.bus import Bus, platformstore
from taugrid.client.client import Client
from taugrid.kube.apply import KubeBackend
from taugrid.kube.backend import KubernetesBackend
from taugrid.kube.client import KubeApi, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid.local.backend import LocalBackend
from taugrid.render.source import RenderSettings
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.log_shipper.shipper import LogShipper
from taugrid_services.policy.handlers import Policy
from taugrid_services.recovery.handlers import Recovery
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.submitter.handlers import Submitter
from tests.inprocess import PipelineLoops, one_node_cluster, private_server, sign_as_local_user
from tests.kube.cluster import EmulatedCluster
from tests.kube.conftest import FakeKube, emulated_api
from tests.platforms import lab_platform, workspace

PLATFORM = lab_platform(cohort=True, workspaces=[workspace(output_root="OUTPUTS")])

SUCCESS = [
    "submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.queued",
    "admission.admitted", "exec.running", "exec.succeeded",
]
TERMINAL = {"exec.succeeded", "exec.cancelled", "recovery.gave_up"}


def tau_yaml(name: str, command: str, extra: str = "") -> str:
    return f"name: {name}\nentrypoint: {command!r}\ncompute: {{gpus: 0}}\n{extra}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- the two stacks


@dataclass
class Stack:
    backend: str
    bus: Bus
    client: Client
    tmp: Path
    fake: FakeKube | None = None
    cluster: EmulatedCluster | None = None
    bridge: BridgeRunner | None = None
    shipper: LogShipper | None = None

    async def submit(self, name: str, command: str, extra: str = "") -> str:
        return await self.client.submit_text(tau_yaml(name, command, extra), name=name)

    async def events(self, run_id: str, *, until: set[str] = TERMINAL, timeout: float = 20.0,
                     ) -> list[tuple[int, str]]:
        deadline = time.monotonic() + timeout
        while True:
            evs = [(e.attempt, e.type) async for e in self.client.events(run_id=run_id)
                   if e.type != "exec.progress"]  # pod-level detail; its tree is compared on its own below
            if until & {t for _, t in evs} or time.monotonic() > deadline:
                return evs
            await asyncio.sleep(0.1)


class BridgeRunner:
    """The kube-bridge as its Deployment runs it, restartable mid-run (a new replica under a new name)."""

    def __init__(self, bus: Bus, api: KubeApi) -> None:
        self.bus, self.api, self.generation = bus, api, 0
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.generation += 1
        self.stopping = asyncio.Event()
        bridge = Bridge(self.bus, self.api, cluster="kc", holder=f"contract-{self.generation}",
                        resources=[(resource_for("Workload"), None),
                                   (resource_for("Job"), MANAGED_SELECTOR),
                                   (resource_for("RayJob"), MANAGED_SELECTOR),
                                   (resource_for("Pod"), MANAGED_SELECTOR)],
                        lease_ttl_s=3.0, checkpoint_every_s=0.2, backoff_max_s=0.3)
        self.task = asyncio.create_task(bridge.run(self.stopping), name=f"kube-bridge-{self.generation}")

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)


@pytest.fixture(scope="module", params=["local", "kubernetes"])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                ) -> AsyncIterator[Stack]:
    backend: str = request.param
    tmp = tmp_path_factory.mktemp(f"contract-{backend}")
    async with (
        private_server(tmp, name=f"contract-{backend}") as (url, bus),
        _running_stack(backend, tmp, url, bus) as stack,
    ):
        yield stack


@contextlib.asynccontextmanager
async def _running_stack(backend: str, tmp: Path, url: str, bus: Bus) -> AsyncIterator[Stack]:
    await platformstore.put_text(bus, PLATFORM.replace("OUTPUTS", str(tmp / "outputs")))
    await sign_as_local_user(bus)
    # Each service on its own connection under its own name, as in production: consumers check ce-source.
    p = PipelineLoops(url, fetch_timeout=0.5)
    await p.connect("submitter", "run-record", "policy", "renderer", "admission-watcher", "recovery", "local-cluster",
                    "kube-bridge", "log-shipper")
    svc = p.svc
    sub = Submitter(svc["submitter"])
    p.consume("RUNS", "submitter", sub.on_requested, "submitter")
    p.record()
    p.consume("RUNS", "policy", Policy(svc["policy"]).on_accepted, "policy")
    p.consume("K8S", "admission-watcher", AdmissionWatcher(svc["admission-watcher"]).on_event, "admission-watcher")
    p.consume("RUNS", "recovery", Recovery(svc["recovery"]).on_event, "recovery")
    stack = Stack(backend, bus, Client(bus), tmp)
    fake = FakeKube()
    async with emulated_api(fake) as (api_url, api_client):
        if backend == "local":
            cluster = await one_node_cluster(svc["local-cluster"], tmp)
            p.consume("RUNS", "renderer", Renderer(svc["renderer"], LocalBackend(svc["renderer"])).on_event,
                      "renderer")
            p.consume("BACKEND", "local-cluster", cluster.on_backend, "local-cluster")
            p.every(0.1, cluster.tick)
        else:
            # The source-fetch init container reaches this stack's nats-server.
            renderer = Renderer(svc["renderer"], KubernetesBackend(KubeBackend(api_client), "kc"),
                                settings=RenderSettings(nats_url=url))
            p.consume("RUNS", "renderer", renderer.on_event, "renderer")
            stack.bridge = BridgeRunner(svc["kube-bridge"], KubeApi(api_client))
            await stack.bridge.start()
            stack.shipper = LogShipper(api_client, svc["log-shipper"], flush_s=0.1)
            await stack.shipper.start()
            stack.fake, stack.cluster = fake, EmulatedCluster(fake, api_url, tmp / "cluster", bus=bus)
            await stack.cluster.start()
        try:
            yield stack
        finally:
            await p.stop()
            if stack.cluster is not None:
                await stack.cluster.stop()
            if stack.shipper is not None:
                await stack.shipper.stop()
            if stack.bridge is not None:
                await stack.bridge.stop()
    await p.close()


# One result per (scenario, backend), to compare the backends with each other at the end.
RESULTS: dict[str, dict[str, list[tuple[int, str]]]] = {}


def dedup_queued(evs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Drop repeats of admission.queued within an attempt (each backend may report more queue reasons)."""
    out: list[tuple[int, str]] = []
    for ev in evs:
        if ev[1] == "admission.queued" and ev in out:
            continue
        out.append(ev)
    return out


def record(scenario: str, stack: Stack, evs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    got = dedup_queued(evs)
    RESULTS.setdefault(scenario, {})[stack.backend] = got
    other = {b: v for b, v in RESULTS[scenario].items() if b != stack.backend}
    for backend, theirs in other.items():
        assert got == theirs, f"{scenario}: {stack.backend} differs from {backend}:\n{got}\n{theirs}"
    return got


async def test_a_succeeding_run(stack: Stack) -> None:
    run_id = await stack.submit("ok", "sleep 0.3")
    got = record("success", stack, await stack.events(run_id))
    assert [t for a, t in got if a == 1] == SUCCESS, got


async def test_a_failing_run_is_retried_once_then_given_up(stack: Stack) -> None:
    run_id = await stack.submit(
        "flaky", "exit 3",
        "resilience: {max_retries: 1, retry_on: [Error], backoff_initial: 100ms, backoff_max: 200ms}\n")
    got = record("failing", stack, await stack.events(run_id))
    attempt = ["render.applied", "admission.queued", "admission.admitted", "exec.running", "exec.failed"]
    assert [t for _, t in got] == [
        "submit.requested", "submit.accepted", "policy.approved", *attempt, "recovery.retrying", *attempt,
        "recovery.gave_up"], got
    assert [a for a, t in got if t == "render.applied"] == [1, 2]
    failures = [e.as_dict() async for e in stack.client.events(run_id=run_id) if e.type == "exec.failed"]
    assert [(f["exit_code"], f["reason"]) for f in failures] == [(3, "Error"), (3, "Error")]
    record_ = await stack.client.settled(run_id)  # the run_state projection may trail the events just read
    assert (record_.state, record_.attempt) == ("failed", 2)


async def test_cancel_while_running(stack: Stack) -> None:
    run_id = await stack.submit("long", "sleep 30")
    evs = await stack.events(run_id, until={"exec.running"})
    assert evs[-1][1] == "exec.running", evs
    await stack.client.cancel(run_id)
    got = record("cancel", stack, await stack.events(run_id))
    assert [t for _, t in got][-4:] == ["exec.running", "cancel.requested", "cancel.accepted", "exec.cancelled"], got
    record_ = await stack.client.settled(run_id)  # the run_state projection may trail the events just read
    assert (record_.state, record_.cancelled_by) == ("cancelled", "tester")


@pytest.mark.parametrize("stack", ["kubernetes"], indirect=True)  # only Kubernetes has watch connections
async def test_watch_cuts_mid_run_lose_no_transition(stack: Stack) -> None:
    assert stack.backend == "kubernetes"
    assert stack.cluster is not None and stack.fake is not None
    stack.cluster.drop_after_writes = True
    try:
        run_id = await stack.submit("cut", "sleep 0.5")
        got = dedup_queued(await stack.events(run_id))
    finally:
        stack.cluster.drop_after_writes = False
    assert [t for _, t in got] == SUCCESS, got
    assert len(stack.fake.watch_requests) > 6  # the watches really were re-established


TREES: dict[str, list[tuple[str, str]]] = {}


async def test_the_phase_tree_has_the_same_shape_on_both_backends(stack: Stack) -> None:
    run_id = await stack.submit("tree", "sleep 0.3")
    await stack.events(run_id)
    deadline = time.monotonic() + 10
    while True:
        record_ = await runrecord.find(stack.bus, run_id)
        if (record_ is not None and record_.state == "succeeded") or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert record_ is not None and record_.state == "succeeded"
    tree = [(p.name, p.status) for p in record_.phases]
    TREES[stack.backend] = tree
    assert tree == [("submitted", "done"), ("policy", "done"), ("rendered", "done"), ("admission", "done"),
                    ("raycluster", "skipped"), ("scheduling", "done"), ("image-pull", "done"), ("init", "skipped"),
                    ("container-start", "done"), ("running", "done"), ("finished", "done")], tree
    assert [(len(p.containers), p.node) for p in record_.pods] == [(1, "node-1")]
    assert all(t == tree for t in TREES.values()), TREES


async def test_no_message_was_dead_lettered(stack: Stack) -> None:
    info = await stack.bus.js.stream_info("DLQ")
    assert info.state.messages == 0


# ---------------------------------------------------------------- real projects, submitted as `tau run` does

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
FAILING = {
    "tau.yaml": "name: broken\nengine: job\nentrypoint: fail.py\nargs: ['--rows', '0']\ncompute: {gpus: 0}\n"
                "resilience: {max_retries: 0}\n",
    "fail.py": "import sys\n"
               "print('loading', sys.argv[1:], flush=True)\n"
               "print('ValueError: the data set is empty', file=sys.stderr, flush=True)\n"
               "sys.exit(4)\n",
}
# The fetch names the directory it unpacked into: /tau/source in a container, the emptyDir's host directory here.
FETCH_LINE = re.compile(r"^source sha256:[0-9a-f]{64}: \d+ files? in \S+/volumes/tau-source$")


def project(stack: Stack, name: str, files: dict[str, str]) -> Path:
    where = stack.tmp / "projects" / name
    where.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
    return where


async def log_lines(stack: Stack, run_id: str, *, last: str, timeout: float = 20.0) -> list[str]:
    """Every line the run's pods printed, as LOGS holds them, once the line ``last`` has arrived."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [ln async for ch in stack.client.logs(run_id) for ln in ch.lines]
        if any(last in ln for ln in lines) or time.monotonic() > deadline:
            await asyncio.sleep(0.5)  # anything doubled would land now
            return [ln async for ch in stack.client.logs(run_id) for ln in ch.lines]
        await asyncio.sleep(0.1)


def pod_lines(stack: Stack, lines: list[str], run_id: str) -> list[str]:
    """The lines the run's own code printed (the run id as ``<run>``). On Kubernetes the first line is the
    source fetch's, from the init container, which the local backend does not run: checked, then set aside."""
    if stack.backend == "kubernetes":
        assert lines and FETCH_LINE.match(lines[0]), lines[:2]
        lines = lines[1:]
    return [ln.replace(run_id, "<run>") for ln in lines]


def outputs_of(stack: Stack, run_id: str) -> dict[str, str]:
    """The files the run wrote under its output directory, relative to it, with their contents."""
    [root] = [p for p in (stack.tmp / "outputs").rglob("*") if p.is_dir() and p.name == run_id]
    return {str(f.relative_to(root)): f.read_text() for f in sorted(root.rglob("*")) if f.is_file()}


OUTPUTS: dict[str, dict[str, dict[str, str]]] = {}
LOGS: dict[str, dict[str, list[str]]] = {}


def same_on_both(table: dict[str, dict[str, Any]], scenario: str, stack: Stack, value: Any) -> None:
    table.setdefault(scenario, {})[stack.backend] = value
    for backend, theirs in table[scenario].items():
        assert value == theirs, f"{scenario}: {stack.backend} differs from {backend}:\n{value}\n{theirs}"


async def test_the_quickstart_writes_the_same_checkpoints_metrics_and_logs(stack: Stack) -> None:
    run_id = await stack.client.submit(QUICKSTART / "tau.yaml")
    got = record("quickstart", stack, await stack.events(run_id, timeout=60))
    assert [t for a, t in got if a == 1] == SUCCESS, got

    lines = pod_lines(stack, await log_lines(stack, run_id, last="done: final test accuracy"), run_id)
    assert lines[0] == "run <run> attempt 1"
    assert [ln.split()[:2] for ln in lines[1:31]] == [["epoch", str(i)] for i in range(1, 31)]
    assert lines[31].startswith("done: final test accuracy ") and len(lines) == 32, lines
    same_on_both(LOGS, "quickstart", stack, lines)

    files = outputs_of(stack, run_id)
    assert sorted(files) == ["checkpoints/last.json", "metrics.jsonl"], sorted(files)
    rows = [json.loads(r) for r in files["metrics.jsonl"].splitlines()]
    assert [r["_step"] for r in rows] == list(range(1, 31))
    assert json.loads(files["checkpoints/last.json"])["epoch"] == 30
    # Same code, same data, same seed: the same weights and metrics on both backends (timestamps aside).
    same_on_both(OUTPUTS, "quickstart", stack, {
        "checkpoints/last.json": files["checkpoints/last.json"],
        "metrics.jsonl": [{k: v for k, v in r.items() if k != "_timestamp"} for r in rows]})


async def test_a_failing_script_fails_alike_with_its_exit_code_and_its_lines(stack: Stack) -> None:
    run_id = await stack.client.submit(project(stack, "broken", FAILING) / "tau.yaml")
    got = record("failing-script", stack, await stack.events(run_id, timeout=30))
    assert [t for _, t in got] == [
        "submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.queued",
        "admission.admitted", "exec.running", "exec.failed", "recovery.gave_up"], got
    failures = [e.as_dict() async for e in stack.client.events(run_id=run_id) if e.type == "exec.failed"]
    assert [(f["exit_code"], f["reason"]) for f in failures] == [(4, "Error")]
    lines = pod_lines(stack, await log_lines(stack, run_id, last="ValueError"), run_id)
    assert lines == ["loading ['--rows', '0']", "ValueError: the data set is empty"]
    same_on_both(LOGS, "failing-script", stack, lines)


# A two-node torchrun job (2 pods x 1 process). torch is not installed here (its CPU wheel alone takes minutes
# to install on the test machines), so the project ships a stand-in ``torch.distributed.run`` — found first,
# as ``python -m`` puts the working directory (the fetched project) on sys.path — that reads the flags the
# renderer wrote (``--node_rank=$(JOB_COMPLETION_INDEX)`` expanded by the kubelet, ``--rdzv_endpoint``) and sets
# what torchrun sets for the script (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). The script then
# all-reduces over plain sockets: rank 0 listens at MASTER_ADDR:MASTER_PORT, the others connect.
TORCHRUN = {
    "tau.yaml": "name: ddp\nengine: job\nentrypoint: allreduce.py\ncompute: {gpus: 0}\n"
                "execution: {launcher: torchrun, nodes: 2, processes_per_node: 1}\nresilience: {max_retries: 0}\n",
    "torch/__init__.py": "",
    "torch/distributed/__init__.py": "",
    "torch/distributed/run.py": """\
import argparse, os, runpy, sys
ap = argparse.ArgumentParser()
ap.add_argument("--nnodes", type=int, default=1)
ap.add_argument("--nproc_per_node", type=int, default=1)
ap.add_argument("--node_rank", type=int, default=0)
ap.add_argument("--rdzv_backend", default="c10d")
ap.add_argument("--rdzv_endpoint", default="127.0.0.1:29500")
ap.add_argument("--rdzv_id", default="")
ap.add_argument("--standalone", action="store_true")
ap.add_argument("script")
ap.add_argument("args", nargs=argparse.REMAINDER)
a = ap.parse_args()
host, _, port = a.rdzv_endpoint.rpartition(":")
os.environ.update(RANK=str(a.node_rank * a.nproc_per_node), LOCAL_RANK="0",
                  WORLD_SIZE=str(a.nnodes * a.nproc_per_node), MASTER_ADDR=host, MASTER_PORT=port)
sys.argv = [a.script, *a.args]
runpy.run_path(a.script, run_name="__main__")
""",
    "allreduce.py": """\
import os, pathlib, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
value = 10 ** rank
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(30)
    peers = [server.accept()[0] for _ in range(world - 1)]
    total = value + sum(int(p.makefile().readline()) for p in peers)
    for p in peers:
        p.sendall(f"{total}\\n".encode())
else:
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(f"{value}\\n".encode())
    total = int(conn.makefile().readline())
print(f"rank {rank}/{world}: all-reduce sum {total}", flush=True)
out = pathlib.Path(os.environ["TAU_OUTPUT_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{rank}.txt").write_text(f"{total}\\n")
""",
}


async def test_a_two_node_torchrun_job_rendezvouses_across_its_two_pods(stack: Stack) -> None:
    run_id = await stack.client.submit(project(stack, "ddp", TORCHRUN) / "tau.yaml")
    got = record("torchrun-2x1", stack, await stack.events(run_id, timeout=60))
    # one exec.running a run, rank 0's, on both backends (issue 30); each pod is in the record (below)
    assert [t for a, t in got if a == 1] == SUCCESS, got
    await log_lines(stack, run_id, last="rank 1/2")
    lines = await log_lines(stack, run_id, last="rank 0/2")
    if stack.backend == "kubernetes":  # one source fetch per pod
        fetched = [ln for ln in lines if FETCH_LINE.match(ln)]
        assert len(fetched) == 2, lines
        lines = [ln for ln in lines if ln not in fetched]
    assert sorted(lines) == ["rank 0/2: all-reduce sum 11", "rank 1/2: all-reduce sum 11"], lines
    assert outputs_of(stack, run_id) == {"rank0.txt": "11\n", "rank1.txt": "11\n"}
    record_ = await runrecord.find(stack.bus, run_id)
    assert record_ is not None and len(record_.pods) == 2


RAY = {
    "tau.yaml": "name: raytask\nengine: ray\nentrypoint: task.py\nargs: ['--trials', '3']\n"
                "compute: {workers: 1}\nresilience: {max_retries: 0}\n",
    "task.py": """\
import os, pathlib, sys
trials = int(sys.argv[sys.argv.index("--trials") + 1])
for t in range(trials):
    print(f"trial {t}: score {t * t}", flush=True)
out = pathlib.Path(os.environ["TAU_OUTPUT_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / "best.txt").write_text(f"{(trials - 1) ** 2}\\n")
print("best score", (trials - 1) ** 2, flush=True)
""",
}


async def test_a_rayjob_entrypoint_runs(stack: Stack) -> None:
    run_id = await stack.client.submit(project(stack, "ray", RAY) / "tau.yaml")
    got = record("rayjob", stack, await stack.events(run_id, timeout=60))
    assert [t for a, t in got if a == 1] == SUCCESS, got
    want = ["trial 0: score 0", "trial 1: score 1", "trial 2: score 4", "best score 4"]
    if stack.backend == "local":  # the one process's output is the pod's log
        assert await log_lines(stack, run_id, last="best score") == want
    else:
        # The driver's output is in Ray's job log on the head (KubeRay's submitter pod tails it and carries no
        # tau labels): LOGS holds the head's and the worker's container logs, which are the fetches' lines only.
        assert stack.cluster is not None
        job = f"{run_id}-a1"
        assert stack.cluster.ray_driver_log(job).read_text().splitlines() == want
        lines = await log_lines(stack, run_id, last="sha256")
        async with asyncio.timeout(10):
            while len(lines) < 2:
                lines = await log_lines(stack, run_id, last="sha256")
        assert len(lines) == 2 and all(FETCH_LINE.match(ln) for ln in lines), lines
    assert outputs_of(stack, run_id) == {"best.txt": "4\n"}


# Restarts mid-run on Kubernetes: a real pod prints while the kube-bridge (a new replica, after the old one
# released its lease) or the log shipper (resuming from its KV position) is replaced; LOGS holds every line
# exactly once and the run's events are the same as without a restart.
PRINTER = {
    "tau.yaml": "name: printer\nengine: job\nentrypoint: printer.py\ncompute: {gpus: 0}\n"
                "resilience: {max_retries: 0}\n",
    "printer.py": "import time\nfor i in range(60):\n    print(f'line {i}', flush=True)\n    time.sleep(0.05)\n",
}


async def printed(stack: Stack, run_id: str, n: int) -> None:
    async with asyncio.timeout(30):
        while (await runrecord.find(stack.bus, run_id)) is None or len(
                [ln async for ch in stack.client.logs(run_id) for ln in ch.lines]) < n:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("stack", ["kubernetes"], indirect=True)
@pytest.mark.parametrize("restart", ["kube-bridge", "log-shipper"])
async def test_a_restart_mid_run_loses_and_doubles_no_log_line(stack: Stack, restart: str) -> None:
    assert stack.bridge is not None and stack.shipper is not None
    run_id = await stack.client.submit(project(stack, f"printer-{restart}", PRINTER) / "tau.yaml")
    await printed(stack, run_id, 10)  # the fetch's line and the first printed ones are on LOGS
    assert "exec.succeeded" not in {t for _, t in await stack.events(run_id, until={"exec.running"})}
    if restart == "kube-bridge":
        await stack.bridge.stop()
        await asyncio.sleep(0.5)
        await stack.bridge.start()
    else:
        await stack.shipper.stop()
        await asyncio.sleep(0.5)
        stack.shipper = LogShipper(stack.shipper.api, stack.shipper.bus, flush_s=0.1)
        await stack.shipper.start()
    events = dedup_queued(await stack.events(run_id))
    assert [t for _, t in events] == SUCCESS, events
    lines = pod_lines(stack, await log_lines(stack, run_id, last="line 59"), run_id)
    assert lines == [f"line {i}" for i in range(60)]
    record_ = await runrecord.find(stack.bus, run_id)
    assert record_ is not None and record_.state == "succeeded"
