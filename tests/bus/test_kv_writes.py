"""The KV writes of ``bus/kv.py`` against a real nats-server: create-once, compare-and-set, and a deleted key
created again (the writes go through ``Bus.replies``; a deleted key's create falls back to nats-py's)."""

from __future__ import annotations

import asyncio
import gzip
import uuid

import msgspec
import pytest

from taugrid.bus import Bus, kv
from taugrid.core import wirejson


async def test_create_once_compare_and_set_and_a_deleted_key_created_again(bus: Bus) -> None:
    key = f"kvw-{uuid.uuid4().hex[:8]}"
    first = await kv.create(bus, "submissions", key, b"one")
    assert first is not None
    assert await kv.create(bus, "submissions", key, b"two") is None  # exists: left alone
    with pytest.raises(kv.Conflict):
        await kv.save(bus, "submissions", key, b"two", revision=0)  # "must not exist yet"
    with pytest.raises(kv.Conflict):
        await kv.save(bus, "submissions", key, b"two", revision=first - 1 if first > 1 else first + 1000)
    second = await kv.save(bus, "submissions", key, b"two", revision=first)
    assert second > first and await kv.get(bus, "submissions", key) == kv.Record(value=b"two", revision=second)
    await kv.delete(bus, "submissions", key)
    assert await kv.get(bus, "submissions", key) is None
    third = await kv.create(bus, "submissions", key, b"three")  # its delete marker is a revision: reused
    assert third is not None and third > second
    assert await kv.get(bus, "submissions", key) == kv.Record(value=b"three", revision=third)


async def test_run_records_are_stored_compressed_and_every_reader_sees_their_json(bus: Bus) -> None:
    """issue 27: ``run_state`` values are stored gzip-compressed, their fields at defaults left out
    (``core/wirejson``); get, load, a listing, a wildcard read, an update and a watch all hand out that JSON, which
    decodes to the whole record (and a gate's summary of it), and a record stored plain (an earlier release's,
    defaults included) still reads as it is."""
    from taugrid.core.states import Phase, RunRecord
    from taugrid.runrecord.read import Summary

    ws = f"pk{uuid.uuid4().hex[:6]}"
    record = RunRecord(run_id="packed-1", workspace=ws, state="running",
                       phases=[Phase(name=f"phase-{i}", status="done", detail="node vm") for i in range(12)])
    plain = wirejson.encode(record)
    assert len(plain) < len(msgspec.json.encode(record)) and msgspec.json.decode(plain, type=RunRecord) == record
    assert msgspec.json.decode(plain, type=Summary) == Summary(state="running", attempt=1, user="")
    revision = await kv.save(bus, "run_state", f"run.{ws}.packed-1", record, revision=0)
    stored = await bus.js.get_msg("KV_run_state", seq=revision)
    assert stored.data[:2] == b"\x1f\x8b" and len(stored.data) < len(plain) // 2
    assert gzip.decompress(stored.data) == plain
    assert await kv.get(bus, "run_state", f"run.{ws}.packed-1") == kv.Record(value=plain, revision=revision)
    assert await kv.load(bus, "run_state", f"run.{ws}.packed-1", RunRecord) == (record, revision)
    assert await kv.last_by_wildcard(bus, "run_state", "run.*.packed-1") == plain
    old = RunRecord(run_id="plain-1", workspace=ws, state="succeeded")
    await bus.js.publish(f"$KV.run_state.run.{ws}.plain-1", msgspec.json.encode(old))  # as an earlier release wrote
    listed = await kv.filtered_values(bus, "run_state", RunRecord, key_filter=f"run.{ws}.*")
    assert sorted(listed, key=lambda r: r.run_id) == [record, old]
    watched = []
    async for key, value in kv.watch(bus, "run_state", f"run.{ws}.>"):
        if (key, value) == kv.CAUGHT_UP:
            break
        watched.append((key, value))
    assert sorted(watched) == [(f"run.{ws}.packed-1", plain), (f"run.{ws}.plain-1", msgspec.json.encode(old))]


async def test_a_key_written_with_a_ttl_and_a_purged_key_leave_nothing_behind(bus: Bus) -> None:
    """issue 27: a key created or put with a TTL, and a purge's marker, are removed by the server itself (a plain
    delete's marker stays: one indexed subject per key ever written); readers see the purge as a deletion."""
    base = f"kvt-{uuid.uuid4().hex[:8]}"
    created = await kv.create(bus, "local_cluster", f"{base}.a", b"one", ttl=1)
    put = await kv.put(bus, "local_cluster", f"{base}.b", b"two", ttl=1)
    assert created is not None and put > created
    assert (await bus.js.get_msg("KV_local_cluster", seq=created)).headers["Nats-TTL"] == "1"
    assert await kv.get(bus, "local_cluster", f"{base}.b") == kv.Record(value=b"two", revision=put)
    await kv.put(bus, "local_cluster", f"{base}.c", b"three")
    await kv.purge(bus, "local_cluster", f"{base}.c", marker_ttl=1)
    assert await kv.get(bus, "local_cluster", f"{base}.c") is None
    assert await kv.count_keys(bus, "local_cluster", f"{base}.*") == 3  # the purge marker is a subject, for now
    for _ in range(60):  # the server's TTL timer: about a second
        if await kv.count_keys(bus, "local_cluster", f"{base}.*") == 0:
            break
        await asyncio.sleep(0.1)
    assert await kv.count_keys(bus, "local_cluster", f"{base}.*") == 0
    assert await kv.create(bus, "local_cluster", f"{base}.c", b"again") is not None  # gone, so created anew


async def test_a_bucket_made_without_ttls_keeps_the_key_and_says_so(
        private_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    """A bucket an earlier nats-py made (no per-message TTLs) refuses the TTL header: the key is written without
    it, and the log names the fix."""
    from nats.js.api import DiscardPolicy, StreamConfig

    await private_bus.js.add_stream(StreamConfig(  # the bucket as nats-py made it before 2.11's TTLs
        name="KV_submissions", subjects=["$KV.submissions.>"], allow_direct=True, allow_rollup_hdrs=True,
        deny_delete=True, discard=DiscardPolicy.NEW, max_msgs_per_subject=1, duplicate_window=120.0))
    assert not (await private_bus.js.stream_info("KV_submissions")).config.allow_msg_ttl
    revision = await kv.create(private_bus, "submissions", "old-bucket", b"x", ttl=60)
    assert revision is not None
    assert "Nats-TTL" not in ((await private_bus.js.get_msg("KV_submissions", seq=revision)).headers or {})
    assert "bucket submissions was made without per-message TTLs" in caplog.text


async def test_matching_keys_lists_the_keys_of_a_filter_and_nothing_for_a_missing_bucket(bus: Bus) -> None:
    """``matching_keys`` lists a filter's keys (one stream-info request decoded into its subjects alone: a run's
    stored manifests, the services' keys): deleted keys count, other runs' keys do not, and a bucket that does not
    exist has no keys rather than an error."""
    run = f"mk-{uuid.uuid4().hex[:8]}"
    for ws in ("zeta", "alpha"):
        await kv.put(bus, "run_state", f"run.{ws}.{run}", b"{}")
    await kv.put(bus, "run_state", f"run.alpha.{run}-other", b"{}")
    await kv.delete(bus, "run_state", f"run.zeta.{run}")
    assert await kv.matching_keys(bus, "run_state", f"run.*.{run}") == [f"run.alpha.{run}", f"run.zeta.{run}"]
    assert await kv.count_keys(bus, "run_state", f"run.*.{run}") == 2
    assert await kv.matching_keys(bus, "run_state", f"run.*.{run}-none") == []
    assert await kv.matching_keys(bus, f"no-such-{run}", ">") == []
    assert await kv.count_keys(bus, f"no-such-{run}", ">") == 0


async def test_newest_key_is_the_key_of_a_filter_written_last_deleted_ones_included(bus: Bus) -> None:
    """The submitter and the run-record projection ask which workspace's record of a run id was written last
    (``newest_key``, one direct get whose subject is the filter): a delete counts as a write, other runs' keys do
    not, and a filter matching nothing, or a bucket that does not exist, has no newest key rather than an error."""
    run = f"nk-{uuid.uuid4().hex[:8]}"
    for ws in ("zeta", "alpha"):
        await kv.put(bus, "run_state", f"run.{ws}.{run}", b"{}")
    await kv.put(bus, "run_state", f"run.beta.{run}-other", b"{}")
    assert await kv.newest_key(bus, "run_state", f"run.*.{run}") == f"run.alpha.{run}"
    await kv.delete(bus, "run_state", f"run.zeta.{run}")
    assert await kv.newest_key(bus, "run_state", f"run.*.{run}") == f"run.zeta.{run}"
    assert await kv.newest_key(bus, "run_state", f"run.*.{run}-none") is None
    assert await kv.newest_key(bus, f"no-such-{run}", ">") is None
