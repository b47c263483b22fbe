"""`tau top`: the view folds KV changes (run records, the queue snapshot, node states) it subscribes to; `--once
--output json` prints the first complete frame; a live `tau top` draws a new frame when a record changes; a
researcher's watch is confined to her workspaces' keys by the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import msgspec
import pytest

from taugrid.bus import Bus, PermissionDenied, kv
from taugrid.cli.top_cmd import SCHEMA, TopView, frame
from taugrid.core.states import RunRecord
from taugrid.health.wire import NodeState
from tests.secure_nats import SecureNats

TAU = [sys.executable, "-m", "taugrid.cli.main"]
NOW = 1_800_000_000.0
QUEUES = {"backend": "local", "node": "n1", "time": NOW, "queues": [{
    "cluster_queue": "cq", "cohort": "all", "nominal": {"cpu": 8.0, "nvidia.com/gpu": 2.0},
    "used": {"cpu": 1.0, "nvidia.com/gpu": 2.0}, "borrowed": {}, "lent": {}, "admitted": 1,
    "pending": [{"run_id": "top-wait", "workload": "top-wait-a1", "position": 0}]}]}


def _record(run_id: str, state: str, *, ws: str = "topws", created: float = NOW, **extra: object) -> bytes:
    return msgspec.json.encode(RunRecord(run_id=run_id, workspace=ws, state=state, created=created,
                                         updated=created, user="ann", **extra))  # type: ignore[arg-type]


async def _fill(bus: Bus) -> None:
    await kv.put(bus, "run_state", "run.topws.top-busy", _record("top-busy", "running", node="n1",
                                                                 cluster_queue="cq"))
    await kv.put(bus, "run_state", "run.topws.top-wait", _record("top-wait", "queued", position=0,
                                                                 cluster_queue="cq", created=NOW + 1))
    await kv.put(bus, "run_state", "run.topws.top-done", _record("top-done", "succeeded", finished=NOW + 5))
    await kv.put(bus, "local_cluster", "queues", msgspec.json.encode(QUEUES))
    await kv.put(bus, "node_state", "node.top-n1", msgspec.json.encode(NodeState(node="top-n1", expected_gpus=2)))


def test_the_view_folds_changes_and_deletions_into_one_frame() -> None:
    view = TopView()
    view.apply("run_state", "run.a.r1", _record("r1", "running", node="n1"))
    view.apply("run_state", "run.a.r2", _record("r2", "queued", position=2, created=NOW + 1))
    view.apply("run_state", "run.a.r3", _record("r3", "failed", finished=NOW + 3, reason="Error"))
    view.apply("run_state", "run.a.r2", None)
    view.apply("local_cluster", "queues", msgspec.json.encode(QUEUES))
    view.apply("node_state", "node.n1", msgspec.json.encode(NodeState(node="n1", expected_gpus=2)))
    snap = view.snapshot(now=NOW + 10, finished=5)
    assert snap["counts"] == {"failed": 1, "running": 1}
    assert [(r["run_id"], r["state"], r["duration_s"]) for r in snap["runs"]] == [("r1", "running", 10.0),
                                                                                  ("r3", "failed", 3.0)]
    assert snap["queues"][0] | {"nominal": None, "used": None} == {
        "cluster_queue": "cq", "cohort": "all", "nominal": None, "used": None, "borrowed": {}, "admitted": 1,
        "pending": 1, "next": ["top-wait"]}
    assert [(n["node"], n["gpus"], n["runs"]) for n in snap["nodes"]] == [("n1", 2, ["r1"])]
    text = frame(snap)
    assert "cq            all     2/2       1/8       1         1        top-wait" in text
    assert "r1   running  topws      ann   -      n1    10s" in text


def test_a_queued_runs_place_is_the_one_tau_queue_shows() -> None:
    """The record's position is refreshed only near the front of the line; the queue snapshot's is current, so
    `tau top` shows that one (#1 here, as `tau queue` does), and a run no longer queued shows none."""
    from taugrid.cli.queue_cmd import queue_view

    view = TopView()
    view.apply("run_state", "run.a.top-wait", _record("top-wait", "queued", position=4, created=NOW + 1))
    view.apply("run_state", "run.a.r1", _record("r1", "running", position=None))
    view.apply("local_cluster", "queues", msgspec.json.encode(QUEUES))
    snap = view.snapshot(now=NOW + 2, finished=5)
    assert [(r["run_id"], r["position"]) for r in snap["runs"]] == [("r1", None), ("top-wait", 0)]
    assert "queued #1" in frame(snap)
    assert "cq #1: top-wait" in queue_view(QUEUES, show_pending=5, now=NOW)


def test_tau_status_numbers_a_queued_runs_place_as_tau_queue_does() -> None:
    """The admission phase of `tau status` says #2 for the run with one ahead of it, as `tau queue` and `tau top`
    do (it said "position 1": the runs ahead)."""
    from taugrid.core.states import apply

    record = RunRecord(run_id="r2", workspace="a", state="rendered", attempt=1, created=NOW, updated=NOW)
    apply(record, "admission.queued", 1, {"reason": "WaitingForQuota", "position": 1, "message": "no cpu"}, NOW + 1)
    phase = next(p for p in record.phases if p.status == "active")
    assert (phase.detail, phase.hint) == ("WaitingForQuota — #2 in line — no cpu", "1 run(s) ahead of it")


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAU_")}
    return {**env, "TAU_NATS_URL": url, "TAU_DATA_DIR": "/nonexistent-tau-top"}


async def test_once_prints_the_current_view_as_json(bus: Bus, bootstrapped: str) -> None:
    await _fill(bus)
    proc = await asyncio.create_subprocess_exec(*TAU, "top", "--once", "--output", "json", env=_env(bootstrapped),
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    snap = json.loads(out)
    assert snap["schemaVersion"] == SCHEMA
    mine = [(r["run_id"], r["state"], r["position"]) for r in snap["runs"] if r["workspace"] == "topws"]
    assert mine == [("top-busy", "running", None), ("top-wait", "queued", 0), ("top-done", "succeeded", None)]
    assert [q["next"] for q in snap["queues"]] == [["top-wait"]]
    assert {"node": "top-n1", "gpus": 2, "runs": []}.items() <= next(
        n for n in snap["nodes"] if n["node"] == "top-n1").items()


async def test_a_live_view_redraws_when_a_record_changes(bus: Bus, bootstrapped: str) -> None:
    await _fill(bus)
    proc = await asyncio.create_subprocess_exec(*TAU, "top", env=_env(bootstrapped), stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        async def until(text: str) -> str:
            seen = ""
            while text not in seen:
                seen += (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()  # type: ignore[union-attr]
            return seen

        first = await until("NODES")
        assert "top-wait" in first and "top-late" not in first
        await kv.put(bus, "run_state", "run.topws.top-late", _record("top-late", "running", created=time.time()))
        assert "top-late" in await until("top-late")  # a new frame, drawn because the record was stored
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_researchers_watch_is_confined_to_her_workspaces(secure_nats: SecureNats) -> None:
    svc = await secure_nats.connect("run_record")  # the run_state projection's writer
    alice = await secure_nats.connect("alice")
    try:
        await kv.put(svc, "run_state", "run.vision.top-a", _record("top-a", "running", ws="vision"))
        await kv.put(svc, "run_state", "run.language.top-b", _record("top-b", "running", ws="language"))
        seen = []
        async for key, value in kv.watch(alice, "run_state", "run.vision.>"):
            if (key, value) == kv.CAUGHT_UP:
                break
            seen.append(key)
        assert seen == ["run.vision.top-a"]
        with pytest.raises(PermissionDenied):
            async for _ in kv.watch(alice, "run_state", "run.>"):
                break
    finally:
        await alice.close()
        await svc.close()


def test_on_a_hub_the_queues_are_each_sites_share_as_it_reports() -> None:
    from taugrid.config.platform import load_platform
    from taugrid.core.sitecapacity import QueueShare, SiteCapacity
    from tests.platforms import lab_platform

    hub = load_platform(lab_platform(clusters=[{"name": "east", "backend": "local", "preference": 1},
                                               {"name": "west", "backend": "local"}]))
    view = TopView(platform=hub)
    view.apply("site_capacity", "east", msgspec.json.encode(SiteCapacity(queues=[QueueShare(
        "lab", nominal={"cpu": 8.0}, used={"cpu": 1.0}, admitted=1, pending=2, first_pending=["w1", "w2"])])))
    view.apply("site_capacity", "west", msgspec.json.encode(SiteCapacity(queues=[QueueShare(
        "lab", nominal={"cpu": 4.0})])))
    rows = view.snapshot(now=NOW, finished=0)["queues"]
    assert rows == [
        {"cluster_queue": "lab @ west", "cohort": "", "nominal": {"cpu": 4.0}, "used": {}, "borrowed": {},
         "admitted": 0, "pending": 0, "next": []},
        {"cluster_queue": "lab @ east", "cohort": "", "nominal": {"cpu": 8.0}, "used": {"cpu": 1.0}, "borrowed": {},
         "admitted": 1, "pending": 2, "next": ["w1", "w2"]}]
    view.apply("site_capacity", "east", None)  # a record gone: its share goes with it
    assert [q["cluster_queue"] for q in view.snapshot(now=NOW, finished=0)["queues"]] == ["lab @ west"]
