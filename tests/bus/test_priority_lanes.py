"""Priority lanes before the admitter, over a real nats-server: with a backlog of default-lane events held at one
stage (its default durable's handler blocked), a high-priority run passes the submitter, the policy, the
renderer and (its admission reported from the local cluster's objects) the admission watcher all the same, on
its stages' high-lane durables; a lane the client claims is decided again by the submitter and the policy.

The services run in-process on their real durables (``tests/inprocess.py``); a stage's two loops share their
per-run order as ``Service.consume`` binds them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from taugrid.bus import Bus, platformstore
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event
from taugrid.bus.topology import CONSUMERS, LANE_DURABLES
from taugrid.client.client import Client
from taugrid.core.contracts import SubmitRequested
from taugrid.core.events import HIGH_LANE
from taugrid.core.ids import new_run_id, new_submission_id
from taugrid.local.backend import LocalBackend
from taugrid.service import Service
from taugrid_services.admission_watcher.handlers import AdmissionWatcher
from taugrid_services.policy.handlers import Policy
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.run_record.handlers import Recorder
from taugrid_services.submitter.handlers import Submitter
from tests.inprocess import PipelineLoops, one_node_cluster, private_server, sign_as_local_user
from tests.platforms import FOUR_PRIORITIES, lab_platform, workspace

PLATFORM = lab_platform(priority_classes=FOUR_PRIORITIES,
                        workspaces=[workspace(allowed_priority_classes=["low", "normal", "high"])])
BACKLOG = 12
UNTIL_RENDERED = ["submit.requested", "submit.accepted", "policy.approved", "render.applied"]
# stage (its default durable) → the event its held backlog waits on
HELD_AT = {"submitter": "submit.requested", "policy": "submit.accepted", "renderer": "policy.approved",
           "local-cluster": "render.applied", "admission-watcher": "render.applied"}


def tau_yaml(name: str, priority: str) -> str:
    return (f"name: {name}\nentrypoint: 'sleep 0'\ncompute: {{gpus: 0}}\n"
            f"policy: {{workload_priority_class: {priority}}}\n")


@dataclass
class Pipeline:
    bus: Bus
    client: Client
    gates: dict[str, asyncio.Event]  # default-lane durable → open when set

    async def events(self, run_id: str) -> list[tuple[str, str]]:
        """(type, lane) of the run's events so far, in stream order."""
        return [(e.type, e.lane) async for e in self.client.events(run_id=run_id)]

    async def until(self, done: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not await done():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            await asyncio.sleep(0.1)

    async def all_last(self, run_ids: list[str], kind: str) -> bool:
        """Whether the latest event of every one of ``run_ids`` is ``kind``."""
        for run_id in run_ids:
            if [t for t, _ in await self.events(run_id)][-1:] != [kind]:
                return False
        return True

    async def reached(self, run_ids: list[str], kind: str) -> bool:
        """Whether every one of ``run_ids`` has a ``kind`` event."""
        for run_id in run_ids:
            if kind not in [t for t, _ in await self.events(run_id)]:
                return False
        return True


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    async with private_server(tmp_path) as (url, bus):
        await platformstore.put_text(bus, PLATFORM)
        await sign_as_local_user(bus)
        p = PipelineLoops(url, fetch_timeout=0.2)
        await p.connect("submitter", "run-record", "policy", "renderer", "admission-watcher", "local-cluster")
        svc = p.svc
        sub = Submitter(svc["submitter"])
        handlers = {"submitter": sub.on_requested, "policy": Policy(svc["policy"]).on_accepted,
                    "renderer": Renderer(svc["renderer"], LocalBackend(svc["renderer"])).on_event,
                    "admission-watcher": AdmissionWatcher(svc["admission-watcher"]).on_event}
        cluster = await one_node_cluster(svc["local-cluster"], tmp_path)
        handlers["local-cluster"] = cluster.on_backend
        gates = {durable: asyncio.Event() for durable in handlers}
        for durable, handler in handlers.items():
            stream = CONSUMERS[durable].stream
            default = p.consume(stream, durable, _held(gates[durable], handler), durable)
            p.consume(stream, LANE_DURABLES[durable], handler, durable, tails=default.tails)
        recorder = Recorder(svc["run-record"])
        projector = p.record(recorder=recorder)
        p.record("runstate-high", tails=projector.tails, recorder=recorder)
        p.every(0.1, cluster.tick)
        try:
            yield Pipeline(bus, Client(bus), gates)
        finally:
            for gate in gates.values():
                gate.set()
            await p.stop()
            await p.close()


def _held(gate: asyncio.Event, handler: Callable[[Event], Awaitable[None]]) -> Callable[[Event], Awaitable[None]]:
    async def held(ev: Event) -> None:
        await gate.wait()
        await handler(ev)

    return held


@pytest.mark.parametrize("stage", list(HELD_AT))
async def test_a_high_priority_run_passes_a_stage_whose_default_lane_is_held(pipeline: Pipeline, stage: str) -> None:
    for durable, gate in pipeline.gates.items():
        if durable != stage:
            gate.set()
    low = [await pipeline.client.submit_text(tau_yaml("sweep", "low"), name="sweep") for _ in range(BACKLOG)]
    held_at = HELD_AT[stage]

    await pipeline.until(lambda: pipeline.all_last(low, held_at), f"the sweep to queue at {stage}")
    high = await pipeline.client.submit_text(tau_yaml("urgent", "high"), name="urgent")
    await pipeline.until(lambda: pipeline.reached([high], "admission.admitted"), "the high run to be admitted")

    assert (await pipeline.events(high))[:4] == [("submit.requested", HIGH_LANE), ("submit.accepted", HIGH_LANE),
                                                 ("policy.approved", HIGH_LANE), ("render.applied", "")]
    stop = UNTIL_RENDERED.index(held_at) + 1
    for run_id in low:  # the whole backlog is still where it was held: nothing of it passed the stage
        assert await pipeline.events(run_id) == [(t, "") for t in UNTIL_RENDERED[:stop]]

    pipeline.gates[stage].set()
    await pipeline.until(lambda: pipeline.reached(low, "admission.admitted"), "the sweep to be admitted once released")
    for run_id in low:
        assert (await pipeline.events(run_id))[:4] == [(t, "") for t in UNTIL_RENDERED]


async def test_the_submitter_and_the_policy_decide_the_lane_a_client_claims(pipeline: Pipeline) -> None:
    for gate in pipeline.gates.values():
        gate.set()

    async def claim_high(name: str, priority: str) -> str:
        sid = new_submission_id()
        run_id = new_run_id(name, sid)
        req = SubmitRequested(submission_id=sid, config_text=tau_yaml(name, priority), config_path="tau.yaml",
                              workspace="default")
        await pipeline.bus.emit(workspace="default", run_id=run_id, attempt=1, event_type="submit.requested",
                                payload=req, lane=HIGH_LANE)
        return run_id

    sneaky = await claim_high("sneaky", "low")  # a low-priority run claiming the high lane
    normal = await claim_high("usual", "normal")  # the workspace's default: not above it
    refused = await claim_high("refused", "urgent")  # outranks the default, but the workspace may not use it
    honest = await pipeline.client.submit_text(tau_yaml("honest", "high"), name="honest")  # the client claims it
    await pipeline.until(lambda: pipeline.reached([sneaky, normal, honest], "render.applied"),
                         "the runs to be rendered")
    for run_id in (sneaky, normal):  # it skipped the submitter's queue only
        assert (await pipeline.events(run_id))[:4] == [("submit.requested", HIGH_LANE), ("submit.accepted", ""),
                                                       ("policy.approved", ""), ("render.applied", "")]
    assert (await pipeline.events(honest))[:4] == [("submit.requested", HIGH_LANE), ("submit.accepted", HIGH_LANE),
                                                   ("policy.approved", HIGH_LANE), ("render.applied", "")]

    await pipeline.until(lambda: pipeline.all_last([refused], "policy.rejected"),
                         "the policy to refuse the class the workspace does not allow")
    assert await pipeline.events(refused) == [("submit.requested", HIGH_LANE), ("submit.accepted", ""),
                                              ("policy.rejected", "")]


async def test_a_service_binds_each_lane_of_its_stage_with_one_per_run_order(pipeline: Pipeline) -> None:
    async def handler(ev: Event) -> None:
        del ev

    svc = Service(pipeline.bus)
    for durable in ("submitter", "policy", "renderer", "admission-watcher", "runstate", "local-cluster"):
        svc.consume(durable, handler)
    bound: list[tuple[str, str]] = [(loop.durable, loop.stream) for loop in svc.loops]
    assert bound == [("submitter", "RUNS"), ("submitter-high", "RUNS"), ("policy", "RUNS"), ("policy-high", "RUNS"),
                     ("renderer", "RUNS"), ("renderer-high", "RUNS"), ("admission-watcher", "K8S"),
                     ("admission-watcher-high", "K8S"), ("runstate", "RUNS"), ("runstate-high", "RUNS"),
                     ("local-cluster", "BACKEND"), ("local-cluster-high", "BACKEND")]
    loops: list[ConsumerLoop] = svc.loops
    assert all(loops[i].tails is loops[i + 1].tails for i in (0, 2, 4, 6, 8, 10))
    assert loops[0].tails is not loops[2].tails
    assert {CONSUMERS[d].filters[0] for d in LANE_DURABLES.values()} == {
        *(f"run.*.*.{kind}.{HIGH_LANE}" for kind in ("submit.requested", "submit.accepted", "policy.approved")),
        f"k8s.*.*.*.*.*.{HIGH_LANE}", f"run.*.*.*.*.{HIGH_LANE}", f"backend.local.*.{HIGH_LANE}"}
