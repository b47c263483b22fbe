"""The pure hash-chained ledger: chaining, idempotent append, tamper detection, first-wins seal."""

from __future__ import annotations

import msgspec
import pytest

from taugrid.bus.envelope import Event, run_traceparent
from taugrid.cli.evidence_cmd import _ledger_head
from taugrid.core.redaction import Redactor
from taugrid.evidence import bundle, packing, store
from taugrid.evidence import ledger as lg


def ev(n: int, kind: str = "exec.running", data: bytes = b"{}") -> Event:
    return Event(
        id=f"r.1.{kind}.{n}",
        type=kind,
        source="/svc/test",
        subject="r",
        time=f"2025-01-01T00:00:0{n}Z",
        data=data,
        attempt=1,
        seq=n,
        traceparent="",
    )


def chain(n: int) -> lg.Ledger:
    led = lg.Ledger(run_id="r", workspace="w")
    for i in range(n):
        led = lg.append(led, ev(i, data=f'{{"i":{i}}}'.encode()))
    return led


def test_entries_chain_from_genesis_and_verify_clean() -> None:
    led = chain(4)
    assert led.entries[0].prev == lg.GENESIS
    assert [e.prev for e in led.entries[1:]] == [e.hash for e in led.entries[:-1]]
    assert led.head == led.entries[-1].hash and len(led.head) == 64
    assert lg.verify(led) == []
    assert lg.decode(lg.encode(led)) == led


def test_the_stored_ledger_is_compressed_and_a_plain_one_of_earlier_releases_still_reads() -> None:
    led = chain(11)
    stored, plain = lg.encode(led), msgspec.json.encode(led)
    assert stored[:2] == packing.GZIP_MAGIC and len(stored) < len(plain) // 2
    assert lg.decode(stored) == led and lg.decode(plain) == led
    with pytest.raises(packing.PackingError):
        lg.decode(stored[: len(stored) // 2])


def test_append_is_idempotent_by_event_id() -> None:
    led = chain(3)
    again = lg.append(led, ev(1, data=b'{"i":1}'))
    assert again is led
    assert lg.append(lg.append(led, ev(9)), ev(9)).entries == lg.append(led, ev(9)).entries


@pytest.mark.parametrize(
    "field,value",
    [("type", "exec.succeeded"), ("payload_sha256", "0" * 64), ("time", "2030-01-01T00:00:00Z")],
)
def test_modified_entry_is_reported_with_its_index(field: str, value: str) -> None:
    led = chain(4)
    bad = msgspec.structs.replace(led.entries[2], **{field: value})
    tampered = msgspec.structs.replace(led, entries=(*led.entries[:2], bad, *led.entries[3:]))
    problems = lg.verify(tampered)
    assert problems and all(p.startswith("entry 2") for p in problems)
    assert "modified" in problems[0]


def test_rehashed_entry_breaks_the_next_link() -> None:
    led = chain(4)
    bad = msgspec.structs.replace(led.entries[1], payload_sha256="f" * 64)
    bad = msgspec.structs.replace(bad, hash=lg.entry_hash(bad))
    tampered = msgspec.structs.replace(led, entries=(led.entries[0], bad, *led.entries[2:]))
    problems = lg.verify(tampered)
    assert len(problems) == 1 and problems[0].startswith("entry 2") and "prev" in problems[0]
    dropped = msgspec.structs.replace(led, entries=(led.entries[0], *led.entries[2:]))
    assert any("index is 2, expected 1" in p for p in lg.verify(dropped))


def test_first_terminal_event_wins_the_seal() -> None:
    led = chain(2)
    cancelled, gave_up = ev(5, "exec.cancelled"), ev(6, "recovery.gave_up")
    led = lg.claim_seal(lg.append(led, cancelled), cancelled)
    led = lg.claim_seal(lg.append(led, gave_up), gave_up)
    assert led.seal is not None and led.seal.event_id == cancelled.id and led.seal.index == 2
    assert lg.claim_seal(led, ev(1)) is led  # non-terminal events never claim
    with pytest.raises(ValueError):
        lg.claim_seal(chain(1), ev(7, "exec.succeeded"))


def test_a_bundle_keeps_its_chain_as_its_event_records_and_lists_it_only_when_they_differ() -> None:
    """Issue 27: each entry is its event's attributes chained, so a bundle whose records are exactly the chain's
    events writes neither its entries nor its head, and every reader recomputes them; a chain with an event not
    among the records (aged out of RUNS before an earlier release's per-event ledger was sealed) is listed, with
    its head, as before."""
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    events = [msgspec.structs.replace(ev(i, data=f'{{"i":{i}}}'.encode()), traceparent=tp)
              for i, tp in enumerate(["", trace, trace, ""])]
    led = lg.extend(lg.Ledger(run_id="r", workspace="w"), events)
    records = bundle.event_records(events)
    # a record names its traceparent where it changes: the second (from "") and the last (back to "")
    assert [r.get("traceparent") for r in records] == [None, trace, None, ""]
    assert bundle.chain_of(records) == list(led.entries)
    kept = bundle.ledger_section(led.head, led.entries, records)
    assert kept == {"entries": "events"}
    assert store.bundle_entries({"events": records, "ledger": kept}) == list(led.entries)

    listed = bundle.ledger_section(led.head, led.entries, [records[0], *records[2:]])
    assert listed == {"head": led.head, "entries": [msgspec.to_builtins(e) for e in led.entries]}
    assert store.bundle_entries({"events": records[:1], "ledger": listed}) == list(led.entries)

    # a record changed in any attribute the entry keeps yields another chain, ending at another head
    for at, field, value in [(1, "payload_sha256", "f" * 64), (1, "time", "2025-01-01T00:00:09Z"),
                             (2, "traceparent", ""), (1, "source", "/svc/other"), (1, "seq", 99),
                             (1, "id", "r.1.forged"), (3, "traceparent", trace)]:
        changed = [{**r, field: value} if i == at else r for i, r in enumerate(records)]
        assert bundle.chain_of(changed)[-1].hash != led.head, (at, field)
    with pytest.raises(msgspec.ValidationError):
        bundle.chain_of([{"id": "r.1.x", "seq": "1"}])
    with pytest.raises(msgspec.ValidationError):
        store.bundle_entries({"events": "not records", "ledger": kept})


def test_a_bundle_counts_its_records_traceparents_from_its_runs_derived_one() -> None:
    """Issue 27: a run's events mostly carry its derived traceparent (``envelope.run_traceparent``), so the bundle's
    first record writes it only where it differs ("run-events", read from the bundle's run id); an earlier bundle's
    "events" counts from "" as before."""
    trace, other = run_traceparent("r"), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for tps, written in [([trace, trace, other], [None, None, other]), (["", trace, ""], ["", trace, ""])]:
        events = [msgspec.structs.replace(ev(i, data=f'{{"i":{i}}}'.encode()), traceparent=tp)
                  for i, tp in enumerate(tps)]
        led = lg.extend(lg.Ledger(run_id="r", workspace="w"), events)
        records = bundle.event_records(events, trace=trace)
        assert [r.get("traceparent") for r in records] == written
        kept = bundle.ledger_section(led.head, led.entries, records, trace=trace)
        assert kept == {"entries": "run-events"}
        assert store.bundle_entries({"run_id": "r", "events": records, "ledger": kept}) == list(led.entries)
        assert _ledger_head({"run_id": "r", "events": records, "ledger": kept}) == led.head
        # another run id (the bundle's digest covers it) counts from another traceparent: another head
        if written[0] is None:
            assert store.bundle_entries({"run_id": "r2", "events": records, "ledger": kept})[-1].hash != led.head
        # an earlier bundle's records, counted from "", read as they were
        earlier = bundle.event_records(events)
        assert bundle.ledger_section(led.head, led.entries, earlier) == {"entries": "events"}
        assert store.bundle_entries({"run_id": "r", "events": earlier, "ledger": {"entries": "events"}}) == \
            list(led.entries)


def test_tau_evidence_shows_the_head_of_a_chain_it_recomputes_as_of_one_listed() -> None:
    events = [ev(i, data=f'{{"i":{i}}}'.encode()) for i in range(3)]
    led = lg.extend(lg.Ledger(run_id="r", workspace="w"), events)
    records = bundle.event_records(events)
    listed = {"head": led.head, "entries": [msgspec.to_builtins(e) for e in led.entries]}
    assert _ledger_head({"events": records, "ledger": {"entries": "events"}}) == led.head
    assert _ledger_head({"events": records, "ledger": listed}) == led.head
    assert _ledger_head({"events": "not records", "ledger": {"entries": "events"}}) is None


def test_a_bundle_writes_its_config_texts_sha256_only_where_a_secret_was_blanked_in_it() -> None:
    """Issue 27: the text's sha256 is recomputed from the text (``config_sha256``: the portal's evidence tab),
    except where a workspace secret was blanked in the sealed text: then it attests the text as submitted."""
    text = "name: x\nruntime: {env: {TOKEN: hunter2-secret}}\n"
    doc = {"config": {"text": text, "path": "tau.yaml"}, "resolved": None, "recovery": [], "outputs": {},
           "attempts": [], "events": []}
    for kept in (bundle.redacted(doc, Redactor([])), bundle.redacted(doc, Redactor(["not-in-it"]))):
        assert "sha256" not in kept["config"] and bundle.config_sha256(kept) == lg.sha256(text.encode())
    blanked = bundle.redacted(doc, Redactor(["hunter2-secret"]))
    assert "hunter2-secret" not in blanked["config"]["text"]
    assert blanked["config"]["sha256"] == bundle.config_sha256(blanked) == lg.sha256(text.encode())
    # a bundle an earlier release sealed records it always
    assert bundle.config_sha256({"config": {"text": "other", "sha256": "ab" * 32}}) == "ab" * 32
    assert bundle.config_sha256({"config": {}}) is None and bundle.config_sha256({}) is None
