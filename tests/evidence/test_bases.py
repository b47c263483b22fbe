"""Bundles stored against their workspace's base (``evidence/bases.py``), on a real nats-server: what runs of one
config share is stored once, every bundle still verifies and reads whole, a base changed or lost fails
``tau verify`` naming it, bundles of earlier releases still read, and the archive carries the base along."""

from __future__ import annotations

import gzip
import secrets
import uuid
from pathlib import Path

import pytest

from taugrid.bus import Bus, objects
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import from_message
from taugrid.bus.platformstore import put_text
from taugrid.bus.replay import replay
from taugrid.core import contracts as c
from taugrid.core.errors import PermissionDenied
from taugrid.evidence import bases, packing, store
from taugrid.evidence import ledger as lg
from taugrid.evidence.bundle import bundle_name
from taugrid.evidence.verify import verify_run
from taugrid_services.evidence.handlers import Evidence
from tests.evidence.test_evidence_service import publish_run
from tests.identity.test_scoped_reads import PLATFORM
from tests.owners import acting_as, emit_as_owner
from tests.secure_nats import SecureNats


async def seal(bus: Bus, ws: str, run: str, tmp_path: Path) -> str:
    """A run of the tests' one config, finished and sealed; its seal's digest."""
    await publish_run(bus, ws, run, tmp_path / run, log_lines=["epoch 1", f"loss of {run}", "done"])
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0))
    [m] = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run}.exec.succeeded")
    with acting_as(bus, "evidence"):  # evidence.sealed is the evidence service's to publish
        await Evidence(bus).on_event(from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream))
    ledger, _ = await store.load(bus, ws, run)
    assert ledger is not None and ledger.seal is not None
    return ledger.seal.digest


async def base_names(bus: Bus, ws: str) -> list[str]:
    return sorted(i.name for i in await (await bus.js.object_store("evidence")).list()
                  if i.name.startswith(f"bases/{ws}/") and not i.deleted)


async def test_two_runs_of_one_config_store_what_they_share_once(bus: Bus, tmp_path: Path) -> None:
    ws = f"dd{uuid.uuid4().hex[:6]}"
    runs = [f"train-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    digests = [await seal(bus, ws, run, tmp_path) for run in runs]

    [base] = await base_names(bus, ws)  # one base for the workspace, made from its first bundle
    stored = [await objects.read(bus, bundle_name(run)) for run in runs]
    assert all(s is not None and packing.base_of(s) == base for s in stored)
    canonical = [await store.read_bundle_bytes(bus, bundle_name(run)) for run in runs]
    assert [lg.sha256(data or b"") for data in canonical] == digests  # the seal covers the whole bundle
    # the second run stores only what is its own: a fraction of what its bundle takes compressed alone
    second, alone = stored[1] or b"", packing.pack(canonical[1] or b"")
    assert len(second) < 0.5 * len(alone)
    for run, digest in zip(runs, digests, strict=True):
        report = await verify_run(bus, run)
        assert (report.problems, report.ok, report.digest) == ([], True, digest)
        data, doc = await store.read_bundle(bus, run, workspace=ws)  # type: ignore[misc]  # tau evidence --save
        assert lg.sha256(data) == digest and doc["run_id"] == run and doc["config"]["text"].startswith("name: ")


async def test_a_changed_or_lost_base_fails_verify_naming_it(bus: Bus, tmp_path: Path) -> None:
    ws, run = f"dd{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"
    await seal(bus, ws, run, tmp_path)
    [base] = await base_names(bus, ws)
    dictionary = packing.dictionary_of(base, await objects.read(bus, base) or b"")

    forged = dictionary.replace(b'"exit_code":0', b'"exit_code":1')
    assert forged != dictionary
    await objects.write(bus, base, packing.pack(forged), workspace=ws)
    report = await verify_run(bus, run)
    assert (report.ok, report.problems) == (False, [
        f"bundle {bundle_name(run)}: its base {base} hashes to {lg.sha256(forged)[:12]}…: it was modified"])
    with pytest.raises(store.BundleModified, match=f"its base {base} hashes to"):
        await store.read_bundle(bus, run, workspace=ws)

    await objects.remove(bus, base)
    report = await verify_run(bus, run)
    assert (report.ok, report.problems) == (False, [
        f"bundle {bundle_name(run)}: its base {base} is missing from the evidence object store (and from the "
        f"evidence archive, when the platform names one)"])


async def test_bundles_stored_before_bases_still_read_and_verify(bus: Bus, tmp_path: Path) -> None:
    ws, run = f"dd{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"
    digest = await seal(bus, ws, run, tmp_path)
    data = await store.read_bundle_bytes(bus, bundle_name(run))
    assert data is not None
    for earlier in (packing.pack(data), data):  # gzip alone (the release before), plain JSON (before that)
        await objects.write(bus, bundle_name(run), earlier, workspace=ws)
        report = await verify_run(bus, run)
        assert (report.problems, report.ok, report.digest) == ([], True, digest)
        got = await store.read_bundle(bus, run, workspace=ws)
        assert got is not None and got[0] == data


async def test_a_workspace_whose_runs_change_gets_a_new_base_and_a_poor_match_stores_plain(bus: Bus) -> None:
    ws, writer = f"dd{uuid.uuid4().hex[:6]}", bases.Bases()
    kind_a = b'{"config":{"text":"name: a\\n"},"events":[' + b'{"type":"submit.requested","data":"a"},' * 60 + b"{}]}"
    unlike = [secrets.token_hex(800).encode() for _ in range(3)]  # nothing in common with anything

    first = await writer.pack(bus, ws, kind_a)
    [base_a] = await base_names(bus, ws)
    assert packing.base_of(first) == base_a and len(first) < 0.1 * len(kind_a)
    # the workspace's next bundles share nothing with its base: while it has made few, each makes its own
    made = [packing.base_of(await writer.pack(bus, ws, data)) for data in unlike[:2]]
    assert len(set(made)) == 2 and base_a not in made and len(await base_names(bus, ws)) == 3
    # then a poor match no longer replaces the base (at most one new base every REBASE_AFTER bundles): stored
    # as plain gzip when that is smaller, and it reads back as it was
    again = await writer.pack(bus, ws, unlike[2])
    assert again == packing.pack(unlike[2]) and await bases.unpack(bus, again) == unlike[2]
    assert len(await base_names(bus, ws)) == 3
    # every form reads back to its canonical bytes with its base
    assert await bases.unpack(bus, first) == kind_a


@pytest.fixture
async def private(private_bus: Bus) -> Bus:
    await bootstrap(private_bus, replicas=1)
    return private_bus


async def test_the_archive_copies_the_base_keeps_it_on_the_bus_and_verifies_from_it(private: Bus,
                                                                                    tmp_path: Path) -> None:
    bus, root = private, tmp_path / "archive"
    await put_text(bus, f"retention: {{evidence: {{archive: {{directory: {root}}}}}}}\n")
    ws = f"dd{uuid.uuid4().hex[:6]}"
    runs = [f"train-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    digests = [await seal(bus, ws, run, tmp_path) for run in runs]

    [base] = await base_names(bus, ws)  # the base stays on the bus: later bundles are stored against it
    assert [await objects.read(bus, bundle_name(run)) for run in runs] == [None, None]  # the bundles moved
    assert (root / base).read_bytes() == await objects.read(bus, base)  # the base was copied, as stored
    for run, digest in zip(runs, digests, strict=True):
        report = await verify_run(bus, run)
        assert (report.problems, report.ok, report.digest, report.archive) == ([], True, digest, f"directory {root}")

    # the bus's copy gone: the archive's is read, and checked the same way
    await objects.remove(bus, base)
    assert (await verify_run(bus, runs[0])).ok
    archived = root / base
    forged = b"{}" + packing.unpack(archived.read_bytes())
    archived.chmod(0o640)
    archived.write_bytes(gzip.compress(forged, mtime=0))
    report = await verify_run(bus, runs[1])
    assert (report.ok, report.problems) == (False, [
        f"bundle {bundle_name(runs[1])}: its base {base} hashes to {lg.sha256(forged)[:12]}…: it was modified "
        f"(read from the archive, directory {root})"])


async def test_a_base_is_readable_by_its_workspace_only(secure_nats: SecureNats) -> None:
    text = PLATFORM
    for who in ("alice", "bob", "carol"):
        text = text.replace(f"nkey: {who.upper()}", f"nkey: {secure_nats.identity(who).public_key}")
    boot, evidence, alice = [await secure_nats.connect(n) for n in ("bootstrap", "evidence", "alice")]
    try:
        await put_text(boot, text)
        bundle = b'{"config":{"text":"name: shared\\n"},"events":[' + b'{"type":"exec.running"},' * 50 + b"{}]}"
        mine, theirs = [await bases.Bases().pack(evidence, ws, bundle) for ws in ("vision", "language")]
        assert packing.base_of(mine).startswith("bases/vision/")
        assert await bases.unpack(alice, mine) == bundle  # her workspace's base, read through her grants
        with pytest.raises(PermissionDenied, match=r"consumer\.create\.obj_evidence\..*\.c\.language\."):
            await alice.guarded(bases.unpack(alice, theirs))
    finally:
        for b in (boot, evidence, alice):
            await b.close()
