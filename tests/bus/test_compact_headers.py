"""A service's event is stored without the headers its subject or its ``ce-source`` say (issue 27), and reads,
orders and verifies exactly as the full form did: nothing an attacker changes passes."""

from __future__ import annotations

import nkeys
import pytest

from taugrid.bus import identity
from taugrid.bus.envelope import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    SignatureInvalid,
    compact,
    dedup_key,
    expanded,
    from_message,
    headers_for,
    now_iso,
    ordering_key,
    received_service_form,
    run_traceparent,
    service_form,
    sign_service_headers,
    store_stamps,
    store_time,
    verify_service_signature,
    with_id,
)

RUN = "hello-3f2a9c"
SUBJECT = f"run.team-a.{RUN}.policy.approved"
BODY = b'{"run":{"run_id":"hello-3f2a9c"}}'
KEY = nkeys.from_seed(identity.new_user_seed())
TRACE = "00-28422da026bec296c0d6983c45428324-41afdc1dafc72b14-01"


def full(subject: str = SUBJECT, *, run: str = RUN, workspace: str = "team-a", attempt: int = 1,
         event_type: str = "policy.approved", msg_id: str = "", now: bool = False,
         traceparent: str = TRACE) -> dict[str, str]:
    """A service's signed headers; ``now``: stamped "now" (no ce-time, as ``Bus.publish`` writes a run event
    published at once), else with a relayed time."""
    headers = headers_for(event_id=msg_id or f"{run}.{attempt}.{event_type}", event_type=event_type,
                          source="/svc/policy", subject=run, workspace=workspace, attempt=attempt,
                          traceparent=traceparent,
                          user="alice", time="" if now else "2026-12-02T00:22:35.746Z", store_stamped=now)
    sign_service_headers(KEY, nats_subject=subject, headers=headers, body=BODY)
    return headers


def test_a_run_event_stores_only_what_its_subject_and_source_do_not_say() -> None:
    stored = compact(SUBJECT, full(), service_signed=True)
    assert sorted(stored) == ["Nats-Msg-Id", "ce-source", "ce-tauuser", "ce-time", SIGNATURE_HEADER, "traceparent"]
    assert stored["Nats-Msg-Id"] == dedup_key(f"{RUN}.1.policy.approved") == "wjMxcap4NiAZmLOu"
    assert (size(full()), size(stored)) == (533, 282)
    now = compact(SUBJECT, full(now=True), service_signed=True)  # stamped by the store: no ce-time
    assert sorted(now) == ["Nats-Msg-Id", "ce-source", "ce-tauuser", SIGNATURE_HEADER, "traceparent"]
    assert size(now) == 247


def size(headers: dict[str, str]) -> int:  # as NATS writes them: "name: value\r\n"
    return sum(len(k) + len(v) + 4 for k, v in headers.items())


def test_the_compact_form_reads_as_the_full_one() -> None:
    whole = from_message(SUBJECT, full(), BODY, seq=7, stored=1.5)
    short = from_message(SUBJECT, compact(SUBJECT, full(), service_signed=True), BODY, seq=7, stored=1.5)
    fields = ("id", "type", "source", "subject", "time", "workspace", "attempt", "traceparent", "ce_type", "user",
              "problem", "seq", "stored", "lane")
    assert {f: getattr(short, f) for f in fields} == {f: getattr(whole, f) for f in fields}
    assert (short.id, short.ce_type, short.subject, short.workspace, short.attempt) == (
        f"{RUN}.1.policy.approved", "io.taugrid.run.policy.approved.v1", RUN, "team-a", 1)
    assert short.signer == "" and whole.signer == KEY.public_key.decode()
    assert short.to_json_head() | {"signer": ""} == whole.to_json_head() | {"signer": ""}


def test_the_signature_over_the_full_form_verifies_on_the_compact_one() -> None:
    ev = from_message(SUBJECT, compact(SUBJECT, full(), service_signed=True), BODY)
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()
    high = f"{SUBJECT}.high"
    ev = from_message(high, compact(high, full(high), service_signed=True), BODY)
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()


@pytest.mark.parametrize("tamper", ["body", "workspace", "run", "type", "time", "source", "user", "attempt",
                                    "msg-id", "long-msg-id", "ce-id", "trace-free", "other-key"])
def test_any_change_to_a_compact_event_breaks_its_signature(tamper: str) -> None:
    stored, subject, body, key = compact(SUBJECT, full(), service_signed=True), SUBJECT, BODY, KEY.public_key.decode()
    if tamper == "body":
        body = b'{"run":{"run_id":"other"}}'
    elif tamper == "workspace":
        subject = f"run.team-b.{RUN}.policy.approved"
    elif tamper == "run":
        subject = "run.team-a.other-run.policy.approved"
    elif tamper == "type":
        subject = f"run.team-a.{RUN}.render.applied"
    elif tamper == "time":
        stored["ce-time"] = "2020-01-01T00:00:00.000Z"
    elif tamper == "source":
        stored["ce-source"] = "/svc/renderer"
    elif tamper == "user":
        stored["ce-tauuser"] = "mallory"
    elif tamper == "attempt":
        stored["ce-attempt"] = "2"
    elif tamper == "msg-id":  # the key a reader derives ce-id from: another suffix is another id
        stored["Nats-Msg-Id"] = f"{stored['Nats-Msg-Id']}:x"
    elif tamper == "long-msg-id":  # an id in the long form, as stored before: signed through it too
        stored["Nats-Msg-Id"] = f"{RUN}.2.policy.approved"
    elif tamper == "ce-id":
        stored["ce-id"] = f"{RUN}.1.policy.approved.x"
    elif tamper == "trace-free":  # a header the form never covered stays free, as before: traceparent
        stored.pop("traceparent")
    else:
        key = identity.public_key(identity.new_user_seed())
    ev = from_message(subject, stored, body)
    if tamper == "trace-free":
        assert verify_service_signature(ev, public_key=key) == key
        return
    with pytest.raises(SignatureInvalid):
        verify_service_signature(ev, public_key=key)


@pytest.mark.parametrize("case", ["compact", "full", "now", "high-lane", "attempt", "written-back", "log", "k8s",
                                  "node", "bare"])
def test_the_form_read_from_a_received_event_is_the_one_over_its_expanded_headers(case: str) -> None:
    """A consumer checks a service's signature over ``received_service_form``, read from the event without
    building ``expanded``: for any event, the bytes ``service_form`` gives over the expanded headers."""
    subject, stored = SUBJECT, compact(SUBJECT, full(), service_signed=True)
    if case == "full":
        stored = full()
    elif case == "now":
        stored = compact(SUBJECT, full(now=True), service_signed=True)
    elif case == "high-lane":
        subject = f"{SUBJECT}.high"
        stored = compact(subject, full(subject), service_signed=True)
    elif case == "attempt":
        stored = compact(SUBJECT, full(attempt=3), service_signed=True)
    elif case == "written-back":
        stored = {**stored, "ce-subject": RUN, "ce-workspace": "team-a", "ce-attempt": "1"}
    elif case == "log":
        subject = f"log.team-a.{RUN}.1"
        stored = compact(subject, full(subject, event_type="log.chunk"), service_signed=True)
    elif case == "k8s":
        subject = "k8s.local.workload.team-a.job-1.changed"
        stored = compact(subject, full(subject, event_type="workload.changed"), service_signed=True)
    elif case == "node":
        subject = "node.n1.sample"
        stored = compact(subject, full(subject, event_type="node.sample"), service_signed=True)
    else:
        stored = {}
    ev = from_message(subject, stored, BODY, seq=3, stored=STORED)
    assert received_service_form(ev) == service_form(nats_subject=subject, headers=expanded(ev), body=BODY)


def test_a_derived_header_written_back_agrees_or_is_refused() -> None:
    stored = compact(SUBJECT, full(), service_signed=True)
    same = from_message(SUBJECT, {**stored, "ce-subject": RUN, "ce-workspace": "team-a", "ce-attempt": "1"}, BODY)
    assert same.problem == "" and verify_service_signature(same, public_key=KEY.public_key.decode())
    moved = from_message(SUBJECT, {**stored, "ce-subject": "bobs-run"}, BODY)
    assert moved.problem == (f"ce-subject says 'bobs-run' where the subject says '{RUN}' on {SUBJECT}: the subject "
                             "decides, so this message is refused")


def test_values_a_reader_could_not_derive_are_kept() -> None:
    odd = "a.b"  # not its own subject token (a_b)
    subject = "run.team-a.a_b.policy.approved"
    assert compact(subject, full(subject, run=odd), service_signed=True)["ce-subject"] == odd
    second = full(attempt=2)
    assert compact(SUBJECT, second, service_signed=True)["ce-attempt"] == "2"
    squatted = {**full(), "Nats-Msg-Id": f"{RUN}.1.policy.approved.mark"}  # Bus.publish's unforgeable id
    kept = compact(SUBJECT, squatted, service_signed=True)
    assert kept["ce-id"] == f"{RUN}.1.policy.approved"
    assert from_message(SUBJECT, kept, BODY).id == f"{RUN}.1.policy.approved"
    watch = "k8s.local.pod.default.hello-3f2a9c-a1-pod.modified"
    headers = headers_for(event_id="pod-x.2", event_type="pod.modified", family="k8s", source="/svc/local-cluster",
                          subject=RUN, workspace="team-a", attempt=1, traceparent="", dedup=False)
    stored = compact(watch, headers, service_signed=False)
    # its run and workspace are not in its subject; its type is (io.taugrid.k8s.<kind>.<change>.v1)
    assert sorted(stored) == ["ce-id", "ce-source", "ce-subject", "ce-time", "ce-workspace"]
    ev = from_message(watch, stored, b"{}")
    assert (ev.type, ev.ce_type, ev.id, ev.subject, ev.workspace) == (
        "pod.modified", "io.taugrid.k8s.pod.modified.v1", "pod-x.2", RUN, "team-a")
    assert from_message(f"{watch}.high", stored, b"{}").ce_type == "io.taugrid.k8s.pod.modified.v1"
    renamed = {**headers, "ce-type": "io.taugrid.k8s.pod.modified.v2"}  # another version: kept
    assert compact(watch, renamed, service_signed=False)["ce-type"] == "io.taugrid.k8s.pod.modified.v2"


def test_a_persons_request_is_never_compacted_by_the_bus() -> None:
    """Bus.publish stores people's requests whole (the published contract asks every client for them); compact
    itself keeps a tau-signer that is not a service's."""
    subject = f"run.team-a.{RUN}.cancel.requested"
    headers = full(subject, event_type="cancel.requested")
    assert compact(subject, headers, service_signed=False)[SIGNER_HEADER] == KEY.public_key.decode()


def test_a_run_is_kept_in_order_by_the_same_key_compact_or_not() -> None:
    assert ordering_key(SUBJECT, compact(SUBJECT, full(), service_signed=True)) == ordering_key(SUBJECT, full()) == RUN
    assert ordering_key(f"{SUBJECT}.high", {}) == RUN
    assert ordering_key(f"log.team-a.{RUN}.1", {}) == RUN
    assert ordering_key("k8s.local.pod.default.p.modified", {"ce-subject": RUN}) == RUN
    assert ordering_key("node.n1.sample", {}) == "node.n1.sample"


# ---------------------------------------------------------------- short message ids, store-stamped times


STORED = 1764656535.746321  # 2025-12-02T06:22:15.746321Z, when the stream stored it


@pytest.mark.parametrize("subject", [SUBJECT, f"{SUBJECT}.high"])
@pytest.mark.parametrize(("attempt", "suffix"), [(1, ""), (1, "445cc79581bc"), (2, "node-1.7"), (12, "")])
def test_a_short_message_id_reads_back_as_the_whole_id(subject: str, attempt: int, suffix: str) -> None:
    """The stream deduplicates by the key (the id's digest); a reader gets the id from the subject, the attempt
    and the suffix after the key, in either lane."""
    whole = f"{RUN}.{attempt}.policy.approved" + (f".{suffix}" if suffix else "")
    stored = compact(subject, full(subject, attempt=attempt, msg_id=whole), service_signed=True)
    assert stored["Nats-Msg-Id"] == dedup_key(whole) + (f":{suffix}" if suffix else "")
    assert "ce-id" not in stored and len(dedup_key(whole)) == 16
    ev = from_message(subject, stored, BODY)
    assert (ev.id, ev.attempt) == (whole, attempt)
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()


def test_distinct_ids_get_distinct_keys_and_a_repeat_the_same() -> None:
    ids = [f"{RUN}.1.policy.approved", f"{RUN}.2.policy.approved", f"{RUN}.1.policy.approved.a",
           f"{RUN}.1.policy.approved.b", f"{RUN}x.1.policy.approved"]
    assert len({dedup_key(i) for i in ids}) == len(ids)
    assert dedup_key(ids[0]) == dedup_key(f"{RUN}.1.policy.approved")


def test_a_message_stored_with_long_ids_and_its_time_reads_as_it_did() -> None:
    """History stored before: ``Nats-Msg-Id`` the whole id (no ce-id), ``ce-time`` present; whatever the run id's
    length (one of 16 characters or more has no dot among the first 16)."""
    for run in (RUN, "warmup-980e187a5c7aa81f", "abcdefghijklmnop"):
        subject = f"run.team-a.{run}.admission.admitted"
        whole = f"{run}.1.admission.admitted.445cc79581bc"
        old = {"ce-source": "/svc/admission-watcher", "ce-time": "2026-12-02T06:36:16.736Z", "Nats-Msg-Id": whole}
        ev = from_message(subject, old, b"{}", stored=STORED)
        assert (ev.id, ev.time, ev.subject) == (whole, "2026-12-02T06:36:16.736Z", run)


def test_a_copy_under_another_message_id_keeps_the_whole_id() -> None:
    """The DLQ and `tau dlq replay` store the event under another Nats-Msg-Id: its ce-id is written out first."""
    whole = f"{RUN}.1.policy.approved.s1"
    stored = compact(SUBJECT, full(msg_id=whole, now=True), service_signed=True)
    copy = with_id(SUBJECT, stored)
    assert copy["ce-id"] == whole and "ce-time" not in copy
    copy["Nats-Msg-Id"] = "dlq.RUNS.policy.7"
    ev = from_message(SUBJECT, copy, BODY)
    assert ev.id == whole
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()


def test_an_event_stamped_now_reads_the_time_the_stream_stored_it() -> None:
    ev = from_message(SUBJECT, compact(SUBJECT, full(now=True), service_signed=True), BODY, stored=STORED)
    assert ev.time == store_time(STORED) == "2025-12-02T06:22:15.746Z"
    assert len(ev.time) == len(now_iso()) and ev.happened == 1764656535.746
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()
    # read without a store time (a message never stored): no time, as a message without a ce-time always had
    assert from_message(SUBJECT, compact(SUBJECT, full(now=True), service_signed=True), BODY).time == ""
    # a relayed time is kept and wins over the store's
    relayed = from_message(SUBJECT, compact(SUBJECT, full(), service_signed=True), BODY, stored=STORED)
    assert relayed.time == "2026-12-02T00:22:35.746Z"


def test_a_store_time_is_written_alike_from_a_delivery_and_from_a_raw_read() -> None:
    """A consumer's delivery gives nats-py's timestamp (the nanoseconds rounded to the microsecond), a replay
    the nanoseconds / 1e9: the same time text from both, at a millisecond's edge too."""
    import datetime as dt

    # the last four were a millisecond apart when the microseconds were rounded from ``stored * 1e6``
    for nanos in (1764656535_746321000, 1764656535_999999600, 1764656535_000000400, 1764656535_999_499_999,
                  1764657164_892999499, 1764657040_888999399, 1764657343_865999399, 1764657255_155999504):
        delivered = dt.datetime.fromtimestamp(nanos / 1_000_000_000.0, dt.UTC)
        assert store_time(delivered.timestamp()) == store_time(nanos / 1e9) == \
            delivered.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for day in (0, 20_000, 20_424, 40_000):  # any date, against the standard library's own text
        stored = day * 86_400 + 86_399.9996
        assert store_time(stored) == dt.datetime.fromtimestamp(stored, dt.UTC).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize("tamper", ["add-time", "drop-time"])
def test_a_time_added_to_or_taken_off_a_signed_event_breaks_its_signature(tamper: str) -> None:
    """Stamped by the store, the event is signed with no time: a ce-time added later (to shift when it
    happened) fails; one taken off an event signed with its time (to have the store's instead) fails too."""
    if tamper == "add-time":
        stored = compact(SUBJECT, full(now=True), service_signed=True)
        stored["ce-time"] = "2026-12-02T00:00:00.000Z"
    else:
        stored = compact(SUBJECT, full(), service_signed=True)
        del stored["ce-time"]
    with pytest.raises(SignatureInvalid):
        verify_service_signature(from_message(SUBJECT, stored, BODY, stored=STORED), public_key=KEY.public_key.decode())


def test_only_a_services_run_event_leaves_its_time_to_the_store() -> None:
    assert store_stamps(SUBJECT) and store_stamps(f"{SUBJECT}.high")
    assert not store_stamps(f"run.team-a.{RUN}.submit.requested")  # a person signs and is checked on its time
    assert not store_stamps(f"run.team-a.{RUN}.submit.requested.high")
    assert not store_stamps(f"run.team-a.{RUN}.cancel.requested")
    assert not store_stamps(f"log.team-a.{RUN}.1") and not store_stamps("k8s.local.pod.default.p.modified")
    # a person's request read without its ce-time has none: its freshness check refuses it
    request = {k: v for k, v in full(f"run.team-a.{RUN}.cancel.requested", event_type="cancel.requested").items()
               if k != "ce-time"}
    assert from_message(f"run.team-a.{RUN}.cancel.requested", request, BODY, stored=STORED).time == ""


# ---------------------------------------------------------------- derived traceparents


DERIVED = run_traceparent(RUN)


def test_a_runs_derived_traceparent_is_sha256_of_its_id() -> None:
    """The documented hash (envelope's docstring): trace id and span id from sha256 of the run id, sampled."""
    assert DERIVED == "00-5f4134f9c629140babcbe44d6dfe9fdb-16c5bd24cb11ee66-01"
    assert run_traceparent("other-run") != DERIVED


@pytest.mark.parametrize("subject", [SUBJECT, f"{SUBJECT}.high"])
def test_a_run_event_in_its_runs_derived_trace_stores_none_and_reads_it_back(subject: str) -> None:
    headers = full(subject, traceparent=DERIVED, now=True)
    stored = compact(subject, headers, service_signed=True)
    assert sorted(stored) == ["Nats-Msg-Id", "ce-source", "ce-tauuser", SIGNATURE_HEADER]
    assert size(compact(subject, full(subject, now=True), service_signed=True)) - size(stored) == 70
    ev = from_message(subject, stored, BODY)
    assert ev.traceparent == DERIVED and ev.to_json_head()["traceparent"] == DERIVED
    assert expanded(ev)["traceparent"] == DERIVED
    assert verify_service_signature(ev, public_key=KEY.public_key.decode()) == KEY.public_key.decode()
    log = f"log.team-a.{RUN}.1"  # a log chunk carries the run's trace too
    chunk = headers_for(event_id=f"{RUN}.1.log.0", event_type="log.chunk", family="log", source="/svc/log-shipper",
                        subject=RUN, workspace="team-a", attempt=1, traceparent=DERIVED, dedup=False)
    assert "traceparent" not in compact(log, chunk, service_signed=False)
    assert from_message(log, compact(log, chunk, service_signed=False), b"{}").traceparent == DERIVED


def test_a_traceparent_the_subject_does_not_derive_is_stored_and_read_as_it_is() -> None:
    """A submission inside a trace of its own (an ambient OpenTelemetry context), another run's derived trace,
    and any traceparent on a message whose subject names no run are kept; one stored before reads as stored."""
    assert compact(SUBJECT, full(), service_signed=True)["traceparent"] == TRACE
    other = run_traceparent("bobs-run")
    kept = compact(SUBJECT, full(traceparent=other), service_signed=True)
    assert kept["traceparent"] == other and from_message(SUBJECT, kept, BODY).traceparent == other
    watch = "k8s.local.pod.default.hello-3f2a9c-a1-pod.modified"
    headers = headers_for(event_id="pod-x.2", event_type="pod.modified", family="k8s", source="/svc/local-cluster",
                          subject=RUN, workspace="team-a", attempt=1, traceparent=DERIVED, dedup=False)
    assert compact(watch, headers, service_signed=False)["traceparent"] == DERIVED
    assert from_message(watch, {"ce-type": "io.taugrid.k8s.pod.modified.v1"}, b"{}").traceparent == ""
    assert from_message("node.n1.sample", {}, b"{}").traceparent == ""
    stored_before = {**full(), "traceparent": TRACE}
    assert from_message(SUBJECT, stored_before, BODY).traceparent == TRACE


def test_a_traceparent_is_covered_by_no_signature_so_deriving_it_changes_none() -> None:
    """Adding, taking off or changing a run event's traceparent leaves its signature valid, as it always did
    (neither form covers it): the derived value can make a reader see nothing a service signed differently."""
    stored = compact(SUBJECT, full(traceparent=DERIVED), service_signed=True)
    key = KEY.public_key.decode()
    for variant in (stored, {**stored, "traceparent": DERIVED}, {**stored, "traceparent": TRACE}):
        ev = from_message(SUBJECT, variant, BODY)
        assert verify_service_signature(ev, public_key=key) == key
        assert (ev.id, ev.type, ev.subject, ev.workspace, ev.source, ev.user, ev.time) == (
            f"{RUN}.1.policy.approved", "policy.approved", RUN, "team-a", "/svc/policy", "alice",
            "2026-12-02T00:22:35.746Z")
