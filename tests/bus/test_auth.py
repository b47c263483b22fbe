"""Authentication and least privilege, enforced by a real nats-server with auth on (tests/secure_nats.py)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from nats.js.api import StreamConfig

from taugrid.access import permissions
from taugrid.bus import history
from taugrid.bus.bootstrap import consumer_config
from taugrid.bus.topology import CONSUMERS, SOURCES_STORE, UPLOADS_STORE
from taugrid.client import Client
from taugrid.core.contracts import CancelRequested, Rejected, SubmitRequested
from taugrid.core.errors import PermissionDenied
from taugrid.core.ids import new_run_id
from taugrid.sources import snapshots
from tests.secure_nats import SecureNats

ROOT = Path(__file__).resolve().parents[2]


def _request(ws: str) -> SubmitRequested:
    return SubmitRequested(submission_id="s", config_text="name: x\n", config_path="tau.yaml", workspace=ws)


async def _stored(server: SecureNats, subject: str) -> int:
    """How many messages the RUNS stream holds on ``subject`` (read as the bootstrap identity)."""
    boot = await server.connect("bootstrap")
    try:
        info = await boot.js.stream_info("RUNS", subjects_filter=subject)
        return sum((info.state.subjects or {}).values())
    finally:
        await boot.close()


async def test_connecting_without_credentials_or_with_unknown_ones_is_refused(secure_nats, tmp_path):
    from taugrid.bus import connect, creds

    with pytest.raises(PermissionDenied, match="refused a connection without credentials"):
        await connect(secure_nats.url, name="anon", max_reconnect_attempts=0)
    stranger = creds.write(tmp_path / "stranger.nk", creds.new_identity("stranger"))
    with pytest.raises(PermissionDenied, match="stranger.nk"):
        await connect(secure_nats.url, name="stranger", creds=stranger, max_reconnect_attempts=0)


async def test_a_researcher_cannot_forge_a_policy_decision(secure_nats):
    alice = await secure_nats.connect("alice")
    run = new_run_id("forged", "f1")
    try:
        with pytest.raises(PermissionDenied, match="policy.approved"):
            await alice.emit(workspace="vision", run_id=run, attempt=1, event_type="policy.approved",
                             payload=Rejected(reasons=[], message="anything"))
        with pytest.raises(PermissionDenied, match="recovery.retrying"):
            await alice.emit(workspace="vision", run_id=run, attempt=2, event_type="recovery.retrying",
                             payload=Rejected(reasons=[], message="anything"))
        with pytest.raises(PermissionDenied, match="backend.local.apply"):
            await alice.publish("backend.local.apply", b"{}", event_type="apply", ce_subject=run, msg_id="x",
                                family="backend")
    finally:
        await alice.close()
    assert await _stored(secure_nats, f"run.vision.{run}.>") == 0


async def test_a_researcher_submits_and_cancels_only_in_their_workspaces(secure_nats):
    alice = await secure_nats.connect("alice")
    mine, theirs = new_run_id("mine", "m1"), new_run_id("theirs", "t1")
    try:
        seq = await alice.emit(workspace="vision", run_id=mine, attempt=1, event_type="submit.requested",
                               payload=_request("vision"))
        assert seq > 0
        await alice.emit(workspace="vision", run_id=mine, attempt=1, event_type="cancel.requested",
                         payload=CancelRequested(reason="r", requested_by="alice"))
        with pytest.raises(PermissionDenied, match="submit.requested"):
            await alice.emit(workspace="language", run_id=theirs, attempt=1, event_type="submit.requested",
                             payload=_request("language"))
        with pytest.raises(PermissionDenied, match="cancel.requested"):
            await alice.emit(workspace="language", run_id=theirs, attempt=1, event_type="cancel.requested",
                             payload=CancelRequested(reason="r", requested_by="alice"))
    finally:
        await alice.close()
    assert await _stored(secure_nats, f"run.vision.{mine}.>") == 2
    assert await _stored(secure_nats, f"run.language.{theirs}.>") == 0


async def test_a_researcher_reads_only_their_workspaces_events(secure_nats):
    bob = await secure_nats.connect("bob")
    run = new_run_id("bobs", "b1")
    seq = await bob.emit(workspace="language", run_id=run, attempt=1, event_type="submit.requested",
                         payload=_request("language"))
    await bob.close()
    boot = await secure_nats.connect("bootstrap")
    try:  # a replay reads HISTORY, whose feed copies the event from RUNS a moment after RUNS stored it
        await history.run_events(boot, "language", run, through=seq)
    finally:
        await boot.close()
    alice = Client(await secure_nats.connect("alice"))
    bob = Client(await secure_nats.connect("bob"))
    try:
        seen = [ev.type async for ev in bob.replay(f"run.language.{run}.>")]
        assert seen == ["submit.requested"]
        with pytest.raises(PermissionDenied, match=rf"consumer\.create\.history\.tau-\w+\.h\.language\.{run}"):
            [ev async for ev in alice.replay(f"run.language.{run}.>")]  # read from HISTORY (bus/history.py)
        with pytest.raises(PermissionDenied):  # every workspace at once is not theirs either
            [ev async for ev in alice.replay("run.>")]
        with pytest.raises(PermissionDenied):  # nor the logs, nor the AUDIT mirror
            [ev async for ev in alice.replay(f"log.language.{run}.*", stream="LOGS")]
        with pytest.raises(PermissionDenied):  # an unfiltered consumer, the classic bypass
            await alice.bus.guarded(alice.bus.js.subscribe(f"run.language.{run}.>", stream="AUDIT",
                                                           ordered_consumer=True))
        # Nor listening to the stream's subjects directly, or to another identity's inbox.
        for subject in ("run.>", "_INBOX.>", f"_INBOX.{secure_nats.identity('bob').public_key}.>"):
            await alice.bus.nc.subscribe(subject)
            with pytest.raises(PermissionDenied, match="subscription"):
                await alice.bus.guarded(asyncio.sleep(2))
    finally:
        await alice.close()
        await bob.close()


async def test_the_server_confines_the_filter_in_the_create_subject(secure_nats):
    """A consumer whose create subject names the caller's workspace but whose config filters another one is
    refused by the server itself (nats-server checks they match)."""
    alice = await secure_nats.connect("alice")
    try:
        req = b'{"stream_name":"RUNS","config":{"name":"sneaky","filter_subject":"run.language.>",' \
              b'"ack_policy":"none","deliver_policy":"all"}}'
        reply = await alice.guarded(alice.nc.request("$JS.API.CONSUMER.CREATE.RUNS.sneaky.run.vision.>", req,
                                                     timeout=5))
        assert b'"error"' in reply.data and b"filter" in reply.data.lower()
    finally:
        await alice.close()


async def test_only_a_platform_admin_may_apply_the_platform(secure_nats):
    alice, carol = await secure_nats.connect("alice"), await secure_nats.connect("carol")
    try:
        with pytest.raises(PermissionDenied, match="kv.platform"):
            await alice.guarded((await alice.kv("platform")).put("current", b"workspaces: []\n"))
        revision = await carol.guarded((await carol.kv("platform")).put("current", b"workspaces: []\n"))
        assert revision > 0
        entry = await (await alice.kv("platform")).get("current")  # reading it is fine
        assert entry.value == b"workspaces: []\n"
    finally:
        await alice.close()
        await carol.close()


async def test_each_service_does_its_stage_and_nothing_else(secure_nats):
    policy = await secure_nats.connect("policy")
    renderer = await secure_nats.connect("renderer")
    run = new_run_id("svc", "s1")
    try:
        await policy.emit(workspace="vision", run_id=run, attempt=1, event_type="policy.rejected",
                          payload=Rejected(reasons=[], message="no"))
        with pytest.raises(PermissionDenied, match="recovery.retrying"):
            await policy.emit(workspace="vision", run_id=run, attempt=2, event_type="recovery.retrying",
                              payload=Rejected(reasons=[], message="no"))
        with pytest.raises(PermissionDenied, match="kv.run_state"):
            await policy.guarded((await policy.kv("run_state")).put(f"run.{run}", b"{}"))
        # The renderer binds its own durable and reads what policy decided; it may not touch policy's durable.
        sub = await renderer.guarded(renderer.js.pull_subscribe_bind("renderer", stream="RUNS"))
        msgs = await sub.fetch(100, timeout=5)
        assert msgs, "the renderer's durable delivers"
        for msg in msgs:
            await msg.ack()
        theirs = await renderer.js.pull_subscribe_bind("policy", stream="RUNS")
        with pytest.raises(PermissionDenied, match="consumer.msg.next.runs.policy"):
            await renderer.guarded(theirs.fetch(1, timeout=5))
        with pytest.raises(PermissionDenied, match="policy.approved"):
            await renderer.emit(workspace="vision", run_id=run, attempt=1, event_type="policy.approved",
                                payload=Rejected(reasons=[], message="forged"))
        # Only the bootstrap identity changes what exists: streams, consumers, buckets.
        with pytest.raises(PermissionDenied, match="stream.create"):
            await renderer.guarded(renderer.js.add_stream(StreamConfig(name="EVIL", subjects=["evil.>"])))
        with pytest.raises(PermissionDenied, match="consumer"):
            await renderer.guarded(renderer.js.add_consumer("RUNS", consumer_config(CONSUMERS["policy"])))
        with pytest.raises(PermissionDenied, match="delete"):
            await renderer.guarded(renderer.js.delete_consumer("RUNS", "policy"))
    finally:
        await policy.close()
        await renderer.close()


async def test_the_source_fetch_identity_only_reads_source_snapshots(secure_nats):
    submitter, fetch = await secure_nats.connect("submitter"), await secure_nats.connect("source_fetch")
    evidence = await secure_nats.connect("evidence")
    try:
        await submitter.guarded((await submitter.objects(SOURCES_STORE)).put("sources/abc.tar.gz", b"snapshot"))
        got = await fetch.guarded((await fetch.objects(SOURCES_STORE)).get("sources/abc.tar.gz"))
        assert got.data == b"snapshot"
        await evidence.guarded((await evidence.objects()).put("runs/r1/bundle.json", b"{}"))
        with pytest.raises(PermissionDenied, match=r"obj_evidence"):
            await fetch.guarded((await fetch.objects()).get("runs/r1/bundle.json"))
        with pytest.raises(PermissionDenied, match=r"\$o\.sources"):
            await fetch.guarded((await fetch.objects(SOURCES_STORE)).put("sources/evil.tar.gz", b"x"))
        with pytest.raises(PermissionDenied, match="kv_run_state"):
            await fetch.guarded((await fetch.kv("run_state")).get("run.x"))
    finally:
        for b in (submitter, fetch, evidence):
            await b.close()


async def test_people_upload_snapshots_that_only_the_submitter_promotes_and_never_bundles(secure_nats):
    alice, evidence = await secure_nats.connect("alice"), await secure_nats.connect("evidence")
    submitter = await secure_nats.connect("submitter")
    try:
        await alice.guarded((await alice.objects(UPLOADS_STORE)).put("sources/def.tar.gz", b"mine"))
        with pytest.raises(PermissionDenied, match=r"\$o\.sources"):  # what runs is written by the submitter only
            await alice.guarded((await alice.objects(SOURCES_STORE)).put("sources/def.tar.gz", b"mine"))
        await evidence.guarded((await evidence.objects()).put("runs/r2/bundle.json", b"{}"))
        with pytest.raises(PermissionDenied, match=r"obj_evidence|\$o\.evidence"):
            await alice.guarded((await alice.objects()).put("runs/r2/bundle.json", b"forged"))
        with pytest.raises(PermissionDenied, match=r"stream\.purge\.obj_uploads"):
            await alice.guarded((await alice.objects(UPLOADS_STORE)).delete("sources/def.tar.gz"))
        assert (await (await evidence.objects()).get("runs/r2/bundle.json")).data == b"{}"
        # Someone planted other bytes under the name: the owner's upload replaces them (without the purge people
        # may not do), the submitter promotes the verified bytes, and nobody can replace them in `sources`.
        data = b"the real snapshot"
        name = f"sources/{hashlib.sha256(data).hexdigest()}.tar.gz"
        await alice.guarded((await alice.objects(UPLOADS_STORE)).put(name, b"planted"))
        with pytest.raises(snapshots.SourceMismatch, match="uploaded source snapshot"):
            await snapshots.promote(submitter, name, max_bytes=1 << 20)
        assert await snapshots.upload(alice, name, data) is True
        assert await snapshots.promote(submitter, name, max_bytes=1 << 20) == f"sha256:{name[8:72]}"
        assert await snapshots.fetch(alice, name) == data
        assert await snapshots.upload(alice, name, data) is False  # promoted: nothing to put again
        with pytest.raises(PermissionDenied, match=r"\$o\.sources"):
            await alice.guarded((await alice.objects(SOURCES_STORE)).put(name, b"planted"))
        assert await snapshots.fetch(alice, name) == data
    finally:
        for b in (alice, evidence, submitter):
            await b.close()


async def test_a_removed_user_is_refused_at_once_after_a_reload(secure_nats):
    dave = secure_nats.person("dave", "researcher", ["vision"])
    before = list(secure_nats.people)
    secure_nats.set_people([*before, dave])
    await asyncio.sleep(0.5)
    bus = await secure_nats.connect("dave")
    run = new_run_id("dave", "d1")
    try:
        await bus.emit(workspace="vision", run_id=run, attempt=1, event_type="submit.requested",
                       payload=_request("vision"))
        secure_nats.set_people(before)
        for _ in range(50):  # the server drops the live connection on reload
            if not bus.nc.is_connected:
                break
            await asyncio.sleep(0.1)
        assert not bus.nc.is_connected
        with pytest.raises(PermissionDenied, match="dave.nk"):
            await secure_nats.connect("dave")
    finally:
        await bus.nc.close()


def test_the_documented_permission_table_is_the_generated_one():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert permissions.markdown_table() in doc, (
        "regenerate: python -m taugrid.access.permissions >> the Identity section")


def test_every_durable_belongs_to_exactly_one_service():
    owners = [d for role in permissions.SERVICE_ROLES.values() for d in role.durables]
    assert sorted(owners) == sorted(CONSUMERS)


def test_the_rendered_config_admits_each_identity_by_key_only(secure_nats):
    text = secure_nats.auth_conf.read_text()
    assert text.count('"nkey": "U') == 2 + len(permissions.SERVICE_ROLES) + len(secure_nats.people)  # + break-glass
    assert "password" not in text
    assert not [name for name, i in secure_nats.identities.items() if i.seed in text]  # public keys only



def test_every_publishing_service_has_credentials_and_a_grant():
    from taugrid.core.publishing import SERVICE_PUBLISH

    assert {s.replace("-", "_") for s in SERVICE_PUBLISH} <= set(permissions.SERVICE_ROLES)


async def test_a_platform_admin_lists_dead_letters_but_only_the_bootstrap_identity_replays(secure_nats):
    from taugrid.bus import dlq
    from taugrid.core.errors import PermissionDenied

    admin = await secure_nats.connect("carol")
    researcher = await secure_nats.connect("alice")
    try:
        boot = await secure_nats.connect("bootstrap")
        try:
            await boot.js.publish("dlq.RUNS.nobody", b"{}", headers={"x-dlq-stream-seq": "1",
                                                                    "x-dlq-subject": "run.vision.r.submit.accepted",
                                                                    "x-dlq-error": "test"})
        finally:
            await boot.close()
        [letter] = [x for x in await dlq.dead_letters(admin) if x.durable == "nobody"]
        with pytest.raises(PermissionDenied):
            await dlq.dead_letters(researcher)
        with pytest.raises(PermissionDenied) as refused:
            await dlq.replay(admin, [letter.seq])
        assert "not allowed by your credentials" in str(refused.value)
    finally:
        await admin.close()
        await researcher.close()
