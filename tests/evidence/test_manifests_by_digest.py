"""A run's manifests stored once by digest (``bus/manifests.py``, issue 27), on a real nats-server: the evidence
seals them from the ``manifests`` bucket only when they hash to the digest ``render.applied`` signed, and ``tau
verify`` fails a bundle that lacks them or whose manifests do not hash to it; an earlier release's event, the
manifests carried whole, seals and verifies as before."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from taugrid.access.permissions import SERVICE_ROLES, Person, person_permissions, service_permissions
from taugrid.bus import Bus, kv
from taugrid.bus import manifests as stored_manifests
from taugrid.bus.envelope import from_message
from taugrid.bus.replay import replay
from taugrid.core import contracts as c
from taugrid.evidence import store
from taugrid.evidence.verify import _check_manifests, verify_run
from taugrid.render import canonical_json, manifest_digest
from taugrid_services.evidence.handlers import Evidence
from tests.evidence.test_evidence_service import manifests_of, publish_run
from tests.owners import acting_as, emit_as_owner


async def finish_and_seal(bus: Bus, ws: str, run: str) -> dict[str, Any]:
    """The run ended and sealed by the evidence handler; its bundle."""
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="exec.succeeded",
                        payload=c.ExecFinished(exit_code=0, reason="Completed", node="box", duration_s=3.0))
    [m] = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run}.exec.succeeded")
    with acting_as(bus, "evidence"):
        await Evidence(bus).on_event(from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream))
    got = await store.read_bundle(bus, run, workspace=ws)
    assert got is not None
    return got[1]


def names() -> tuple[str, str]:
    return f"mf{uuid.uuid4().hex[:6]}", f"train-{uuid.uuid4().hex[:6]}"


async def test_a_manifests_object_that_does_not_hash_to_its_digest_is_not_sealed_and_verify_fails(
        bus: Bus, tmp_path: Path) -> None:
    ws, run = names()
    await publish_run(bus, ws, run, tmp_path, log_lines=["done"])
    digest = manifest_digest(manifests_of(ws, run))
    forged = manifests_of(ws, run)
    forged[0]["spec"] = {"template": {"spec": {"containers": [{"name": "main", "image": "evil:latest"}]}}}
    # written under the digest the renderer signed (here by the test's operator identity; only the renderer may)
    await kv.put(bus, stored_manifests.BUCKET, stored_manifests.key(ws, run, digest),
                 stored_manifests.pack(canonical_json(forged)))

    doc = await finish_and_seal(bus, ws, run)

    why = (f"manifests/run.{ws}.{run}.{digest.removeprefix('sha256:')} does not hash to the digest render.applied "
           "signed: refused")
    [att] = doc["attempts"]
    assert (att["render"]["manifests_missing"], att["render"]["manifests"]) == (why, [])
    report = await verify_run(bus, run)
    assert (report.ok, report.problems) == (False, [f"attempt 1: its manifests are not in the bundle: {why}"])


async def test_an_earlier_releases_event_carrying_the_manifests_seals_them_and_verifies(
        bus: Bus, tmp_path: Path) -> None:
    ws, run = names()
    await publish_run(bus, ws, run, tmp_path, log_lines=["done"], inline=True)
    assert await kv.matching_keys(bus, stored_manifests.BUCKET, f"run.{ws}.{run}.*") == []  # nothing stored

    doc = await finish_and_seal(bus, ws, run)

    [att] = doc["attempts"]
    assert (att["render"]["manifests"], "manifests_missing" in att["render"]) == (manifests_of(ws, run), False)
    report = await verify_run(bus, run)
    assert (report.ok, report.problems) == (True, [])


def test_verify_rehashes_each_attempts_manifests_against_the_digest_its_event_signed() -> None:
    manifests = manifests_of("ws", "r")
    digest = manifest_digest(manifests)
    good = {"attempts": [{"attempt": 1, "render": {"digest": digest, "manifests": manifests}},
                         {"attempt": 2, "render": None}]}  # attempt 2: render.failed, nothing applied
    assert _check_manifests(good) == []
    changed = [{**manifests[0], "kind": "Pod"}]
    bad = {"attempts": [{"attempt": 1, "render": {"digest": digest, "manifests": changed}}]}
    assert _check_manifests(bad) == [
        f"attempt 1: the bundle's manifests do not hash to the digest render.applied signed ({digest[:19]}…)"]
    # blanked by the workspace's secrets at the seal: no longer the signed bytes, covered by the bundle's digest
    redacted = [{**manifests[0], "metadata": {"name": "[REDACTED]"}}]
    assert _check_manifests({"attempts": [{"attempt": 1, "render": {"digest": digest, "manifests": redacted}}]}) == []


def test_only_the_renderer_writes_the_manifests_bucket_and_the_evidence_purges_it() -> None:
    writes = {name: "$KV.manifests.>" in service_permissions(role, "UKEY").publish
              for name, role in SERVICE_ROLES.items()}
    assert sorted(name for name, may in writes.items() if may) == ["evidence", "renderer"]
    for role in ("researcher", "platform-admin"):
        person = Person(name="p", public_key="UKEY", role=role, workspaces=("ws",))
        assert not any(p.startswith("$KV.manifests") for p in person_permissions(person).publish)
