"""The backend contract: the same tau.yaml gives the same sequence of run events on both backends.

Each backend gets its own nats-server (module scope, parameterised): the durable consumers are shared
server-wide, so the two stacks must never compete for one durable, nor with the rest of the suite. The
services run in-process as ``ConsumerLoop`` tasks on their real durables: submitter (+ run-state projection),
policy, renderer, admission-watcher, recovery. Only the renderer's backend differs:

* **local**: ``LocalBackend`` → the local-cluster controller (its BACKEND durable plus ``tick()`` every
  0.1 s), which admits against the platform's quota and runs each pod as a real OS process (``sh -c``).
* **kubernetes**: ``KubernetesBackend`` → server-side apply into ``FakeKube`` (kmock, real HTTP), the
  kube-bridge (lease, list+watch, checkpoints) republishing its watch events on ``k8s.>``, and the scripted
  "Kueue + kubelet" below.

What the scripted Kueue + kubelet simulates, writing through FakeKube so that every step is a watch event:
for each new suspended Job it creates the Workload the way Kueue does (name ``job-<job>-<hash>``, label
``kueue.x-k8s.io/job-uid``, an ownerReference, ``spec.queueName``, one ``main`` PodSet), first pending
(``QuotaReserved=False``, reason ``Pending``) and then admitted (``QuotaReserved=True``, ``Admitted=True``,
``status.admission`` with the ClusterQueue and podSetAssignments); unsuspends the Job; creates its Pod
(labels from the Job template, ``controller-uid``, ownerReference), Pending then Running; "runs" the
container command by reading it (``sleep N`` sleeps, ``exit N`` sets the exit code); terminates the Pod
(Succeeded/Completed or Failed/Error with the exit code) and sets the Job's ``Complete`` or ``Failed``
(``BackoffLimitExceeded``) condition and the Workload's ``Finished``. A deleted Job takes its Pod and
Workload with it (garbage collection).

What it does NOT simulate: quota arithmetic, queue ordering, preemption, flavor assignment beyond one flavor,
admission checks, node scheduling and the kubelet's restart policy, RayJobs. It also waits, before each
next transition (and, for a failing pod, before marking the Job Failed), until the previous one has shown up
as a run event: a real cluster takes seconds between admission and a running pod, while here all writes
would otherwise land in the same millisecond and the bridge's per-kind watches (Workloads, Jobs, Pods) would
race each other. Cross-kind order is not something the bridge promises: each kind has its own watch, and
``ordering_key`` groups a Workload by job uid, not by run.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import kmock
import pytest

from taugrid.bus import Bus, connect, identity, platformstore, runstate
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.consumer import ConsumerLoop
from taugrid.client.client import Client
from taugrid.kube.apply import KubeBackend
from taugrid.kube.backend import KubernetesBackend
from taugrid.kube.client import KubeApi, make_api_client, resource_for
from taugrid.kube.watch import MANAGED_SELECTOR
from taugrid.local.backend import LocalBackend
from taugrid.local.controller import LocalCluster
from taugrid.stack import natsserver
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from taugrid_services.kube_bridge.bridge import Bridge
from taugrid_services.policy.handlers import Policy
from taugrid_services.recovery.handlers import Recovery
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.submitter.handlers import Submitter

from tests.kube.conftest import FakeKube, _with_status

PLATFORM = """
resource_flavors: [{name: default}]
cohorts: [{name: lab}]
cluster_queues:
  - name: lab
    cohort: lab
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: default
            resources:
              - {name: cpu, nominal_quota: "8"}
              - {name: memory, nominal_quota: 16Gi}
local_queues: [{name: default, namespace: default, cluster_queue: lab}]
priority_classes: [{name: normal, value: 100}]
compute_profiles: [{name: cpu-small, cpu: "100m", memory: 128Mi}]
workspaces:
  - {name: default, namespace: default, local_queue: default, default_priority: normal,
     default_profile: cpu-small, output_root: OUTPUTS}
"""

SUCCESS = [
    "submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.queued",
    "admission.admitted", "exec.running", "exec.succeeded",
]
JOBS, PODS = ("batch", "v1", "jobs"), ("", "v1", "pods")
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
TERMINAL = {"exec.succeeded", "exec.cancelled", "recovery.gave_up"}


def tau_yaml(name: str, command: str, extra: str = "") -> str:
    return f"name: {name}\nentrypoint: {command!r}\ncompute: {{gpus: 0}}\n{extra}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- the scripted Kueue + kubelet


@dataclass
class ScriptedKueue:
    fake: FakeKube
    bus: Bus
    drop_after_writes: bool = False  # cut every open watch right after each write (resume test)
    seen: set[str] = field(default_factory=set)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            for (res, ns, name), job in list(self.fake.objects.items()):
                if res == JOBS and name not in self.seen:
                    self.seen.add(name)
                    self.tasks.append(asyncio.create_task(self._lifecycle(ns or "default", name, job)))
            await asyncio.sleep(0.05)

    def _exists(self, ns: str, name: str) -> bool:
        return (JOBS, ns, name) in self.fake.objects

    def _write(self, fn: Callable[[], Any]) -> Any:
        out = fn()
        if self.drop_after_writes:
            self.fake.drop_watches()
        return out

    async def _shown(self, run_id: str, attempt: int, event_type: str, timeout: float = 10.0) -> None:
        """Wait until the previous transition became a run event (a real cluster is that slow anyway)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record, _ = await runstate.get(self.bus, run_id)
            if record is not None and any(
                h["type"] == event_type and h["attempt"] == attempt for h in record.history
            ):
                return
            await asyncio.sleep(0.05)

    async def _lifecycle(self, ns: str, name: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        labels, uid = meta["labels"], meta["uid"]
        run_id, attempt = labels["taugrid.io/run-id"], int(labels["taugrid.io/attempt"])
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": True}
        container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "main")
        wl_name = f"job-{name}-{hashlib.sha256(uid.encode()).hexdigest()[:5]}"
        wl = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": wl_name, "namespace": ns, "labels": {"kueue.x-k8s.io/job-uid": uid},
                         "ownerReferences": [owner]},
            "spec": {"queueName": labels["kueue.x-k8s.io/queue-name"],
                     "podSets": [{"name": "main", "count": 1, "template": job["spec"]["template"]}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                       "message": "waiting for the scheduler", "lastTransitionTime": now()}]},
        }
        self._write(lambda: self.fake.put(WORKLOADS, wl))
        await self._shown(run_id, attempt, "admission.queued")
        if not self._exists(ns, name):
            return await self._collect(ns, name, wl_name)

        def admit(o: dict[str, Any]) -> None:
            t = now()
            o["status"] = {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                     "lastTransitionTime": t},
                    {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": t},
                ],
                "admission": {"clusterQueue": "lab", "podSetAssignments": [
                    {"name": "main", "count": 1, "flavors": {"cpu": "default", "memory": "default"}}]},
            }

        self._write(lambda: self.fake.modify(WORKLOADS, ns, wl_name, admit))
        await self._shown(run_id, attempt, "admission.admitted")
        if not self._exists(ns, name):
            return await self._collect(ns, name, wl_name)

        start = now()

        def unsuspend(o: dict[str, Any]) -> None:
            o["spec"]["suspend"] = False
            o["status"] = {"startTime": start, "active": 1}

        self._write(lambda: self.fake.modify(JOBS, ns, name, unsuspend))
        pod_name = f"{name}-x{uuid.uuid4().hex[:4]}"
        tmpl = copy.deepcopy(job["spec"]["template"])
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "ownerReferences": [owner],
                         "labels": {**tmpl["metadata"].get("labels", {}),
                                    "batch.kubernetes.io/controller-uid": uid, "job-name": name}},
            "spec": {**tmpl["spec"], "nodeName": "node-1"},
            "status": {"phase": "Pending"},
        }
        self._write(lambda: self.fake.put(PODS, pod))

        def running(o: dict[str, Any]) -> None:
            o["status"] = {"phase": "Running", "startTime": start, "containerStatuses": [
                {"name": "main", "ready": True, "state": {"running": {"startedAt": start}}}]}

        self._write(lambda: self.fake.modify(PODS, ns, pod_name, running))
        await self._shown(run_id, attempt, "exec.running")

        command = " ".join([*container.get("command", []), *container.get("args", [])])
        sleep = re.search(r"sleep (\d+(?:\.\d+)?)", command)
        code = re.search(r"exit (\d+)", command)
        exit_code = int(code.group(1)) if code else 0
        deadline = time.monotonic() + (float(sleep.group(1)) if sleep else 0.0)
        while time.monotonic() < deadline and self._exists(ns, name):
            await asyncio.sleep(0.05)
        if not self._exists(ns, name):
            return await self._collect(ns, name, wl_name, pod_name)

        end = now()
        ok = exit_code == 0

        def terminated(o: dict[str, Any]) -> None:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if ok else "Error",
                                    "startedAt": start, "finishedAt": end}}
            o["status"] = {"phase": "Succeeded" if ok else "Failed", "startTime": start,
                           "containerStatuses": [{"name": "main", "ready": False, "state": state}]}

        def finished(o: dict[str, Any]) -> None:
            cond = ({"type": "Complete", "status": "True", "reason": "Completed", "lastTransitionTime": end}
                    if ok else
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit",  # as real: no exit code
                     "lastTransitionTime": end})
            o["status"] = {"startTime": start, "conditions": [cond], **(
                {"succeeded": 1, "completionTime": end} if ok else {"failed": 1})}

        def wl_finished(o: dict[str, Any]) -> None:
            o["status"]["conditions"].append({"type": "Finished", "status": "True",
                                              "reason": "Succeeded" if ok else "Failed",
                                              "lastTransitionTime": end})

        self._write(lambda: self.fake.modify(PODS, ns, pod_name, terminated))
        if not ok:  # the Job controller reacts to the pod's failure, so the pod's report comes first
            await self._shown(run_id, attempt, "exec.failed")
        self._write(lambda: self.fake.modify(JOBS, ns, name, finished))
        self._write(lambda: self.fake.modify(WORKLOADS, ns, wl_name, wl_finished))

    async def _collect(self, ns: str, name: str, wl_name: str, pod_name: str | None = None) -> None:
        """Garbage collection after the Job was deleted: its Pod and Workload go too."""
        if pod_name and (PODS, ns, pod_name) in self.fake.objects:
            self._write(lambda: self.fake.remove(PODS, ns, pod_name))
        if (WORKLOADS, ns, wl_name) in self.fake.objects:
            self._write(lambda: self.fake.remove(WORKLOADS, ns, wl_name))


# ---------------------------------------------------------------- the two stacks


@dataclass
class Stack:
    backend: str
    bus: Bus
    client: Client
    fake: FakeKube | None = None
    kueue: ScriptedKueue | None = None

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


@pytest.fixture(scope="module", params=["local", "kubernetes"])
async def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                ) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp(f"contract-{request.param}")
    proc, port = natsserver.start(tmp / "nats", log_file=tmp / "nats.log")  # private: durables are per server
    url = f"nats://127.0.0.1:{port}"
    bus = await connect(url, name=f"contract-{request.param}")
    await bootstrap(bus)
    await platformstore.put_text(bus, PLATFORM.replace("OUTPUTS", str(tmp / "outputs")))
    # The person submitting: the platform lists no users, so the local user's key is the accepted one.
    bus.seed = identity.new_user_seed()
    await platformstore.put_local_user(bus, platformstore.LocalUser("tester", identity.public_key(bus.seed)))
    # Each service on its own connection under its own name, as in production: consumers check ce-source.
    svc: dict[str, Bus] = {}
    for name in ("submitter", "policy", "renderer", "admission-watcher", "recovery", "local-cluster",
                 "kube-bridge"):
        svc[name] = await connect(url, name=name)
        svc[name].user_lookup = runstate.VerifiedUsers(svc[name])
    loops: list[ConsumerLoop] = []
    tasks: list[asyncio.Task[Any]] = []
    stopping = asyncio.Event()

    def consume(stream: str, durable: str, handler: Any, service: str) -> None:
        loop = ConsumerLoop(svc[service], stream=stream, durable=durable, handler=handler, fetch_timeout=0.5)
        loops.append(loop)
        tasks.append(asyncio.create_task(loop.run(), name=durable))

    sub = Submitter(svc["submitter"])
    consume("RUNS", "submitter", sub.on_requested, "submitter")
    consume("RUNS", "runstate", sub.on_any, "submitter")
    consume("RUNS", "policy", Policy(svc["policy"]).on_accepted, "policy")
    consume("K8S", "admission-watcher", AdmissionWatcher(svc["admission-watcher"]).on_event, "admission-watcher")
    consume("RUNS", "recovery", Recovery(svc["recovery"]).on_event, "recovery")
    stack = Stack(request.param, bus, Client(bus))
    async with kmock.RawHandler() as handler, kmock.Server(handler) as server:
        if request.param == "local":
            cluster = LocalCluster(svc["local-cluster"], data_dir=tmp, node="node-1",
                                   capacity={"cpu": 4.0, "memory": float(8 << 30)}, gpu_count=0)
            await cluster.load()
            consume("RUNS", "renderer", Renderer(svc["renderer"], LocalBackend(svc["renderer"])).on_event,
                    "renderer")
            consume("BACKEND", "local-cluster", cluster.on_backend, "local-cluster")

            async def ticks() -> None:
                while not stopping.is_set():
                    await cluster.tick()
                    await asyncio.sleep(0.1)

            tasks.append(asyncio.create_task(ticks()))
            api_client = None
        else:
            fake = FakeKube()
            handler << (lambda req: _with_status(fake.handle(req)))
            api_client = await make_api_client(host=str(server.url).rstrip("/"))
            consume("RUNS", "renderer",
                    Renderer(svc["renderer"], KubernetesBackend(KubeBackend(api_client), "kc")).on_event,
                    "renderer")
            bridge = Bridge(svc["kube-bridge"], KubeApi(api_client), cluster="kc", holder="contract",
                            resources=[(resource_for("Workload"), None),
                                       (resource_for("Job"), MANAGED_SELECTOR),
                                       (resource_for("Pod"), MANAGED_SELECTOR)],
                            lease_ttl_s=3.0, checkpoint_every_s=0.2, backoff_max_s=0.3)
            tasks.append(asyncio.create_task(bridge.run(stopping)))
            stack.fake, stack.kueue = fake, ScriptedKueue(fake, bus)
            tasks.append(asyncio.create_task(stack.kueue.run()))
        try:
            yield stack
        finally:
            stopping.set()
            for loop in loops:
                loop.stopping.set()
            for t in tasks:
                t.cancel()
            if stack.kueue:
                for t in stack.kueue.tasks:
                    t.cancel()
            await asyncio.gather(*tasks, *(stack.kueue.tasks if stack.kueue else []), return_exceptions=True)
            if api_client is not None:
                await api_client.close()
            for b in svc.values():
                await b.close()
            await bus.close()
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


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
    record_, _ = await runstate.get(stack.bus, run_id)
    assert record_ is not None and record_.state == "failed" and record_.attempt == 2


async def test_cancel_while_running(stack: Stack) -> None:
    run_id = await stack.submit("long", "sleep 30")
    evs = await stack.events(run_id, until={"exec.running"})
    assert evs[-1][1] == "exec.running", evs
    await stack.client.cancel(run_id)
    got = record("cancel", stack, await stack.events(run_id))
    assert [t for _, t in got][-4:] == ["exec.running", "cancel.requested", "cancel.accepted", "exec.cancelled"], got
    record_, _ = await runstate.get(stack.bus, run_id)
    assert record_ is not None and record_.state == "cancelled"


@pytest.mark.parametrize("stack", ["kubernetes"], indirect=True)  # only Kubernetes has watch connections
async def test_watch_cuts_mid_run_lose_no_transition(stack: Stack) -> None:
    assert stack.backend == "kubernetes"
    assert stack.kueue is not None and stack.fake is not None
    stack.kueue.drop_after_writes = True
    try:
        run_id = await stack.submit("cut", "sleep 0.5")
        got = dedup_queued(await stack.events(run_id))
    finally:
        stack.kueue.drop_after_writes = False
    assert [t for _, t in got] == SUCCESS, got
    assert len(stack.fake.watch_requests) > 6  # the watches really were re-established


TREES: dict[str, list[tuple[str, str]]] = {}


async def test_the_phase_tree_has_the_same_shape_on_both_backends(stack: Stack) -> None:
    run_id = await stack.submit("tree", "sleep 0.3")
    await stack.events(run_id)
    deadline = time.monotonic() + 10
    while True:
        record_, _ = await runstate.get(stack.bus, run_id)
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
