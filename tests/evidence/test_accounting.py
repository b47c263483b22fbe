"""The sealed evidence bundle carries the run's accounting (queue wait, running time, GPU-seconds, cost at the
price of the platform revision the run was approved against), and ``tau verify`` recomputes it from the bundle's
events. Over a nats-server of its own, so the platform revision (and its price) is this test's."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import subprocess
from pathlib import Path

import msgspec

from taugrid.bus import Bus, connect, history, identity, platformstore
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import Event
from taugrid.core import contracts as c
from taugrid.evidence import store
from taugrid.evidence.bundle import accounting
from taugrid.evidence.verify import _check_accounting, verify_run
from taugrid_services.evidence.handlers import Evidence
from tests.evidence.test_evidence_service import fed
from tests.owners import emit_as_owner
from tests.platforms import lab_platform

PLATFORM = lab_platform(cohort=True, compute_profiles=[{"name": "a100-2", "gpu": 2, "gpu_hour_price": "PRICE"}])


def _at(ev: Event) -> float:
    return dt.datetime.fromisoformat(ev.time.replace("Z", "+00:00")).timestamp()


async def _run_events(bus: Bus, ws: str, run: str) -> list[Event]:
    # as HISTORY keeps them, where the seal reads them: with their stored time (a service's event stamped "now" is
    # timed by the store), in RUNS' order at their RUNS sequences
    await fed(bus)
    return await history.run_events(bus, ws, run)


async def test_the_bundle_carries_the_runs_accounting_and_verify_recomputes_it(
        fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    bus = await connect(f"nats://127.0.0.1:{fresh_nats[1]}", name="test")
    sealer = await connect(f"nats://127.0.0.1:{fresh_nats[1]}", name="evidence")
    bus.seed = identity.new_user_seed()  # the submission is signed, as the client signs it
    try:
        await bootstrap(bus)
        revision = await platformstore.put_text(bus, PLATFORM.replace("PRICE", "3.6"))
        await platformstore.put_text(bus, PLATFORM.replace("PRICE", "99"))  # a later price must not be used
        ws, run = "team", "train-0123456789abcdef"
        resolved = c.ResolvedRun(run_id=run, submission_id="s1", workspace=ws, namespace="default", name="train",
                                 profile="a100-2", cluster_queue="lab", resources=c.Resources(gpu=2),
                                 platform_revision=revision)
        steps: list[tuple[str, msgspec.Struct, float]] = [
            ("submit.requested", c.SubmitRequested(submission_id="s1", config_text="name: train\n", workspace=ws),
             0.0),
            ("submit.accepted", c.SubmitAccepted(submission_id="s1", config={"name": "train"}, config_hash="h",
                                                 user="ada", signer=identity.public_key(bus.seed)), 0.0),
            ("policy.approved", c.PolicyApproved(run=resolved, platform_revision=revision), 0.0),
            ("admission.admitted", c.AdmissionAdmitted(cluster_queue="lab", topology=[c.PodSetTopology(
                pod_set="main", levels=["kubernetes.io/hostname"],
                domains=[c.TopologyDomain(values=["box"], count=1)])]), 0.2),  # queued ≥ 0.2 s
            ("exec.running", c.ExecRunning(node="box", pod=f"{run}-a1-0", pid=42), 0.0),
            ("exec.succeeded", c.ExecFinished(exit_code=0, reason="Completed", node="box"), 0.4),  # ran ≥ 0.4 s
        ]
        for kind, payload, wait in steps:
            await asyncio.sleep(wait)
            await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type=kind, payload=payload,
                                user="ada")
        events = await _run_events(bus, ws, run)
        evidence = Evidence(sealer)
        for ev in events:  # as the evidence service's consumer delivers them
            await evidence.on_event(ev)

        at = {ev.type: _at(ev) for ev in events}
        queued = round(at["admission.admitted"] - at["submit.requested"], 3)
        running = round(at["exec.succeeded"] - at["exec.running"], 3)
        assert queued >= 0.2 and running >= 0.4
        got = await store.read_bundle(bus, run)
        assert got is not None
        _, doc = got
        assert doc["accounting"] == {
            "queued_s": queued, "running_s": running, "gpus": 2.0, "gpu_seconds": round(2 * running, 3),
            "profile": "a100-2", "queue": "lab", "gpu_hour_price": 3.6, "price_revision": revision,
            "cost": round(2 * running / 3600 * 3.6, 6), "clock": "ce-time",
        }

        # the evidence records where admission placed the attempt (Kueue's topology assignment, by pod set)
        assert doc["attempts"][0]["admitted"] == {"cluster_queue": "lab", "flavors": {}, "node": "", "topology": [
            {"pod_set": "main", "levels": ["kubernetes.io/hostname"], "domains": [{"values": ["box"], "count": 1}]}]}
        report = await verify_run(bus, run)
        assert (report.ok, report.problems) == (True, [])
        assert report.accounting == doc["accounting"]

        forged = copy.deepcopy(doc)
        forged["accounting"]["gpu_seconds"] = 0.5
        assert _check_accounting(forged) == [
            f"bundle accounting gpu_seconds is 0.5, its events give {round(2 * running, 3)!r}"]
        shifted = copy.deepcopy(doc)  # an event's time moved: the recomputed queue wait no longer matches
        shifted["events"][0]["time"] = "2000-01-01T00:00:00.000Z"
        assert [p.split(" is ")[0] for p in _check_accounting(shifted)] == ["bundle accounting queued_s"]
    finally:
        await sealer.close()
        await bus.close()


def test_a_resized_runs_bundle_accounting_counts_the_gpus_held_between_resizes() -> None:
    run = msgspec.to_builtins(c.ResolvedRun(run_id="e", submission_id="s", workspace="ws", namespace="ns", name="e",
                                            profile="a100-1", resources=c.Resources(gpu=1), nodes=3))
    records = [{"type": "submit.requested", "time": "2026-12-01T10:00:00Z", "data": {}},
               {"type": "policy.approved", "time": "2026-12-01T10:00:01Z", "data": {"run": run}},
               {"type": "admission.admitted", "time": "2026-12-01T10:00:02Z", "data": {}},
               {"type": "exec.running", "time": "2026-12-01T10:00:10Z", "data": {}},
               {"type": "exec.resized", "time": "2026-12-01T10:00:20Z",
                "data": {"old_count": 3, "new_count": 2, "cause": "ShrunkForPreemptor"}},
               {"type": "exec.resized", "time": "2026-12-01T10:00:40Z", "data": None},  # undecodable: no change
               {"type": "exec.succeeded", "time": "2026-12-01T10:01:00Z", "data": {}}]
    acc = accounting("e", "ws", records, gpu_hour_price=3.6, price_revision=1)
    assert (acc["gpus"], acc["running_s"], acc["gpu_seconds"], acc["cost"]) == (3.0, 50.0, 3 * 10 + 2 * 40, 0.11)
