"""A sealed run's evidence archived out of the bus (a directory; an S3 server), on a real nats-server: the bus
keeps only the ledger and its digest, ``tau verify``'s checks and ``tau evidence``'s read find the archived
bundle, and a changed archive fails verification naming it."""

from __future__ import annotations

import asyncio
import gzip
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from taugrid.bus import Bus, auditread, objects
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import from_message
from taugrid.bus.platformstore import put_text
from taugrid.bus.replay import replay
from taugrid.config.retention import Archive, S3Location
from taugrid.core import contracts as c
from taugrid.core.errors import PermanentError, PermissionDenied, TemporaryError
from taugrid.core.states import RunRecord
from taugrid.evidence import archive, store
from taugrid.evidence.bundle import INLINE_LOG_BYTES, bundle_name
from taugrid.evidence.verify import verify_run
from taugrid_services.evidence.handlers import Evidence
from taugrid_services.portal import reads
from tests.evidence.test_evidence_service import publish_run
from tests.owners import acting_as, emit_as_owner
from tests.secure_nats import SecureNats

LINES = [f"line {i:06d} " + "x" * 60 for i in range(INLINE_LOG_BYTES // 60)]  # stored as its own log object


@pytest.fixture
async def bus(private_bus: Bus) -> AsyncIterator[Bus]:
    """A bootstrapped private server: the archive is set in its platform, never in the session's."""
    await bootstrap(private_bus, replicas=1)
    yield private_bus


async def seal_a_run(bus: Bus, tmp_path: Path) -> tuple[str, str]:
    ws, run = f"ar{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"
    await publish_run(bus, ws, run, tmp_path, log_lines=LINES)
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0))
    [m] = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run}.exec.succeeded")
    terminal = from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
    with acting_as(bus, "evidence"):  # evidence.sealed is the evidence service's to publish
        await Evidence(bus).on_event(terminal)
        await Evidence(bus).on_event(terminal)  # a redelivery finds it sealed and archived: nothing changes
    return ws, run


async def sealed_digest(bus: Bus, ws: str, run: str) -> str:
    """The seal's digest as AUDIT keeps it: AUDIT sources RUNS, so the copy lands a moment after the publish."""
    subject = f"run.{ws}.{run}.evidence.sealed"
    deadline = time.monotonic() + 10
    while not (found := await auditread.run_events(bus, subject)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    [ev] = found
    return ev.payload(c.EvidenceSealed).digest


async def test_directory_archive_verifies_and_a_changed_one_fails(bus: Bus, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    await put_text(bus, f"retention: {{evidence: {{archive: {{directory: {root}}}}}}}\n")
    ws, run = await seal_a_run(bus, tmp_path)
    digest = await sealed_digest(bus, ws, run)
    log_object = f"runs/{run}/attempt-1.log"

    # moved: the bus holds neither the bundle nor its log object; the archive holds both, closed to others
    assert await objects.read(bus, bundle_name(run)) is None and await objects.read(bus, log_object) is None
    bundle_file, log_file = root / bundle_name(run), root / log_object
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(bundle_file).st_mode) == 0o440 and stat.S_IMODE(os.stat(log_file).st_mode) == 0o440
    led, _ = await store.load(bus, ws, run)
    assert led is not None and led.seal is not None and led.seal.digest == digest  # the digest stays on the bus

    report = await verify_run(bus, run)
    assert (report.problems, report.ok, report.digest, report.archive) == ([], True, digest, f"directory {root}")
    got = await store.read_bundle(bus, run, workspace=ws)  # tau evidence RUN, the portal
    assert got is not None and got[1]["run_id"] == run and got[1]["attempts"][0]["logs"]["object"] == log_object
    page = await reads.evidence(bus, RunRecord(run_id=run, workspace=ws))  # the portal's evidence tab
    assert (page["sealed"], page["verify"]["ok"], page["verify"]["archive"]) == (True, True, f"directory {root}")

    # one byte of the log changed in the archive
    log_file.chmod(0o640)
    log_file.write_bytes(log_file.read_bytes().replace(b"line 000001", b"line 999999"))
    report = await verify_run(bus, run)
    assert report.problems == [f"attempt 1: log object {log_object} was modified (read from the archive, "
                                f"directory {root})"]
    # the bundle rewritten (a different exit code), stored as a release before bases stored it
    sealed_bytes = await store.read_bundle_bytes(bus, bundle_name(run))
    assert sealed_bytes is not None
    bundle_file.chmod(0o640)
    bundle_file.write_bytes(gzip.compress(sealed_bytes.replace(b'"exit_code":0', b'"exit_code":1'), mtime=0))
    report = await verify_run(bus, run)
    assert not report.ok and report.problems[0].startswith(f"bundle {bundle_name(run)} hashes to ")
    assert report.problems[0].endswith(f"sealed as {digest[:12]}… (the bundle was modified in the archive, "
                                       f"directory {root})")
    # tau evidence, tau outputs, the portal: nothing of a changed archived bundle is shown
    with pytest.raises(store.BundleModified, match=f"sealed as {digest[:12]}… on the bus"):
        await store.read_bundle(bus, run, workspace=ws)
    with pytest.raises(store.BundleModified):
        await store.read_bundle(bus, run)
    page = await reads.evidence(bus, RunRecord(run_id=run, workspace=ws))
    assert (page["sealed"], page["verify"]["ok"], page["bundle"]["terminal_state"]) == (True, False, None)


async def test_a_directory_others_may_write_is_refused(bus: Bus, tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    with pytest.raises(TemporaryError, match="may be written by others .* chmod 0750"):
        archive.DirectoryStore(str(root)).put("runs/x/bundle.json", b"{}")
    assert not (root / "runs").exists()


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server on a free loopback port, one bucket, credentials in the standard AWS environment."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for k, v in {"AWS_ACCESS_KEY_ID": "evidence", "AWS_SECRET_ACCESS_KEY": "evidence-secret"}.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="tau-evidence")
    yield endpoint
    server.stop()


async def test_s3_archive_verifies_and_a_changed_one_fails(bus: Bus, tmp_path: Path, s3: str) -> None:
    await put_text(bus, f"retention: {{evidence: {{archive: {{s3: {{endpoint: '{s3}', bucket: tau-evidence, "
                        f"prefix: site-a/evidence}}}}}}}}\n")
    ws, run = await seal_a_run(bus, tmp_path)
    digest = await sealed_digest(bus, ws, run)
    assert await objects.read(bus, bundle_name(run)) is None
    client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="tau-evidence")["Contents"])
    [base] = [k for k in keys if k.startswith(f"site-a/evidence/bases/{ws}/")]  # the bundle's, copied along
    assert sorted(set(keys) - {base}) == [f"site-a/evidence/runs/{run}/attempt-1.log",
                                          f"site-a/evidence/runs/{run}/bundle.json"]

    report = await verify_run(bus, run)
    assert (report.problems, report.ok, report.digest, report.archive) == (
        [], True, digest, "s3://tau-evidence/site-a/evidence")

    # someone with write access to the bucket replaces the bundle: the digest on the bus catches it
    key = f"site-a/evidence/{bundle_name(run)}"
    body = await store.read_bundle_bytes(bus, bundle_name(run))
    assert body is not None
    client.put_object(Bucket="tau-evidence", Key=key, Body=gzip.compress(body.replace(b'"exit_code":0',
                                                                                      b'"exit_code":1'), mtime=0))
    report = await verify_run(bus, run)
    assert not report.ok and report.problems[0].endswith(
        f"sealed as {digest[:12]}… (the bundle was modified in the archive, s3://tau-evidence/site-a/evidence)")
    with pytest.raises(store.BundleModified, match="read from the evidence archive"):
        await store.read_bundle(bus, run, workspace=ws)
    # and the archive is never overwritten by a later archiving of other bytes
    with pytest.raises(archive.ArchiveConflict, match="never overwritten"):
        archive.store_for(Archive(s3=S3Location(endpoint=s3, bucket="tau-evidence",
                                                                prefix="site-a/evidence"))).put(
            bundle_name(run), b"other bytes")


async def test_only_the_evidence_service_may_delete_an_evidence_object(secure_nats: SecureNats) -> None:
    evidence, alice = await secure_nats.connect("evidence"), await secure_nats.connect("alice")
    name = f"runs/arch-{uuid.uuid4().hex[:6]}/bundle.json"
    try:
        await objects.write(evidence, name, b"{}" * 100, workspace="vision")
        with pytest.raises(PermissionDenied):
            await alice.guarded(objects.remove(alice, name))
        assert await objects.read(evidence, name) == b"{}" * 100
        assert await objects.remove(evidence, name) is True  # what the archive does once its copy reads back
        assert await objects.read(evidence, name) is None and await objects.remove(evidence, name) is False
    finally:
        await evidence.close()
        await alice.close()


def test_a_directory_archive_is_write_once(tmp_path: Path) -> None:
    store = archive.DirectoryStore(str(tmp_path / "a"))
    store.put("runs/r1/bundle.json", b"sealed")
    store.put("runs/r1/bundle.json", b"sealed")  # the same bytes again (a retried move): nothing to do
    with pytest.raises(archive.ArchiveConflict, match="never overwritten"):
        store.put("runs/r1/bundle.json", b"forged")
    assert store.get("runs/r1/bundle.json") == b"sealed" and store.get("runs/r2/bundle.json") is None
    assert sorted(p.name for p in (tmp_path / "a" / "runs" / "r1").iterdir()) == ["bundle.json"]  # no temp left
    with pytest.raises(PermanentError, match="cannot be archived"):
        store.put("runs/../../etc/bundle.json", b"x")
