"""Source snapshots are content-addressed: verified on upload, by the submitter and at every fetch, never
overwritten when good. The real services run in-process on a private nats-server (tests/inprocess.py)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from taugrid.bus import Bus, identity, platformstore
from taugrid.bus.topology import SOURCES_STORE, UPLOADS_STORE
from taugrid.client import Client
from taugrid.core.contracts import Rejected, SubmitRequested
from taugrid.core.errors import NotFound
from taugrid.core.ids import new_run_id
from taugrid.sources import snapshots
from taugrid.sources.archive import snapshot, source_object
from tests.hardening.conftest import PLATFORM  # the same lab platform as the pre-run suites
from tests.inprocess import RunningServices, private_server
from tests.stages import THROUGH_RENDERER, start_local_cluster, start_stages


def _project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text("print('the submitted code')\n")
    (root / "tau.yaml").write_text("name: addressed\nentrypoint: train.py\ncompute: {gpus: 0}\n")
    return root


@dataclass
class Pipeline:
    url: str
    bus: Bus  # the bootstrap identity: plants objects as an attacker with put rights would
    client: Client
    tmp: Path
    running: RunningServices

    async def start_local_cluster(self) -> None:
        await start_local_cluster(self.running, self.tmp / "cluster")

    async def events(self, run_id: str) -> list[str]:
        return [ev.type async for ev in self.client.events(run_id=run_id)]

    async def until(self, run_id: str, event_type: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while event_type not in await self.events(run_id):
            assert time.monotonic() < deadline, f"{run_id}: no {event_type} in {await self.events(run_id)}"
            await asyncio.sleep(0.1)


@pytest.fixture
async def pipeline(tmp_path: Path) -> AsyncIterator[Pipeline]:
    """submitter, policy, renderer, admission-watcher and recovery; the local cluster starts when a test says."""
    async with private_server(tmp_path, name="bootstrap") as (url, admin):
        seed = identity.new_user_seed()
        await platformstore.put_text(admin, PLATFORM.replace("OUTPUTS", str(tmp_path / "outputs")))
        await platformstore.put_local_user(admin, platformstore.LocalUser("owner", identity.public_key(seed)))
        running = RunningServices(url)
        try:
            p = Pipeline(url, admin, await running.client(seed), tmp_path, running)
            await start_stages(running, *THROUGH_RENDERER)
            yield p
        finally:
            await running.stop()


async def _plant(bus: Bus, name: str, data: bytes, store: str = SOURCES_STORE) -> None:
    await (await bus.objects(store)).put(name, data)


async def test_a_replaced_source_object_is_refused_at_fetch_with_the_reason_on_the_run(pipeline: Pipeline) -> None:
    project = _project(pipeline.tmp / "project")
    run_id = await pipeline.client.submit(project / "tau.yaml", workspace="team-a")
    await pipeline.until(run_id, "render.applied")  # the submitter verified it; no pod has fetched it yet
    _, digest = snapshot(project)
    name = source_object(digest)
    forged = b"not the submitted code"
    await _plant(pipeline.bus, name, forged)  # only an operator's identity may write `sources`: defence in depth
    await pipeline.start_local_cluster()
    await pipeline.until(run_id, "recovery.gave_up")
    record = await pipeline.client.settled(run_id)
    assert (record.state, record.reason) == ("failed", "SourceMismatch: not retryable")
    assert record.message == (
        f"source snapshot {name} holds content with digest sha256:{hashlib.sha256(forged).hexdigest()}, "
        f"not {digest}: it was replaced after upload; refusing to run code that is not what was submitted")


async def test_the_submitter_refuses_a_snapshot_that_does_not_hash_to_its_name(pipeline: Pipeline) -> None:
    _, digest = snapshot(_project(pipeline.tmp / "project"))
    name = source_object(digest)
    await _plant(pipeline.client.bus, name, b"planted before the submission", UPLOADS_STORE)  # as a person can
    run_id = new_run_id("planted", "s-planted")
    await pipeline.client.bus.emit(
        workspace="team-a", run_id=run_id, attempt=1, event_type="submit.requested",
        payload=SubmitRequested(submission_id="s-planted", config_text="name: planted\nentrypoint: train.py\n",
                                config_path="tau.yaml", workspace="team-a", source_object=name,
                                source_digest=digest))
    await pipeline.until(run_id, "submit.rejected")
    [rejected] = [ev.payload(Rejected) async for ev in pipeline.client.events(run_id=run_id)
                  if ev.type == "submit.rejected"]
    [issue] = rejected.reasons
    planted = hashlib.sha256(b"planted before the submission").hexdigest()
    assert (issue.field, issue.message) == (
        "source_object", f"uploaded source snapshot {name} holds content with digest sha256:{planted}, not "
        f"{digest}: it was replaced after upload; refusing to run code that is not what was submitted")
    assert issue.fix == "submit again with `tau run` (it uploads the snapshot under its digest)"


async def test_upload_skips_what_sources_or_uploads_hold_verified_and_promote_writes_once(pipeline: Pipeline) -> None:
    data, digest = snapshot(_project(pipeline.tmp / "project"))
    name = source_object(digest)
    bus = pipeline.client.bus  # a person: puts into `uploads` only
    submitter = await pipeline.running.service("submitter")  # its identity: promotes into `sources`
    with pytest.raises(NotFound):
        await snapshots.promote(submitter.bus, name, digest, max_bytes=1 << 20)
    assert await snapshots.recorded_digest(bus, name) is None  # nothing promoted yet
    assert await snapshots.upload(bus, name, data) is True
    # not promoted yet, but uploaded with these bytes (a sweep's next run): not put again, since a replace ends
    # in a purge of the old chunks, which people may not do (the refusal was printed once per run)
    assert await snapshots.upload(bus, name, data) is False
    with pytest.raises(snapshots.SourceMismatch, match="is larger than 10 bytes"):
        await snapshots.promote(submitter.bus, name, digest, max_bytes=10)
    assert await snapshots.promote(submitter.bus, name, digest, max_bytes=1 << 20) == digest
    revision = (await (await bus.objects(SOURCES_STORE)).get_info(name)).mtime
    assert await snapshots.recorded_digest(bus, name) == digest  # what a later promote trusts without a download
    assert await snapshots.upload(bus, name, data) is False  # promoted and verified: nothing to put
    assert await snapshots.promote(submitter.bus, name, digest, max_bytes=1 << 20) == digest
    assert (await (await bus.objects(SOURCES_STORE)).get_info(name)).mtime == revision  # written once
    await _plant(pipeline.bus, name, b"replaced")  # an operator's identity: the only other writer
    assert await snapshots.recorded_digest(bus, name) == "sha256:" + hashlib.sha256(b"replaced").hexdigest()
    with pytest.raises(snapshots.SourceMismatch, match="it was replaced after upload"):
        await snapshots.verify(bus, name, digest)
    # a name that exists in `sources` is not trusted: `uploads` still holds the verified bytes (else they would be
    # put again), and the submitter promotes them anew
    assert await snapshots.upload(bus, name, data) is False
    assert await snapshots.stored_digest(bus, name, UPLOADS_STORE) == digest
    assert await snapshots.promote(submitter.bus, name, digest, max_bytes=1 << 20) == digest  # and re-promoted
    assert await snapshots.fetch(bus, name, digest) == data
    with pytest.raises(snapshots.SourceMismatch, match="is named for"):
        await snapshots.verify(bus, name, "sha256:" + "0" * 64)
    with pytest.raises(snapshots.SourceMismatch, match="is not named by its digest"):
        await snapshots.verify(bus, "sources/latest.tar.gz")
