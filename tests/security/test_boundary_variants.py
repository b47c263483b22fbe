"""Variants of the boundary attacks (issue 22) that the first suite did not try, as a researcher of another
workspace would, over a real nats-server with authentication on (``tests/secure_nats.py``: alice researches in
``vision``, bob in ``language``; every service has its own key).

- Message ids: a researcher may set any ``Nats-Msg-Id`` on a request she may publish. Stored first under the id a
  service's event of a colleague's run will carry (``<run>.<attempt>.exec.succeeded``: run ids are visible to
  every person, e.g. through ``STREAM.INFO``'s subject list), it made the stream drop that event as a duplicate:
  the colleague's run stayed ``running`` after its process ended. A service now checks a duplicate ack into RUNS
  against the subject the id was stored on, and publishes again under a fresh id when it is not its own.
- Push consumers: a consumer filtered to her own workspace but delivering into another workspace's stage subject,
  a KV key, an evidence chunk or the JetStream API is created, and delivers nothing there.
- The JetStream API forms that name their target in the body, not the subject, are refused, or the server refuses
  a body that disagrees with the subject.
- Run ids: evidence objects are named by run id alone, so a run submitted in her workspace under a colleague's
  run id would have had its seal replace his bundle. The submitter refuses a run id another workspace holds,
  unanswered, and the evidence never seals over another workspace's bundle. Her cancel or submission under a
  colleague's run id opens no record in her workspace (a platform admin's lookup by id found hers).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nkeys
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, creds, kv, objects, platformstore
from taugrid.bus.authors import Authors
from taugrid.bus.envelope import Event, dedup_key, from_message, headers_for, sign_service_headers
from taugrid.bus.replay import replay
from taugrid.config import source
from taugrid.config.platform import Workspace, load_platform
from taugrid.config.resolve import resolve_run, resume_point
from taugrid.config.taujob import load_tau_config
from taugrid.core import states
from taugrid.core.contracts import (
    ExecFinished,
    PolicyApproved,
    Rejected,
    ResolvedRun,
    SubmitAccepted,
    SubmitRequested,
)
from taugrid.core.errors import ConfigError, PermanentError, PermissionDenied
from taugrid.core.events import HIGH_LANE, message_id, run_subject
from taugrid.evidence import anchor, store
from taugrid.evidence import ledger as lg
from taugrid.evidence.bundle import bundle_name
from taugrid.runrecord import projection
from taugrid_services.policy.handlers import Policy
from taugrid_services.submitter.handlers import Submitter
from tests.inprocess import private_server, sign_as_local_user
from tests.platforms import lab_platform, workspace
from tests.secure_nats import SecureNats


@pytest.fixture
async def boot(secure_nats: SecureNats) -> AsyncIterator[Bus]:
    bus = await secure_nats.connect("bootstrap")
    yield bus
    await bus.close()


@pytest.fixture
async def alice(secure_nats: SecureNats) -> AsyncIterator[Bus]:
    bus = await secure_nats.connect("alice")
    yield bus
    await bus.close()


async def test_a_message_id_taken_first_on_a_researchers_own_subject_does_not_drop_a_colleagues_event(
        secure_nats: SecureNats, boot: Bus, alice: Bus) -> None:
    victim = f"bobs-{uuid.uuid4().hex[:12]}"
    # run ids of other workspaces are readable by every person: the stream's subject list names them
    info = json.loads((await alice.guarded(alice.nc.request(
        "$JS.API.STREAM.INFO.RUNS", json.dumps({"subjects_filter": "run.language.>"}).encode(), timeout=5))).data)
    assert "error" not in info
    # the key a service stores its event under (envelope.dedup_key) is as easily computed as the id it hashes
    for kind in ("exec.succeeded", "evidence.sealed"):
        await alice.guarded(alice.js.publish(f"run.vision.squat-{uuid.uuid4().hex[:6]}.cancel.requested", b"{}",
                                             headers={"Nats-Msg-Id": dedup_key(f"{victim}.1.{kind}")}))
    watcher = await secure_nats.connect("admission_watcher")
    try:
        first = await watcher.emit(workspace="language", run_id=victim, attempt=1, event_type="exec.succeeded",
                                   payload=ExecFinished(reason="Completed", exit_code=0), user="bob")
        again = await watcher.emit(workspace="language", run_id=victim, attempt=1, event_type="exec.succeeded",
                                   payload=ExecFinished(reason="Completed", exit_code=0), user="bob")
    finally:
        await watcher.close()
    stored = await replay(boot, stream="RUNS", subject=f"run.language.{victim}.>")
    # stored once, on its own subject, with its deterministic ce-id; the repeat by the same service is the
    # duplicate it always was
    assert [(m.subject, m.metadata.sequence.stream) for m in stored] == [
        (f"run.language.{victim}.exec.succeeded", first)]
    assert again == first
    ev = from_message(stored[0].subject, stored[0].headers, stored[0].data)
    assert (ev.id, ev.type, ev.workspace, ev.subject, ev.problem) == (
        f"{victim}.1.exec.succeeded", "exec.succeeded", "language", victim, "")
    assert (stored[0].headers or {})["Nats-Msg-Id"].startswith(f"{victim}.1.exec.succeeded.")


async def test_a_stage_repeating_an_event_in_the_other_lane_is_deduplicated_not_stored_twice(
        secure_nats: SecureNats, boot: Bus) -> None:
    run = f"lanes-{uuid.uuid4().hex[:12]}"
    policy = await secure_nats.connect("policy")
    try:
        seqs = [await policy.publish(run_subject("language", run, "policy.approved", lane=lane), b"{}",
                                     event_type="policy.approved", ce_subject=run, workspace="language",
                                     msg_id=message_id(run, 1, "policy.approved"))
                for lane in ("", HIGH_LANE)]  # the platform's lanes changed between a publish and its redelivery
    finally:
        await policy.close()
    stored = await replay(boot, stream="RUNS", subject=f"run.language.{run}.>")
    assert [(m.subject, m.metadata.sequence.stream) for m in stored] == [
        (f"run.language.{run}.policy.approved", seqs[0])]
    assert seqs[1] == seqs[0]
async def test_a_push_consumer_delivering_outside_her_inbox_stores_nothing_anywhere(
        secure_nats: SecureNats, boot: Bus, alice: Bus) -> None:
    victim = f"bobs-{uuid.uuid4().hex[:12]}"
    mine = f"run.vision.push-{uuid.uuid4().hex[:8]}.submit.requested"
    await alice.guarded(alice.js.publish(mine, json.dumps({"name": "EVIL", "subjects": ["evil.>"]}).encode()))
    targets = [("AUDIT", f"run.language.{victim}.exec.failed"), ("RUNS", "$KV.node_state.evil"),
               ("RUNS", "$JS.API.STREAM.CREATE.EVIL"), ("RUNS", "$O.evidence.C.language.evil")]
    for stream, target in targets:
        name = uuid.uuid4().hex
        body = {"stream_name": stream, "config": {
            "name": name, "ack_policy": "none", "filter_subject": mine, "deliver_subject": target,
            "deliver_policy": "all", "inactive_threshold": 30_000_000_000}}
        reply = await alice.guarded(alice.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{mine}",
                                                     json.dumps(body).encode(), timeout=5))
        assert "error" not in json.loads(reply.data)
    await asyncio.sleep(1.0)  # a push consumer with interest delivers at once
    assert await replay(boot, stream="RUNS", subject=f"run.language.{victim}.>") == []
    assert "EVIL" not in [s.config.name for s in await boot.js.streams_info()]
    for stream, subject in (("KV_node_state", "$KV.node_state.evil"), ("OBJ_evidence", "$O.evidence.C.language.evil")):
        state = json.loads((await boot.nc.request(f"$JS.API.STREAM.INFO.{stream}",
                                                  json.dumps({"subjects_filter": subject}).encode())).data)["state"]
        assert state.get("subjects") is None, (stream, state)
    delivered = [c.delivered.consumer_seq for stream in ("RUNS", "AUDIT")
                 for c in await boot.js.consumers_info(stream) if c.config.deliver_subject in {t for _, t in targets}]
    assert delivered == [0, 0, 0, 0]


@pytest.mark.parametrize(("api", "body"), [
    ("STREAM.PURGE.RUNS", {"filter": "run.language.>"}),
    ("STREAM.PURGE.OBJ_uploads", {}),
    ("STREAM.MSG.DELETE.RUNS", {"seq": 1}),
    ("STREAM.MSG.DELETE.OBJ_uploads", {"seq": 1}),
    ("STREAM.DELETE.OBJ_uploads", {}),
    ("STREAM.UPDATE.RUNS", {"name": "RUNS"}),
    ("STREAM.CREATE.EVIL", {"name": "EVIL", "sources": [{"name": "RUNS", "filter_subject": "run.language.>"}]}),
    ("STREAM.MSG.GET.RUNS", {"last_by_subj": "run.language.x.submit.requested"}),
    ("STREAM.SNAPSHOT.RUNS", {"deliver_subject": "x"}),
    ("DIRECT.GET.RUNS", {"last_by_subj": "run.language.x.submit.requested"}),
    ("DIRECT.GET.KV_run_state.$KV.run_state.run.language.x", {}),
    ("DIRECT.GET.KV_submissions.$KV.submissions.run.language.x", {}),
    ("DIRECT.GET.KV_service_keys.$KV.service_keys.policy", {}),
    ("CONSUMER.LIST.RUNS", {}),
    ("CONSUMER.NAMES.RUNS", {}),
    ("CONSUMER.DELETE.RUNS.evidence", {}),
    ("CONSUMER.PAUSE.RUNS.evidence", {"pause_until": "2030-01-01T00:00:00Z"}),
    ("CONSUMER.MSG.NEXT.RUNS.renderer-high", {"batch": 1, "no_wait": True}),
    ("CONSUMER.CREATE.RUNS.x.run.language.>", {"stream_name": "RUNS", "config": {"name": "x"}}),
    ("CONSUMER.CREATE.KV_run_state.x.$KV.run_state.run.language.>", {"stream_name": "KV_run_state"}),
    ("CONSUMER.CREATE.OBJ_evidence.x.$O.evidence.C.language.>", {"stream_name": "OBJ_evidence"}),
    ("CONSUMER.CREATE.DLQ.x.dlq.>", {"stream_name": "DLQ"}),
    ("CONSUMER.DURABLE.CREATE.RUNS.mine", {"stream_name": "RUNS"}),
    ("ACCOUNT.PURGE.$G", {}),
    ("STREAM.LEADER.STEPDOWN.RUNS", {}),
])
async def test_the_jetstream_api_refuses_a_researcher_what_she_may_not_touch(
        alice: Bus, api: str, body: dict[str, object]) -> None:
    with pytest.raises(PermissionDenied):
        await alice.guarded(alice.nc.request(f"$JS.API.{api}", json.dumps(body).encode(), timeout=5))


@pytest.mark.parametrize("subject", [
    "$KV.run_state.run.vision.x", "$KV.ledger.run.vision.x", "$KV.service_keys.policy",
    "$KV.submissions.run.language.x", "$KV.platform.current", "$KV.local_cluster.x", "$KV.node_state.x",
    "$O.evidence.C.vision.x", "$O.evidence.M.cnVucy94L2J1bmRsZS5qc29u", "$O.sources.M.x",
    "run.vision.x.submit.accepted", "run.vision.x.cancel.requested.high", "run.vision.x.submit.requested.x",
    "run.language.x.cancel.requested", "k8s.local.x", "backend.local.apply", "log.vision.x.1",
])
async def test_a_researcher_writes_no_key_object_or_subject_she_does_not_own(alice: Bus, subject: str) -> None:
    with pytest.raises(PermissionDenied):
        await alice.guarded(alice.js.publish(subject, b"{}"))


@pytest.mark.parametrize("config", [
    {"filter_subject": "run.language.>"},
    {"filter_subjects": ["run.vision.>", "run.language.>"]},
    {"filter_subjects": ["run.language.>"]},
    {},
])
async def test_a_consumer_whose_body_filter_differs_from_its_create_subject_is_refused_by_the_server(
        alice: Bus, config: dict[str, object]) -> None:
    name = uuid.uuid4().hex
    reply = await alice.guarded(alice.nc.request(
        f"$JS.API.CONSUMER.CREATE.RUNS.{name}.run.vision.>",
        json.dumps({"stream_name": "RUNS", "config": {"name": name, "ack_policy": "explicit", **config}}).encode(),
        timeout=5))
    assert json.loads(reply.data)["error"]["err_code"] in (10131, 10137)


async def test_her_own_short_lived_consumer_still_reads_her_workspace(alice: Bus) -> None:
    run = f"r-{uuid.uuid4().hex[:12]}"
    body = msgspec.json.encode({"reason": "mine"})
    await alice.guarded(alice.js.publish(f"run.vision.{run}.cancel.requested", body))
    assert [m.subject for m in await replay(alice, stream="RUNS", subject=f"run.vision.{run}.>")] == [
        f"run.vision.{run}.cancel.requested"]


async def test_a_run_id_of_another_workspace_is_refused_unanswered(bus: Bus) -> None:
    run = f"bobs-{uuid.uuid4().hex[:12]}"
    for ws, sid in (("language", "bobs"), ("vision", "eves")):  # bob's run, then eve's under the same id
        body = msgspec.json.encode(SubmitRequested(submission_id=f"{sid}-{run}", config_text="name: x\n",
                                                   workspace=ws))
        await bus.js.publish(f"run.{ws}.{run}.submit.requested", body, headers=headers_for(
            event_id=f"{run}.{ws}", event_type="submit.requested", source="/client", subject=run, workspace=ws,
            attempt=1, traceparent=""))
    bobs, eves = [from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
                  for m in await replay(bus, stream="RUNS", subject=f"run.*.{run}.submit.requested")]
    submitter = Submitter(bus)
    await submitter.on_requested(bobs)
    await submitter.on_requested(bobs)  # bob's redelivery is answered as before
    with pytest.raises(PermanentError, match=f"^run id {run} belongs to a run of workspace language: a run of "
                                             "workspace vision under the same id is refused unanswered"):
        await submitter.on_requested(eves)
    assert [m.subject for m in await replay(bus, stream="RUNS", subject=f"run.vision.{run}.>")] == [
        f"run.vision.{run}.submit.requested"]
    answered = [m.subject.split(".", 3)[3] for m in await replay(bus, stream="RUNS", subject=f"run.language.{run}.>")]
    assert answered[0] == "submit.requested" and len(answered) == 2  # one answer, bob's


async def test_a_submission_id_taken_again_for_another_run_is_refused_not_admitted_past_the_rate(
        tmp_path: Path) -> None:
    sid, runs = f"sid-{uuid.uuid4().hex[:12]}", [f"r{i}-{uuid.uuid4().hex[:12]}" for i in range(2)]
    async with private_server(tmp_path) as (_, bus):
        await sign_as_local_user(bus)
        submitter = Submitter(bus)
        for run in runs:  # the run id is the subject's: anyone may pair one submission id with any number of runs
            await bus.emit(workspace="language", run_id=run, attempt=1, event_type="submit.requested", payload=(
                SubmitRequested(submission_id=sid, config_text="name: x\nentrypoint: train.py\n",
                                workspace="language")), user="")
            [ev] = [from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
                    for m in await replay(bus, stream="RUNS", subject=f"run.language.{run}.>")]
            await submitter.on_requested(ev)
        answers = [[from_message(m.subject, m.headers, m.data) for m in await replay(
            bus, stream="RUNS", subject=f"run.language.{run}.>")][1:] for run in runs]
    assert [[ev.type for ev in answer] for answer in answers] == [["submit.accepted"], ["submit.rejected"]]
    [issue] = answers[1][0].payload(Rejected).reasons
    assert (issue.field, issue.message) == (
        "submission_id", f"submission id {sid!r} is the submission of run {runs[0]}, not of {runs[1]}")


async def test_a_seal_never_replaces_the_bundle_of_another_workspaces_run_of_the_same_id(bus: Bus) -> None:
    run = f"bobs-{uuid.uuid4().hex[:12]}"
    bobs = json.dumps({"run_id": run, "workspace": "language",
                       "terminal": {"event_id": f"{run}.1.exec.succeeded"}}).encode()  # the id eve's has too
    await objects.write(bus, bundle_name(run), bobs, workspace="language")
    eves = lg.Ledger(run_id=run, workspace="vision",
                     seal=lg.Seal(event_id=f"{run}.1.exec.succeeded", type="exec.succeeded", attempt=1, index=0))
    with pytest.raises(PermanentError, match=f"^run {run} of workspace vision is not sealed: runs/{run}/bundle.json "
                                             "is the sealed bundle of the run of that id in workspace language"):
        await store._store_bundle(bus, "vision", eves, {})
    got = await store.read_bundle(bus, run, workspace="language")
    assert got is not None and got[0] == bobs


async def test_a_run_id_held_only_by_an_older_runs_record_is_refused_too(bus: Bus) -> None:
    run = f"old-{uuid.uuid4().hex[:12]}"
    await kv.put(bus, "run_state", f"run.language.{run}", b"{}")  # a run submitted before runs claimed their ids
    body = msgspec.json.encode(SubmitRequested(submission_id=f"eves-{run}", config_text="name: x\n",
                                               workspace="vision"))
    await bus.js.publish(f"run.vision.{run}.submit.requested", body, headers=headers_for(
        event_id=f"{run}.eve", event_type="submit.requested", source="/client", subject=run, workspace="vision",
        attempt=1, traceparent=""))
    [eves] = [from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)
              for m in await replay(bus, stream="RUNS", subject=f"run.vision.{run}.>")]
    with pytest.raises(PermanentError, match=f"^run id {run} belongs to a run of workspace language"):
        await Submitter(bus).on_requested(eves)
    # the same request handled again (a redelivery after a crash) finds the claim its owner's, not eve's
    with pytest.raises(PermanentError, match=f"^run id {run} belongs to a run of workspace language"):
        await Submitter(bus).on_requested(eves)
    claim = await kv.get(bus, "submissions", f"id.{run}")
    assert claim is not None and claim.value == b"language"


@pytest.mark.parametrize(("text", "problem"), [
    ("name: x\nseed: " + "9" * 5000 + "\n",
     "Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"),
    ("name: x\nwhen: 2001-13-45\n", "month must be in 1..12"),
    ("name: x\nwhen: 2001-02-30 10:00:00\n", "day is out of range for month"),
])
@pytest.mark.parametrize("what", ["tau.yaml", "platform.yaml"])
def test_a_scalar_yaml_cannot_construct_is_a_config_error_naming_it(text: str, problem: str, what: str) -> None:
    # a ValueError escaped the submitter's ConfigError handling: the submission was retried, never answered
    with pytest.raises(ConfigError) as refused:
        source.load_yaml(text, path=what, what=what)
    assert str(refused.value) == (f"{what}: a value cannot be read: {problem}\n"
                                  "    fix: quote the value to keep it as a string")


async def test_her_requests_under_a_colleagues_run_id_open_no_record_in_her_workspace(bus: Bus) -> None:
    run, unknown = f"bobs-{uuid.uuid4().hex[:12]}", f"none-{uuid.uuid4().hex[:12]}"

    async def stored(ws: str, run_id: str, kind: str, body: bytes) -> Event:
        await bus.js.publish(f"run.{ws}.{run_id}.{kind}", body, headers=headers_for(
            event_id=f"{run_id}.{ws}.{kind}", event_type=kind, source="/client", subject=run_id, workspace=ws,
            attempt=1, traceparent=""))
        [m] = await replay(bus, stream="RUNS", subject=f"run.{ws}.{run_id}.{kind}")
        return from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream)

    submission = msgspec.json.encode(SubmitRequested(submission_id="s", config_text="name: x\n"))
    assert await projection.project(bus, await stored("language", run, "submit.requested", submission))
    # a platform admin's `tau status RUN` (the newest record of the id) then found hers, "new", and `tau verify`
    # said NOT verified for bob's sealed run
    for ws, run_id, kind, body in (("vision", run, "cancel.requested", b"{}"),
                                   ("vision", run, "submit.requested", submission),
                                   ("vision", unknown, "cancel.requested", b"{}")):
        assert not await projection.project(bus, await stored(ws, run_id, kind, body))
    assert await kv.matching_keys(bus, "run_state", f"run.*.{run}") == [f"run.language.{run}"]
    assert await kv.matching_keys(bus, "run_state", f"run.*.{unknown}") == []
    found = await runrecord.find(bus, run)
    assert found is not None and (found.workspace, found.state) == ("language", "submitted")


def test_an_anchor_file_with_one_line_re_signed_or_claiming_the_pinned_key_is_refused() -> None:
    pinned, eve = (nkeys.from_seed(bytearray(creds.new_identity(name).seed.encode())) for name in ("anchor", "eve"))
    key = pinned.public_key.decode()
    doc = {"schema": anchor.SCHEMA, "time": "t1", "audit": {"first_seq": 1, "last_seq": 3, "last_digest": "ab",
                                                            "drift": []}, "runs": {}}
    genuine = [anchor.sign({**doc, "time": f"t{n}"}, pinned.seed) for n in (1, 2)]
    assert anchor.signed_by(genuine, key) == []
    rewritten = {**doc, "time": "t3", "audit": {**doc["audit"], "last_seq": 2}}  # type: ignore[dict-item]
    by_eve = anchor.sign(rewritten, eve.seed)  # the later lines only, re-signed by another key
    claiming = {**by_eve, "signer": key}  # naming the pinned key, signed by hers
    assert anchor.signed_by([*genuine, by_eve], key) == [
        f"anchor of t3 is signed by {eve.public_key.decode()}, not the pinned anchor key {key} (the file was "
        "re-signed or is another stack's)"]
    assert anchor.signed_by([*genuine, claiming], key) == [
        "anchor of t3 does not verify: signature does not match the request (tampered, or signed by another key)"]


async def test_a_genuine_service_event_replayed_onto_another_runs_subject_is_refused(secure_nats: SecureNats) -> None:
    policy, renderer = await secure_nats.connect("policy"), await secure_nats.connect("renderer")
    try:
        assert policy.signing_key is not None
        mine, theirs = f"eves-{uuid.uuid4().hex[:8]}", f"bobs-{uuid.uuid4().hex[:8]}"
        body = b'{"run": {}}'
        subject = f"run.vision.{mine}.policy.approved"
        headers = headers_for(event_id=f"{mine}.1.policy.approved", event_type="policy.approved",
                              source="/svc/policy", subject=mine, workspace="vision", attempt=1, traceparent="")
        sign_service_headers(policy.signing_key, nats_subject=subject, headers=headers, body=body)
        authors = Authors.of(renderer)
        assert await authors.problem(from_message(subject, headers, body)) is None  # as the policy published it
        # the same signed event, its headers made to agree with the colleague's run (published by anyone who may)
        elsewhere = f"run.vision.{theirs}.policy.approved"
        moved = {**headers, "ce-subject": theirs}
        assert await authors.problem(from_message(elsewhere, moved, body)) == (
            f"policy.approved on {elsewhere} claims policy's key, but signature does not match the request "
            "(tampered, or signed by another key)")
        # into another workspace, headers unchanged: the subject decides first
        other_ws = f"run.language.{mine}.policy.approved"
        assert await authors.problem(from_message(other_ws, headers, body)) == (
            f"ce-workspace says 'vision' where the subject says 'language' on {other_ws}: the subject decides, so "
            "this message is refused")
        # a stage's type in the headers of the priority lane's submission subject a researcher may publish
        high = f"run.vision.{theirs}.submit.requested.high"
        assert await authors.problem(from_message(high, {**moved, "ce-workspace": "vision"}, body)) == (
            f"ce-type says 'policy.approved' where the subject says 'submit.requested' on {high}: the subject "
            "decides, so this message is refused")
    finally:
        await policy.close()
        await renderer.close()


@pytest.mark.parametrize(("wanted", "given"), [
    ("/srv/out/vision/bobs-run-0123456789abcdef/checkpoints",  # another run of her workspace: resumable
     "/srv/out/vision/bobs-run-0123456789abcdef/checkpoints"),
    ("/data/checkpoints/mine", "/srv/out/vision/checkpoints/mine"),  # TauGrid's /data/<path>, read and given as hers
    ("/srv/out/language/bobs-run-0123456789abcdef/checkpoints", None),  # another workspace's checkpoints
    ("/srv/out/vision/../language/x", None),
    ("/var/lib/taugrid/creds", None),
    ("relative/path", None),
])
def test_a_resume_point_outside_her_workspace_is_refused_naming_the_field(wanted: str, given: str | None) -> None:
    ws = Workspace(name="vision", namespace="vision", local_queue="q", output_root="/srv/out")
    point, problem = resume_point(wanted, ws)
    if given is not None:
        assert (point, problem) == (given, None)
    else:
        assert problem is not None and (problem.field, problem.message) == ("resume_from", (
            f"{wanted!r} is outside /srv/out/vision/, the output directory of workspace 'vision': a run resumes "
            "only from its own workspace's checkpoints"))


def test_a_resume_point_set_in_the_configs_env_is_checked_as_tau_run_resumes_is() -> None:
    platform = load_platform(lab_platform(workspaces=[workspace("vision", output_root="/srv/out")]))

    def resolved(value: str) -> ResolvedRun:
        cfg = load_tau_config(f"name: x\nentrypoint: t.py\nruntime:\n  env:\n    TAU_RESUME_FROM: {value}\n")
        return resolve_run(cfg, platform, run_id="x-0123456789abcdef", submission_id="s", workspace="vision",
                           platform_revision=1, config_hash="h", source_object="", source_digest="", user="eve")

    # the container engine mounts the directory it names: the stack's keys, were it let through
    with pytest.raises(ConfigError) as refused:
        resolved("/var/lib/taugrid/creds")
    assert [(i["field"], i["line"], i["message"]) for i in refused.value.issues] == [(
        "runtime.env.TAU_RESUME_FROM", 5, "'/var/lib/taugrid/creds' is outside /srv/out/vision/, the output "
        "directory of workspace 'vision': a run resumes only from its own workspace's checkpoints")]
    assert resolved("/data/ckpt").env["TAU_RESUME_FROM"] == "/srv/out/vision/ckpt"


async def test_a_platform_revision_is_pinned_only_to_reproduce_a_run_of_the_workspace(tmp_path: Path) -> None:
    async with private_server(tmp_path) as (_, bus):
        first = await platformstore.put_text(bus, lab_platform(workspaces=[workspace("vision")]))
        await platformstore.put_text(bus, lab_platform(workspaces=[workspace("vision", max_gpus_per_run=0)]))
        policy = Policy(bus)

        async def decided(run: str, **pinned: object) -> tuple[str, bytes]:
            acc = SubmitAccepted(submission_id=f"s-{run}", config={"name": "x", "entrypoint": "main.py"},
                                 config_hash="h1", **pinned)  # type: ignore[arg-type]
            await bus.emit(workspace="vision", run_id=run, attempt=1, event_type="submit.accepted", payload=acc,
                           user="eve")
            [m] = await replay(bus, stream="RUNS", subject=f"run.vision.{run}.submit.accepted")
            await policy.on_accepted(from_message(m.subject, m.headers, m.data, seq=m.metadata.sequence.stream))
            [answer] = await replay(bus, stream="RUNS", subject=f"run.vision.{run}.policy.*")
            return answer.subject.rsplit(".", 1)[1], answer.data

        # an older revision, which may have allowed what the current one does not, named with no run to reproduce
        kind, body = await decided("eves-new", platform_revision=first)
        assert kind == "rejected"
        [reason] = msgspec.json.decode(body, type=Rejected).reasons
        assert (reason.field, reason.message, reason.fix) == (
            "platform_revision", f"platform revision {first} is pinned only to reproduce a run of workspace vision "
            "resolved against it from the same config (no run named)",
            "submit without platform_revision (the current platform applies), or `tau reproduce RUN`")
        # a reproduction: the named run of this workspace was resolved against that revision from the same config
        kind, approved = await decided("orig")
        assert kind == "approved"
        original = msgspec.json.decode(approved, type=PolicyApproved).run
        await kv.put(bus, "run_state", "run.vision.orig", states.RunRecord(
            run_id="orig", workspace="vision", resolved=msgspec.structs.replace(
                original, platform_revision=first, config_hash="h1")))
        kind, _ = await decided("again", platform_revision=first, reproduces="orig")
        assert kind == "approved"
        # a run of her workspace resolved against another revision, or from another config, is no reproduction
        # of that revision: pinned through it, a new config would still get the withdrawn policy
        for name, revision, config in (("newer", first + 1, "h1"), ("edited", first, "h2")):
            await kv.put(bus, "run_state", f"run.vision.{name}", states.RunRecord(
                run_id=name, workspace="vision", resolved=msgspec.structs.replace(
                    original, platform_revision=revision, config_hash=config)))
            kind, body = await decided(f"via-{name}", platform_revision=first, reproduces=name)
            [reason] = msgspec.json.decode(body, type=Rejected).reasons
            assert (kind, reason.field, reason.message) == ("rejected", "platform_revision", (
                f"platform revision {first} is pinned only to reproduce a run of workspace vision resolved "
                f"against it from the same config; {name} is not one"))
