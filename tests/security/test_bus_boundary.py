"""The boundary between people on the bus, attacked as a researcher would (issue 22, items 1, 2 and 4), over a real
nats-server with authentication on (``tests/secure_nats.py``: alice researches in ``vision``, bob in
``language``; every service has its own key, which the bootstrap identity published in ``service_keys``).

- The subject alone says what an event is: a stage's event forged in the headers of a subject a researcher may
  publish is refused before any handler sees it.
- A stage acts only on events its owning service signed: unsigned, signed by another service, or altered after
  signing, each is refused with the reason, and the genuine event is handled.
- A researcher can neither pull from, read, redefine nor delete a service's durable consumer; their own
  short-lived consumers still work.
- The submitter answers only the first request stored for a run, so nobody can write a rejection into a run that
  is not theirs; the portal never serves another workspace's bundle for a record made under the same run id.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from taugrid.bus import Bus, connect, kv, objects
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.bootstrap import main as bootstrap_main
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import Event, from_message, headers_for, sign_service_headers
from taugrid.bus.replay import replay
from taugrid.bus.topology import ConsumerSpec
from taugrid.core.contracts import CancelRequested, PolicyApproved, ResolvedRun, SubmitRequested
from taugrid.core.errors import ConfigError, PermanentError, PermissionDenied
from taugrid.evidence.bundle import bundle_name
from taugrid.evidence.store import read_bundle
from taugrid_services.renderer.handlers import Renderer
from taugrid_services.submitter.handlers import Submitter
from tests.secure_nats import SecureNats


@pytest.fixture
async def boot(secure_nats: SecureNats) -> AsyncIterator[Bus]:
    bus = await secure_nats.connect("bootstrap")
    yield bus
    await bus.close()


def _resolved(run_id: str, workspace: str) -> ResolvedRun:
    return ResolvedRun(run_id=run_id, submission_id="s", workspace=workspace, namespace="default", name=run_id,
                       command=["sh", "-c", "cat /secrets/*"], priority_class="critical")


async def _watch(boot: Bus, subject: str) -> tuple[ConsumerLoop, asyncio.Task[None], list[Event], str]:
    """A stage's consumer loop (the checks every service's loops make) on ``subject``; what it handled."""
    durable = f"sec-{uuid.uuid4().hex[:10]}"
    await ensure_consumer(boot, ConsumerSpec(durable, "RUNS", [subject]))
    handled: list[Event] = []

    async def handler(ev: Event) -> None:
        handled.append(ev)

    loop = ConsumerLoop(boot, stream="RUNS", durable=durable, handler=handler, fetch_timeout=0.2)
    return loop, asyncio.create_task(loop.run()), handled, durable


async def _dead_letters(boot: Bus, durable: str, count: int) -> list[str]:
    """The errors of the first ``count`` dead letters of ``durable``, in order (waits for them)."""
    for _ in range(100):
        msgs = await replay(boot, stream="DLQ", subject=f"dlq.RUNS.{durable}")
        if len(msgs) >= count:
            return [(m.headers or {})["x-dlq-error"] for m in msgs]
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} dead letters for {durable}")


async def _stop(loop: ConsumerLoop, task: asyncio.Task[None]) -> None:
    loop.stopping.set()
    await task


async def test_a_stage_event_forged_in_the_headers_of_a_researchers_subject_is_refused(
        secure_nats: SecureNats, boot: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    subject = f"run.vision.{run}.cancel.requested"  # alice may publish it: a cancel in her workspace
    loop, task, handled, durable = await _watch(boot, f"run.vision.{run}.>")
    alice = await secure_nats.connect("alice")
    try:
        body = msgspec.json.encode(PolicyApproved(run=_resolved(run, "language")))
        headers = headers_for(event_id=f"{run}.1.policy.approved", event_type="policy.approved",
                              source="/svc/policy", subject=run, workspace="language", attempt=1, traceparent="")
        await alice.js.publish(subject, body, headers=headers)
        honest = headers_for(event_id=f"{run}.1.x", event_type="cancel.requested", source="/svc/client",
                             subject="bobs-run", workspace="vision", attempt=1, traceparent="")
        await alice.js.publish(subject, msgspec.json.encode(CancelRequested()), headers=honest)
        errors = await _dead_letters(boot, durable, 2)
        await asyncio.sleep(0.3)
        assert handled == []
        assert errors == [
            f"refused: ce-type says 'policy.approved' where the subject says 'cancel.requested' on {subject}: "
            "the subject decides, so this message is refused",
            f"refused: ce-subject says 'bobs-run' where the subject says '{run}' on {subject}: "
            "the subject decides, so this message is refused",
        ]
    finally:
        await alice.close()
        await _stop(loop, task)


async def test_a_stage_acts_only_on_events_its_own_service_signed(secure_nats: SecureNats, boot: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    subject = f"run.vision.{run}.policy.approved"
    loop, task, handled, durable = await _watch(boot, subject)
    renderer, policy = await secure_nats.connect("renderer"), await secure_nats.connect("policy")
    body = msgspec.json.encode(PolicyApproved(run=_resolved(run, "vision")))

    def headers(n: int) -> dict[str, str]:
        return headers_for(event_id=f"{run}.{n}", event_type="policy.approved", source="/svc/policy",
                           subject=run, workspace="vision", attempt=1, traceparent="")

    try:
        # a routine credential that may publish anywhere (bootstrap), claiming to be the policy
        await boot.js.publish(subject, body, headers=headers(1))
        # signed by the renderer's key (e.g. its stolen credentials), published by one that may publish there
        by_renderer = headers(2)
        assert renderer.signing_key is not None
        sign_service_headers(renderer.signing_key, nats_subject=subject, headers=by_renderer, body=body)
        await boot.js.publish(subject, body, headers=by_renderer)
        # the policy's genuine signature, with the verified submitter changed afterwards
        altered = headers(3)
        assert policy.signing_key is not None
        sign_service_headers(policy.signing_key, nats_subject=subject, headers=altered, body=body)
        altered["ce-tauuser"] = "mallory"
        await boot.js.publish(subject, body, headers=altered)
        # the genuine event, as the policy service publishes it
        await policy.emit(workspace="vision", run_id=run, attempt=1, event_type="policy.approved",
                          payload=PolicyApproved(run=_resolved(run, "vision")), user="alice")
        errors = await _dead_letters(boot, durable, 3)
        for _ in range(100):
            if handled:
                break
            await asyncio.sleep(0.05)
        assert errors == [
            f"refused: policy.approved on {subject} is not signed by any service's key (signer none): only policy "
            "may publish it",
            f"refused: policy.approved on {subject} is signed by renderer, which may not publish it as "
            "'/svc/policy': only policy may",
            f"refused: policy.approved on {subject} claims policy's key, but signature does not match the request "
            "(tampered, or signed by another key)",
        ]
        assert [(e.id, e.user, e.workspace, e.subject) for e in handled] == [
            (f"{run}.1.policy.approved", "alice", "vision", run)]
    finally:
        await renderer.close()
        await policy.close()
        await _stop(loop, task)


async def test_a_researcher_can_neither_use_nor_redefine_a_services_durable(secure_nats: SecureNats,
                                                                           boot: Bus) -> None:
    alice = await secure_nats.connect("alice")
    try:
        before = await boot.js.consumer_info("RUNS", "evidence")
        with pytest.raises(PermissionDenied):  # bob's submissions, through the projection's durable
            await alice.guarded(alice.nc.request("$JS.API.CONSUMER.MSG.NEXT.RUNS.runstate",
                                                 json.dumps({"batch": 1, "no_wait": True}).encode(), timeout=2))
        with pytest.raises(PermissionDenied):
            await alice.guarded(alice.js.consumer_info("RUNS", "policy"))
        with pytest.raises(PermissionDenied):  # a create naming a durable updates it: its filter would be hers
            await alice.guarded(alice.js.add_consumer("RUNS", config=ConsumerConfig(
                name="evidence", durable_name="evidence", ack_policy=AckPolicy.EXPLICIT,
                filter_subject="run.vision.>")))
        with pytest.raises(PermissionDenied):
            await alice.guarded(alice.js.delete_consumer("RUNS", "renderer"))
        after = await boot.js.consumer_info("RUNS", "evidence")
        assert (after.config.filter_subjects, after.config.filter_subject) == (
            before.config.filter_subjects, before.config.filter_subject)
        # her own short-lived consumer on her workspace reads as before
        run = f"r-{uuid.uuid4().hex[:12]}"
        await alice.js.publish(f"run.vision.{run}.cancel.requested", b"{}")
        got = await replay(alice, stream="RUNS", subject=f"run.vision.{run}.>")
        assert [m.subject for m in got] == [f"run.vision.{run}.cancel.requested"]
    finally:
        await alice.close()


async def two_requests(bus: Bus, ws: str, run: str, *, submission_ids: tuple[str, str]) -> tuple[Event, Event]:
    """Two ``submit.requested`` stored on one run's subject (unsigned, as anyone allowed there could), read back."""
    subject = f"run.{ws}.{run}.submit.requested"
    for n, submission_id in enumerate(submission_ids, 1):
        body = msgspec.json.encode(SubmitRequested(submission_id=submission_id, config_text="name: x\n",
                                                   workspace=ws))
        await bus.js.publish(subject, body, headers=headers_for(
            event_id=f"{run}.req{n}", event_type="submit.requested", source="/client", subject=run,
            workspace=ws, attempt=1, traceparent=""))
    first, second = [from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
                     for m in await replay(bus, stream="RUNS", subject=subject)]
    return first, second


async def test_the_submitter_answers_only_the_first_request_stored_for_a_run(bus: Bus) -> None:
    ws, run = f"w{uuid.uuid4().hex[:8]}", f"victim-{uuid.uuid4().hex[:16]}"
    # the victim's request, then another (unsigned, or a replay) on the same run's subject
    first, second = await two_requests(bus, ws, run, submission_ids=("s1", "s2"))
    submitter = Submitter(bus)
    await submitter.on_requested(first)
    await submitter.on_requested(first)  # a redelivery of the first is answered again (deduplicated)
    with pytest.raises(PermanentError, match=f"run {run} in workspace {ws} already has a submission"):
        await submitter.on_requested(second)
    stored = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run}.>")
    assert [m.subject.rsplit(".", 2)[1:] for m in stored] == [
        ["submit", "requested"], ["submit", "requested"], ["submit", "rejected"]]  # one answer: the first's
    assert [from_message(m.subject, m.headers, m.data).type for m in stored][2:] == ["submit.rejected"]
    # one key claims the run id and its first request (issue 27: two keys a run before)
    claim = await kv.get(bus, "submissions", f"id.{run}")
    assert claim is not None and claim.value == f"{ws}:{first.seq}".encode()
    assert await kv.get(bus, "submissions", f"run.{ws}.{run}") is None


@pytest.mark.parametrize("earlier", ["id and run keys", "run key alone"])
async def test_a_run_an_earlier_release_claimed_still_answers_only_its_first_request(bus: Bus, earlier: str) -> None:
    """An earlier release claimed a run in ``run.<ws>.<run>`` (its first request's sequence) and, later releases,
    its id in ``id.<run>`` (the workspace alone): a replayed request is still refused, the first still answered."""
    ws, run = f"w{uuid.uuid4().hex[:8]}", f"old-{uuid.uuid4().hex[:16]}"
    first, second = await two_requests(bus, ws, run, submission_ids=(f"s1-{run}", f"s2-{run}"))
    await kv.create(bus, "submissions", f"run.{ws}.{run}", str(first.seq).encode())
    if earlier == "id and run keys":
        await kv.create(bus, "submissions", f"id.{run}", ws.encode())
    submitter = Submitter(bus)
    with pytest.raises(PermanentError, match=f"run {run} in workspace {ws} already has a submission"):
        await submitter.on_requested(second)
    await submitter.on_requested(first)
    stored = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run}.>")
    assert [from_message(m.subject, m.headers, m.data).type for m in stored] == [
        "submit.requested", "submit.requested", "submit.rejected"]
    claim = await kv.get(bus, "submissions", f"id.{run}")
    assert claim is not None and claim.value == (ws.encode() if earlier == "id and run keys"
                                                 else f"{ws}:{first.seq}".encode())


async def test_the_portal_never_serves_another_workspaces_bundle_for_a_run_id(bus: Bus) -> None:
    run = f"shared-{uuid.uuid4().hex[:16]}"
    await objects.write(bus, bundle_name(run), json.dumps({"run_id": run, "workspace": "language"}).encode(),
                        workspace="language")
    assert await read_bundle(bus, run, workspace="vision") is None  # a record eve planted in her workspace
    got = await read_bundle(bus, run, workspace="language")
    assert got is not None and got[1]["workspace"] == "language"



async def test_the_charts_bootstrap_publishes_the_service_keys_from_identities_json(
        bootstrapped: str, tmp_path: Path) -> None:
    keys = {"policy": "UPOLICYKEY", "admission_watcher": "UWATCHERKEY"}
    path = tmp_path / "identities.json"
    path.write_text(json.dumps({"bootstrap": "UB", "services": keys, "admin": {"name": "a", "nkey": "UA"}}))
    assert await asyncio.to_thread(bootstrap_main, [bootstrapped, "--service-keys", str(path)]) == 0
    bus = await connect(bootstrapped, name="check")
    try:
        kv = await bus.kv("service_keys")
        got = {name: (await kv.get(name)).value for name in ("policy", "admission-watcher")}
        assert got == {"policy": b"UPOLICYKEY", "admission-watcher": b"UWATCHERKEY"}
    finally:
        for name in ("policy", "admission-watcher"):  # the shared server has no authentication: no keys
            await kv.purge(name)
        await bus.close()
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not an identities file written by `tau admin chart-credentials`"):
        await asyncio.to_thread(bootstrap_main, [bootstrapped, "--service-keys", str(path)])


async def test_the_renderer_never_applies_a_spec_for_another_run_than_its_subjects(bus: Bus) -> None:
    class NoBackend:
        name = "none"

        async def apply(self, req: object) -> None:
            raise AssertionError(f"applied {req}")

    body = msgspec.json.encode(PolicyApproved(run=_resolved("bobs-run", "language")))
    ev = from_message("run.vision.eves-run.policy.approved", {}, body, seq=1)
    with pytest.raises(PermanentError, match="^policy.approved on run.vision.eves-run.policy.approved carries the "
                                             "spec of run bobs-run in workspace language: refused$"):
        await Renderer(bus, NoBackend()).on_event(ev)


async def test_an_event_waits_for_the_service_keys_rather_than_being_acted_on_unchecked(
        secure_nats: SecureNats, boot: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    subject = f"run.vision.{run}.policy.approved"
    keys = await boot.kv("service_keys")
    recorded = {name: (await keys.get(name)).value for name in await kv.matching_keys(boot, "service_keys", ">")}
    for name in recorded:  # as on a chart whose bootstrap Job has not run yet
        await keys.purge(name)
    loop, task, handled, durable = await _watch(boot, subject)
    policy = await secure_nats.connect("policy")
    try:
        await policy.emit(workspace="vision", run_id=run, attempt=1, event_type="policy.approved",
                          payload=PolicyApproved(run=_resolved(run, "vision")), user="alice")
        await asyncio.sleep(1.0)
        assert handled == []
        assert await replay(boot, stream="DLQ", subject=f"dlq.RUNS.{durable}") == []  # waiting, not refused
    finally:
        for name, value in recorded.items():
            await keys.put(name, value or b"")
        await policy.close()
    for _ in range(200):
        if handled:
            break
        await asyncio.sleep(0.05)
    await _stop(loop, task)
    assert [(e.subject, e.user) for e in handled] == [(run, "alice")]
