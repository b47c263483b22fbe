"""People read only their workspaces' run records and ledgers: enforced by a real nats-server with auth on
(tests/secure_nats.py: alice researches in `vision`, bob in `language`, carol is a platform admin)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import msgspec
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, kv, objects, platformstore
from taugrid.client import Client
from taugrid.core.errors import NotFound, PermissionDenied
from taugrid.core.states import RunRecord
from taugrid.evidence import ledger as lg
from taugrid.evidence import store
from taugrid.evidence.bundle import bundle_name
from tests.platforms import lab_platform, workspace
from tests.secure_nats import SecureNats

PLATFORM = lab_platform(  # nkeys filled in by the fixture
    cohort=True, quota={"cpu": "8"}, compute_profiles=[],
    users=[{"name": "alice", "nkey": "ALICE"}, {"name": "bob", "nkey": "BOB"},
           {"name": "carol", "nkey": "CAROL", "role": "platform-admin"}],
    workspaces=[workspace("vision", default_profile=None, members=["alice"]),
                workspace("language", default_profile=None, members=["bob"])],
)


@pytest.fixture
async def runs(secure_nats: SecureNats) -> AsyncIterator[tuple[str, str]]:
    """One run record and one ledger in `vision` and in `language`, written by the services that own them;
    the platform names the people as secure_nats admits them."""
    text = PLATFORM
    for who in ("alice", "bob", "carol"):
        text = text.replace(f"nkey: {who.upper()}", f"nkey: {secure_nats.identity(who).public_key}")
    boot, recorder, evidence = [await secure_nats.connect(n) for n in ("bootstrap", "run_record", "evidence")]
    try:
        await platformstore.put_text(boot, text)
        mine, theirs = f"mine-{uuid.uuid4().hex[:6]}", f"theirs-{uuid.uuid4().hex[:6]}"
        for ws, run in (("vision", mine), ("language", theirs)):
            assert await runrecord.create(recorder, RunRecord(run_id=run, workspace=ws, state="running"))
            await store.update(evidence, ws, run, lambda led: led)  # a fresh ledger
            await objects.write(evidence, bundle_name(run), f'{{"run": "{run}"}}'.encode() * 40000, workspace=ws)
        yield mine, theirs
    finally:
        for b in (boot, recorder, evidence):
            await b.close()


async def _consumers(secure_nats: SecureNats, stream: str) -> int:
    boot = await secure_nats.connect("bootstrap")
    try:
        return int((await boot.js.stream_info(stream)).state.consumer_count)
    finally:
        await boot.close()


async def _person(secure_nats: SecureNats, name: str) -> tuple[Bus, Client]:
    bus = await secure_nats.connect(name)
    return bus, Client(bus)


async def test_a_researcher_reads_only_their_workspaces_records(secure_nats, runs):
    mine, theirs = runs
    alice, client = await _person(secure_nats, "alice")
    try:
        assert await client.readable_workspaces() == ["vision"]
        assert (await client.status(mine)).workspace == "vision"
        with pytest.raises(NotFound, match=f"run {theirs} not found in your workspaces"):
            await client.status(theirs)
        before = await _consumers(secure_nats, "KV_run_state")
        listed = await client.list()
        assert mine in {r.run_id for r in listed} and theirs not in {r.run_id for r in listed}
        assert {r.workspace for r in listed} == {"vision"}
        assert await _consumers(secure_nats, "KV_run_state") <= before  # each listing's consumer is deleted at once
        # The server itself refuses the reads, whatever the client would ask.
        with pytest.raises(PermissionDenied, match=r"kv_run_state\.\$kv\.run_state\.run\.language\."):
            await alice.guarded(runrecord.get(alice, "language", theirs))
        with pytest.raises(PermissionDenied, match=r"direct\.get\.kv_run_state\.\$kv\.run_state\.run\.\*\."):
            await alice.guarded(runrecord.find(alice, theirs))  # a wildcard lookup by id alone
        with pytest.raises(PermissionDenied, match=r"consumer\.create\.kv_run_state"):
            await alice.guarded(kv.values(alice, "run_state", RunRecord, prefix="run."))
        with pytest.raises(PermissionDenied, match=r"consumer\.create\.kv_run_state\..*run\.language"):
            await alice.guarded(runrecord.list_records(alice, workspaces=["language"]))
    finally:
        await alice.close()


async def test_a_researcher_reads_only_their_workspaces_ledgers(secure_nats, runs):
    mine, theirs = runs
    alice = await secure_nats.connect("alice")
    try:
        led, revision = await store.load(alice, "vision", mine)
        assert led == lg.Ledger(run_id=mine, workspace="vision") and revision > 0
        with pytest.raises(PermissionDenied, match=r"kv_ledger\.\$kv\.ledger\.run\.language\."):
            await alice.guarded(store.load(alice, "language", theirs))
        with pytest.raises(PermissionDenied, match=r"kv_ledger"):
            await alice.guarded(store.find(alice, theirs))
        with pytest.raises(PermissionDenied, match=r"kv\.ledger"):  # and writes none
            await alice.guarded((await alice.kv("ledger")).put(f"run.vision.{mine}", msgspec.json.encode({})))
    finally:
        await alice.close()


async def test_a_platform_admin_finds_any_run_by_id_and_lists_every_workspace(secure_nats, runs):
    mine, theirs = runs
    carol, client = await _person(secure_nats, "carol")
    try:
        assert await client.readable_workspaces() is None
        assert (await client.status(theirs)).workspace == "language"
        assert {mine, theirs} <= {r.run_id for r in await client.list()}
        found = await store.find(carol, theirs)
        assert found is not None and found.workspace == "language"
    finally:
        await carol.close()


async def test_a_researcher_reads_only_their_workspaces_bundles(secure_nats, runs):
    mine, theirs = runs
    alice = await secure_nats.connect("alice")
    carol = await secure_nats.connect("carol")
    try:
        before = await _consumers(secure_nats, "OBJ_evidence")  # (others' may linger until their threshold)
        got = await store.read_object(alice, bundle_name(mine))
        assert got == f'{{"run": "{mine}"}}'.encode() * 40000  # several chunks, all of them
        assert await _consumers(secure_nats, "OBJ_evidence") <= before
        with pytest.raises(PermissionDenied, match=r"consumer\.create\.obj_evidence\..*\.c\.language\."):
            await alice.guarded(store.read_object(alice, bundle_name(theirs)))
        with pytest.raises(PermissionDenied, match=r"stream\.msg\.get\.obj_evidence"):
            await alice.guarded((await alice.objects()).get(bundle_name(theirs)))  # nats-py's own reader
        assert await store.read_object(carol, bundle_name(theirs)) == f'{{"run": "{theirs}"}}'.encode() * 40000
        assert await store.read_object(alice, "runs/none/bundle.json") is None
    finally:
        await alice.close()
        await carol.close()
