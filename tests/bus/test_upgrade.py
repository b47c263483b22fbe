"""`tau up` on a data dir an earlier release made: the bootstrap narrows the evidence durable to the declared
filter, reports RUNS' missing direct gets and limits retention (the break-glass ``--update`` turns direct gets and
interest retention on), and the evidence reads a run's history either way (from HISTORY and AUDIT, whose feeds copy
RUNS' events from the first)."""

from __future__ import annotations

import logging

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DiscardPolicy, KeyValueConfig, RetentionPolicy, StreamConfig

from taugrid.bus import Bus, streams
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.topology import CONSUMERS
from taugrid.core import contracts as c
from taugrid.evidence import store
from tests.owners import emit_as_owner


async def test_an_earlier_release_s_stream_and_evidence_durable_upgrade(
    private_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # what the earlier release made: RUNS without direct gets, the evidence durable on every run event
    await private_bus.js.add_stream(StreamConfig(name="RUNS", subjects=["run.>"], max_age=30 * 86400.0))
    await private_bus.js.add_consumer("RUNS", ConsumerConfig(durable_name="evidence", ack_policy=AckPolicy.EXPLICIT,
                                                         filter_subject="run.>", max_deliver=8, ack_wait=60.0))
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    info = await private_bus.js.consumer_info("RUNS", "evidence")
    assert sorted(info.config.filter_subjects or []) == sorted(CONSUMERS["evidence"].filters)
    assert not (await private_bus.js.stream_info("RUNS")).config.allow_direct
    assert "stream RUNS: allow_direct is False, declared True; not changed" in caplog.text
    assert "stream RUNS: retention is 'limits', declared 'interest'; not changed" in caplog.text

    # the evidence reads the run back from HISTORY and AUDIT (both of r1's kinds here are AUDIT's: HISTORY holds only
    # r2's event), before RUNS allows direct gets and after
    await emit_as_owner(private_bus, workspace="ws", run_id="r1", attempt=1, event_type="cancel.requested",
                        payload=c.CancelRequested(reason="early"))
    await emit_as_owner(private_bus, workspace="ws", run_id="r2", attempt=1, event_type="exec.running",
                        payload=c.ExecRunning(node="box", pod="r2-0"))
    await emit_as_owner(private_bus, workspace="ws", run_id="r1", attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0))
    await emit_as_owner(private_bus, workspace="ws", run_id="r1", attempt=1, event_type="cancel.requested",
                        payload=c.CancelRequested(reason="late"))
    terminal = await streams.at(private_bus, "RUNS", 3)  # as the evidence durable delivers it
    assert terminal is not None and terminal.type == "exec.succeeded"
    want = [(1, "cancel.requested"), (3, "exec.succeeded")]
    assert [(ev.seq, ev.type) for ev in await store.run_history(private_bus, terminal)] == want

    assert await bootstrap(private_bus, update=True, replicas=1) == []
    runs = (await private_bus.js.stream_info("RUNS")).config
    assert runs.allow_direct and runs.retention == RetentionPolicy.INTEREST
    assert [(ev.seq, ev.type) for ev in await store.run_history(private_bus, terminal)] == want

    # the run's first event gone from RUNS (interest retention lets it go once its readers acked it): AUDIT, which
    # keeps the runs' requests, still gives it, at its RUNS sequence
    await private_bus.js.delete_msg("RUNS", 1)
    assert await streams.at(private_bus, "RUNS", 1) is None
    assert [(ev.seq, ev.type) for ev in await store.run_history(private_bus, terminal)] == want


async def test_a_run_state_bucket_made_with_five_revisions_keeps_one_after_the_update(
    private_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    # an earlier release's run_state: five revisions of every record
    kv = await private_bus.js.create_key_value(KeyValueConfig(bucket="run_state", history=5, direct=True))
    for state in ("submitted", "accepted", "approved", "succeeded"):
        await kv.put("run.ws.r1", state.encode())
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream KV_run_state: history is 5, declared 1; not changed" in caplog.text
    assert (await private_bus.js.stream_info("KV_run_state")).state.messages == 4

    assert await bootstrap(private_bus, update=True, replicas=1) == []
    info = await private_bus.js.stream_info("KV_run_state")
    assert (info.config.max_msgs_per_subject, info.state.messages) == (1, 1)
    assert (await kv.get("run.ws.r1")).value == b"succeeded"
    await kv.put("run.ws.r1", b"sealed")
    assert (await private_bus.js.stream_info("KV_run_state")).state.messages == 1


async def test_buckets_and_object_stores_get_a_one_second_duplicate_window_and_ttls(
    private_bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """issue 27: no write to a bucket or object store carries a message id, so the bootstrap makes them with a
    1 s duplicate window (nats-py's 2 min made the server re-read each one's last 2 min at a restart), buckets
    taking per-message TTLs; K8S keeps 120 s. One an earlier release made is reported, then set by --update."""
    from nats.js.api import ObjectStoreConfig

    await private_bus.js.add_stream(StreamConfig(  # a bucket as an earlier nats-py made it: 2 min, no TTLs
        name="KV_ledger", subjects=["$KV.ledger.>"], allow_direct=True, allow_rollup_hdrs=True, deny_delete=True,
        discard=DiscardPolicy.NEW, max_msgs_per_subject=1, duplicate_window=120.0))
    await private_bus.js.create_object_store("evidence", ObjectStoreConfig())
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert "stream KV_ledger: allow_msg_ttl is False, declared True; not changed" in caplog.text
    assert "stream KV_ledger: duplicate_window is 120.0, declared 1.0; not changed" in caplog.text
    assert "stream OBJ_evidence: duplicate_window is 120.0, declared 1.0; not changed" in caplog.text
    fresh = {name: (await private_bus.js.stream_info(name)).config
             for name in ("KV_run_state", "KV_submissions", "OBJ_sources", "OBJ_uploads", "K8S", "RUNS")}
    assert {name: config.duplicate_window for name, config in fresh.items()} == {
        "KV_run_state": 1.0, "KV_submissions": 1.0, "OBJ_sources": 1.0, "OBJ_uploads": 1.0, "K8S": 120.0,
        "RUNS": 600.0}
    assert fresh["KV_run_state"].allow_msg_ttl and fresh["KV_run_state"].allow_direct
    assert fresh["OBJ_uploads"].max_age == 24 * 3600.0

    assert await bootstrap(private_bus, update=True, replicas=1) == []
    ledger = (await private_bus.js.stream_info("KV_ledger")).config
    assert (ledger.duplicate_window, ledger.allow_msg_ttl) == (1.0, True)
    assert (await private_bus.js.stream_info("OBJ_evidence")).config.duplicate_window == 1.0
    kv = await private_bus.js.key_value("ledger")  # nats-py still takes them for what they are
    await kv.put("run.ws.r1", b"ledger")
    assert (await kv.get("run.ws.r1")).value == b"ledger"
    store = await private_bus.js.object_store("sources")
    await store.put("snap", b"bytes")
    assert (await store.get("snap")).data == b"bytes"
