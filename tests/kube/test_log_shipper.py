"""The log shipper over real HTTP (kmock pod log endpoint) and a real nats-server: every container of a tau pod
(init container first) lands on LOGS as the local backend ships it, and a restart mid-stream — even one between
a publish and its checkpoint — neither loses nor doubles a line."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from taugrid.bus import Bus, kv
from taugrid.bus.replay import replay
from taugrid.core.contracts import LogChunk
from taugrid.evidence.bundle import render_logs
from taugrid.kube.podlogs import Position
from taugrid_services.log_shipper.shipper import BUCKET, LogShipper, position_key

PODS = ("", "v1", "pods")
NS = "team-a"


def ts(second: int, nanos: int = 0) -> str:
    return f"2026-11-30T11:00:{second:02d}" + (f".{nanos:09d}".rstrip("0") if nanos else "") + "Z"


def tau_pod(run_id: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"taugrid.io/managed-by": "taugrid", "taugrid.io/run-id": run_id,
                       "taugrid.io/workspace": "team-a", "taugrid.io/attempt": "1"},
        },
        "spec": {"initContainers": [{"name": "tau-source-fetch", "image": "t"}],
                 "containers": [{"name": "main", "image": "p"}]},
        "status": {"phase": "Pending"},
    }


def set_states(fake: Any, name: str, *, init: str, main: str | None, phase: str) -> None:
    def states(state: str) -> dict[str, Any]:
        return {"terminated": {"exitCode": 0, "reason": "Completed"}} if state == "terminated" else {
            state: {}}

    def change(pod: dict[str, Any]) -> None:
        pod["status"] = {"phase": phase,
                         "initContainerStatuses": [{"name": "tau-source-fetch", "state": states(init)}]}
        if main:
            pod["status"]["containerStatuses"] = [{"name": "main", "state": states(main)}]

    fake.modify(PODS, NS, name, change)


async def shipped(bus: Bus, run_id: str) -> list[LogChunk]:
    msgs = await replay(bus, stream="LOGS", subject=f"log.team-a.{run_id}.1")
    return [msgspec.json.decode(m.data, type=LogChunk) for m in msgs]


async def lines_of(bus: Bus, run_id: str) -> list[str]:
    return [line for ch in await shipped(bus, run_id) for line in ch.lines]


async def until(cond: Callable[[], Any], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.05)


async def test_init_and_main_logs_ship_in_order_across_restarts_without_gap_or_duplicate(
    fake_kube: Any, bus: Bus
) -> None:
    fake, api_client = fake_kube
    run_id, pod = f"logs-{uuid.uuid4().hex[:8]}", "logs-a1-xk2p9"
    fake.put(PODS, tau_pod(run_id, pod))
    logs = fake.logs
    logs.write(NS, pod, "tau-source-fetch", ts(1), "source sha256:ab: 3 files in /tau/source")
    logs.finish(NS, pod, "tau-source-fetch")
    set_states(fake, pod, init="terminated", main="running", phase="Running")
    for i in range(3):
        logs.write(NS, pod, "main", ts(2, 5), f"epoch {i}")  # three lines with one timestamp

    first = LogShipper(api_client, bus, flush_s=0.05)
    await first.start()
    try:
        await until(lambda: _count(bus, run_id, 4))
        logs.write(NS, pod, "main", ts(2, 5), "epoch 3")  # the same timestamp again, after the restart point
        await until(lambda: _count(bus, run_id, 5))
    finally:
        await first.stop()

    # Lines written while no shipper runs: same second as the last shipped one, and later.
    logs.write(NS, pod, "main", ts(2, 5), "epoch 4")
    logs.write(NS, pod, "main", ts(2, 7), "epoch 5")
    logs.write(NS, pod, "main", ts(3), "epoch 6")
    second = LogShipper(api_client, bus, flush_s=0.05)
    await second.start()
    try:
        await until(lambda: _count(bus, run_id, 8))
        logs.drop()  # the API server cuts the stream: the shipper resumes with sinceTime
        logs.write(NS, pod, "main", ts(3), "epoch 7")
        logs.write(NS, pod, "main", ts(4), "done")
        logs.finish(NS, pod, "main")
        set_states(fake, pod, init="terminated", main="terminated", phase="Succeeded")
        await until(lambda: _count(bus, run_id, 10))
        await until(lambda: _done(bus, fake, pod))
    finally:
        await second.stop()

    assert await lines_of(bus, run_id) == [
        "source sha256:ab: 3 files in /tau/source",
        *[f"epoch {i}" for i in range(8)],
        "done",
    ]
    chunks = await shipped(bus, run_id)
    assert [(c.run_id, c.attempt, c.pod, c.stream) for c in chunks] == [(run_id, 1, pod, "stdout")] * len(chunks)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    # The evidence bundle reads them as it reads the local backend's.
    text, count = render_logs(chunks)
    assert (text, count) == ("\n".join(await lines_of(bus, run_id)) + "\n", len(chunks))
    assert any(r.get("sinceTime") == ts(2) for r in logs.requests)  # resumed from the second, not from 0
    assert all(r["timestamps"] == "true" for r in logs.requests)


async def test_a_crash_between_publish_and_checkpoint_publishes_the_same_chunk_again(
    fake_kube: Any, bus: Bus
) -> None:
    fake, api_client = fake_kube
    run_id, pod = f"logs-{uuid.uuid4().hex[:8]}", "crash-a1-x"
    fake.put(PODS, tau_pod(run_id, pod))
    set_states(fake, pod, init="terminated", main="running", phase="Running")
    fake.logs.finish(NS, pod, "tau-source-fetch")
    for i in range(4):
        fake.logs.write(NS, pod, "main", ts(5, i + 1), f"line {i}")
    shipper = LogShipper(api_client, bus, flush_s=0.2)
    await shipper.start()
    try:
        await until(lambda: _count(bus, run_id, 4))
    finally:
        await shipper.stop()
    uid = fake.objects[(PODS, NS, pod)]["metadata"]["uid"]
    before = await shipped(bus, run_id)
    assert [c.lines for c in before] == [["line 0", "line 1", "line 2", "line 3"]]

    # Put the position back to "chunk 0 (4 lines) being published": what a crash right after publish leaves.
    stored, revision = await kv.load(bus, BUCKET, position_key(uid), Position)
    assert stored is not None and stored.seq == 1
    crashed = Position(container=stored.container, seq=0, pending=4)
    await kv.save(bus, BUCKET, position_key(uid), crashed, revision=revision)
    fake.logs.write(NS, pod, "main", ts(6), "line 4")
    again = LogShipper(api_client, bus, flush_s=0.2)
    await again.start()
    try:
        await until(lambda: _count(bus, run_id, 5))
        await asyncio.sleep(0.5)
    finally:
        await again.stop()
    assert [c.lines for c in await shipped(bus, run_id)] == [["line 0", "line 1", "line 2", "line 3"], ["line 4"]]


async def test_a_deleted_pod_forgets_its_position_and_foreign_pods_are_ignored(fake_kube: Any, bus: Bus) -> None:
    fake, api_client = fake_kube
    run_id, pod = f"logs-{uuid.uuid4().hex[:8]}", "gone-a1-x"
    fake.put(PODS, tau_pod(run_id, pod))
    foreign = copy.deepcopy(tau_pod(run_id, "foreign"))
    del foreign["metadata"]["labels"]["taugrid.io/run-id"]
    fake.put(PODS, foreign)
    set_states(fake, pod, init="terminated", main="running", phase="Running")
    fake.logs.finish(NS, pod, "tau-source-fetch")
    fake.logs.write(NS, pod, "main", ts(7), "hello")
    shipper = LogShipper(api_client, bus, flush_s=0.05)
    await shipper.start()
    try:
        await until(lambda: _count(bus, run_id, 1))
        uid = fake.objects[(PODS, NS, pod)]["metadata"]["uid"]
        assert (await kv.load(bus, BUCKET, position_key(uid), Position))[0] is not None
        fake.remove(PODS, NS, pod)

        async def forgotten() -> bool:
            return (await kv.load(bus, BUCKET, position_key(uid), Position))[0] is None

        await until(forgotten)
    finally:
        await shipper.stop()
    assert {r["pod"] for r in fake.logs.requests} == {pod}


async def _count(bus: Bus, run_id: str, n: int) -> bool:
    return len(await lines_of(bus, run_id)) >= n


async def _done(bus: Bus, fake: Any, pod: str) -> bool:
    uid = fake.objects[(PODS, NS, pod)]["metadata"]["uid"]
    stored, _ = await kv.load(bus, BUCKET, position_key(uid), Position)
    return stored is not None and stored.done
