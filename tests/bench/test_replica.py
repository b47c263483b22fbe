"""bench/replica.py: copies of a measured run as a real nats-server stores them, and the heap profile's reading."""

from __future__ import annotations

import asyncio
import base64
import importlib
import math
from pathlib import Path
from types import ModuleType

import msgspec
import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from taugrid.bus.bootstrap import audit_config, feed_config, history_config
from taugrid.bus.topology import FEEDS

BENCH = Path(__file__).resolve().parents[2] / "bench"
RUN = "store-0123456789abcdef"
SUBMISSION = "1a23600e41b30f4fcd93f19"
NUID = "00890b22d4deb6050774de"
NAME = f"runs/{RUN}/bundle.json"


@pytest.fixture
def replica(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as when bench/storage.py runs: its directory first on sys.path
    return importlib.import_module("replica")


SERVICE = ConsumerConfig(durable_name="runstate", ack_policy=AckPolicy.EXPLICIT, filter_subject="run.*.*.*.*")


async def _stored_run(url: str) -> None:
    """One measured run's messages as the stack stores them: two events (message ids), kept by HISTORY (one
    subject a run) and AUDIT through their feeds and acked by a service's durable, so RUNS (interest retention)
    keeps none; a KV key written by compare-and-set, a submission-id key, an object's chunk and metadata; and what
    names no measured run."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], retention=RetentionPolicy.INTEREST))
    for feed in FEEDS:
        await js.add_consumer("RUNS", feed_config(feed))
    await js.add_stream(history_config())
    await js.add_stream(audit_config())
    await js.add_consumer("RUNS", SERVICE)
    await js.add_stream(name="KV_submissions", subjects=["$KV.submissions.>"], allow_msg_ttl=True)
    await js.add_stream(name="OBJ_evidence", subjects=["$O.evidence.C.>", "$O.evidence.M.>"])
    await js.publish(f"run.bench.{RUN}.submit.requested", f'{{"submission_id":"{SUBMISSION}"}}'.encode(),
                     headers={"Nats-Msg-Id": "_dwoxaplRXT9_YGj", "ce-subject": RUN})
    await js.publish(f"run.bench.{RUN}.admission.queued", b"{}", headers={"Nats-Msg-Id": "tPs3rFsvOKH-R7Ff:89aab4db"})
    await js.publish("run.bench.warmup-0adbac18129867ef.submit.requested", b"{}")
    await js.publish(f"$KV.submissions.id.{RUN}", b"bench:1", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    await js.publish(f"$KV.submissions.{SUBMISSION}", RUN.encode(),
                     headers={"Nats-Expected-Last-Subject-Sequence": "0", "Nats-TTL": "86400"})
    await js.publish(f"$O.evidence.C.bench.{NUID}", b"\x1f\x8b bundle bytes")
    meta = {"name": NAME, "bucket": "evidence", "nuid": f"bench.{NUID}", "size": 16, "chunks": 1}
    await js.publish("$O.evidence.M." + base64.urlsafe_b64encode(NAME.encode()).decode(), msgspec.json.encode(meta))
    await _settled(nc, history=1, audit=2)
    service = await js.pull_subscribe_bind("runstate", stream="RUNS")
    for msg in await service.fetch(3, timeout=10):
        await msg.ack_sync()
    for _ in range(100):  # RUNS lets an event go once the last durable acked it
        if await _held(nc, "RUNS") == 0:
            break
        await asyncio.sleep(0.1)
    assert await _held(nc, "RUNS") == 0
    await nc.close()


async def _held(nc: nats.NATS, name: str) -> int:
    return int((await nc.jetstream().stream_info(name)).state.messages)


async def _settled(nc: nats.NATS, *, history: int, audit: int) -> None:
    """Until HISTORY holds ``history`` events and AUDIT ``audit`` (their feeds copy them from RUNS), 10 s at most."""
    for _ in range(100):
        if await _held(nc, "HISTORY") >= history and await _held(nc, "AUDIT") >= audit:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"HISTORY holds {await _held(nc, 'HISTORY')} events, not {history}; AUDIT "
                         f"{await _held(nc, 'AUDIT')}, not {audit}")


async def _after_copies(url: str) -> tuple[int, int, int, ConsumerConfig, int]:
    """(RUNS', HISTORY's and AUDIT's messages, the service durable's settings and pending events)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.consumer_info("RUNS", "runstate")
        return (await _held(nc, "RUNS"), await _held(nc, "HISTORY"), await _held(nc, "AUDIT"), info.config,
                int(info.num_pending or 0))
    finally:
        await nc.close()


def test_a_copy_is_the_run_under_new_ids_of_the_same_length_and_the_server_stores_it(
        replica: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica, "DRAIN_S", 30.0)  # a RUNS the feeds do not drain fails in 30 s, not an hour
    store = tmp_path / "js"
    with replica.server(store, tmp_path / "nats.log") as (url, _proc, _prof):
        asyncio.run(_stored_run(url))
    found = replica.measured(store, tmp_path / "nats.log")
    assert [(t.run_id, t.submission_id, t.nuids, len(t.messages)) for t in found] == [
        (RUN.encode(), SUBMISSION.encode(), [NUID.encode()], 6)]

    copy = replica.copy_of(found[0])
    (new_run,) = {s.split(".")[2] for s, _, _ in copy if s.startswith("run.")}
    assert new_run != RUN and len(new_run) == len(RUN) and new_run.startswith("store-")
    by_subject = {s: (h, d) for s, h, d in copy}
    requested = by_subject[f"run.bench.{new_run}.submit.requested"]
    new_submission = msgspec.json.decode(requested[1])["submission_id"]
    assert new_submission != SUBMISSION and len(new_submission) == len(SUBMISSION)
    assert requested[0]["ce-subject"] == new_run
    assert requested[0]["Nats-Msg-Id"] != "_dwoxaplRXT9_YGj" and len(requested[0]["Nats-Msg-Id"]) == 16
    queued_id = by_subject[f"run.bench.{new_run}.admission.queued"][0]["Nats-Msg-Id"]
    assert queued_id.endswith(":89aab4db") and len(queued_id) == len("tPs3rFsvOKH-R7Ff:89aab4db")
    assert by_subject[f"$KV.submissions.id.{new_run}"] == ({}, b"bench:1")  # no compare-and-set in a copy
    assert by_subject[f"$KV.submissions.{new_submission}"] == ({"Nats-TTL": "86400"}, new_run.encode())
    new_name = NAME.replace(RUN, new_run)
    meta = msgspec.json.decode(by_subject["$O.evidence.M." + base64.urlsafe_b64encode(new_name.encode()).decode()][1])
    new_nuid = meta["nuid"].split(".")[1]
    assert meta["name"] == new_name and new_nuid != NUID and len(new_nuid) == len(NUID)
    assert by_subject[f"$O.evidence.C.bench.{new_nuid}"] == ({}, b"\x1f\x8b bundle bytes")
    assert len(copy) == 6

    assert not any("Nats-Stream-Source" in h for _, h, _ in copy)  # a publish carrying it is refused

    replica.add_copies(store, tmp_path / "nats.log", found, 0, 3)  # raises if the server refused one
    assert sorted(t.run_id.decode()[:6] for t in replica.measured(store, tmp_path / "nats.log")) == ["store-"] * 4
    with replica.server(store, tmp_path / "nats.log") as (url, _proc, _prof):
        runs, history, audit, service, pending = asyncio.run(_after_copies(url))
    # the feeds took every copied event out of RUNS: into HISTORY the run's admission.queued and its 3 copies,
    # into AUDIT the submit.requested it keeps and HISTORY does not (the warm-up's, the run's, 3 copies), and the
    # service's durable, deleted while the copies were published, is back with its settings and nothing pending
    assert (runs, history, audit, pending) == (0, 1 + 3, 1 + 1 + 3, 0)
    assert (service.filter_subject, service.ack_policy) == ("run.*.*.*.*", AckPolicy.EXPLICIT)


PROFILE = """heap profile: 3: 8390656 [3: 8390656] @ heap/1048576
1: 8388608 [1: 8388608] @ 0x1 0x2
#\t0x1\tgithub.com/nats-io/nats-server/v2/server.getMsgBlockBuf+0x47\t/src/server/filestore.go:1087
#\t0x2\tgithub.com/nats-io/nats-server/v2/server.(*msgBlock).loadBlock+0x156\t/src/server/filestore.go:6000

2: 2048 [2: 2048] @ 0x3 0x4
#\t0x3\tgithub.com/nats-io/nats-server/v2/server/stree.newLeaf[...]+0x7fa\t/src/server/stree/leaf.go:27
#\t0x4\tgithub.com/nats-io/nats-server/v2/server.(*fileStore).recoverFullState+0x3350\t/src/server/filestore.go:2000


# runtime.MemStats
# Alloc = 123456
# HeapAlloc = 123456
# HeapSys = 654321
# PauseNs = [1 2 3]
"""


def test_the_heap_profile_is_read_by_kind_scaled_for_sampling_as_pprof_scales_it(replica: ModuleType) -> None:
    stats, kinds = replica.by_kind(PROFILE)
    assert stats == {"Alloc": 123456, "HeapAlloc": 123456, "HeapSys": 654321}
    rate = 524288
    assert [k.kind for k in kinds] == ["loaded message blocks", "per-subject index (psim)"]  # most bytes first
    blocks, psim = kinds
    assert psim.bytes == pytest.approx(2048 / (1 - math.exp(-1024 / rate)), rel=1e-12)
    assert psim.objects == pytest.approx(2 / (1 - math.exp(-1024 / rate)), rel=1e-12)
    assert blocks.bytes == pytest.approx(8388608 / (1 - math.exp(-8388608 / rate)), rel=1e-12)
    assert replica.classify(["runtime.mallocgc+0x104"]) == "other"
