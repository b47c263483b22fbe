"""An anchored audit trail: nobody but the break-glass identity changes or deletes streams (real server with
authentication), the bootstrap alarms when AUDIT's settings changed, and a signed anchor file kept outside the bus
makes `tau verify --anchor` detect a rewritten ledger and a recreated AUDIT."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgspec
import nkeys
import pytest
from nats.js.api import StreamConfig

from taugrid.bus import Bus, identity, kv
from taugrid.bus.bootstrap import bootstrap
from taugrid.bus.envelope import Event
from taugrid.core.errors import PermissionDenied
from taugrid.evidence import anchor
from taugrid.evidence import ledger as lg
from tests.secure_nats import SecureNats


async def test_only_the_break_glass_identity_changes_or_deletes_streams(secure_nats: SecureNats) -> None:
    boot, glass = await secure_nats.connect("bootstrap"), await secure_nats.connect("breakglass")
    try:
        audit = (await boot.js.stream_info("AUDIT")).config
        with pytest.raises(PermissionDenied, match="stream.update.audit"):
            await boot.guarded(boot.js.update_stream(dataclasses.replace(audit, max_msgs=1)))
        with pytest.raises(PermissionDenied, match="stream.delete.audit"):
            await boot.guarded(boot.js.delete_stream("AUDIT"))
        with pytest.raises(PermissionDenied, match="stream.delete.runs"):
            await boot.guarded(boot.js.delete_stream("RUNS"))
        with pytest.raises(PermissionDenied, match="stream.purge.runs"):
            await boot.guarded(boot.js.purge_stream("RUNS"))
        assert (await boot.js.stream_info("AUDIT")).config.max_msgs in (None, -1)
        # the bootstrap still creates; only the break-glass identity changes and deletes
        await boot.guarded(boot.js.add_stream(StreamConfig(name="GLASS", subjects=["glass.>"])))
        with pytest.raises(PermissionDenied, match="stream.update.glass"):
            await boot.guarded(boot.js.update_stream(StreamConfig(name="GLASS", subjects=["glass.>"], max_msgs=5)))
        await glass.guarded(glass.js.update_stream(StreamConfig(name="GLASS", subjects=["glass.>"], max_msgs=5)))
        assert (await glass.js.stream_info("GLASS")).config.max_msgs == 5
        await glass.guarded(glass.js.delete_stream("GLASS"))
        # re-running the bootstrap needs no stream update
        assert await bootstrap(boot) == []
    finally:
        await boot.close()
        await glass.close()


@pytest.fixture
async def plain(private_bus: Bus) -> Bus:  # a private server without authentication, where the test plays the attacker
    await bootstrap(private_bus)
    return private_bus


async def test_the_bootstrap_alarms_when_audit_settings_changed(plain: Bus) -> None:
    audit = (await plain.js.stream_info("AUDIT")).config
    await plain.js.update_stream(dataclasses.replace(audit, max_msgs=1))
    assert await bootstrap(plain) == ["ALARM: AUDIT max_msgs is 1, declared -1"]


def fake_event(run_id: str, n: int, body: bytes) -> Event:
    return Event(id=f"{run_id}.1.e{n}", type=f"exec.e{n}", source="/svc/test", subject=run_id,
                 time="2026-01-01T00:00:00Z", data=body, attempt=1, seq=n + 1)


async def write_ledger(bus: Bus, run_id: str, bodies: list[bytes]) -> lg.Ledger:
    ledger = lg.Ledger(run_id=run_id, workspace="ws")
    for i, body in enumerate(bodies):
        ledger = lg.append(ledger, fake_event(run_id, i, body))
    await kv.put(bus, "ledger", f"run.ws.{run_id}", lg.encode(ledger))
    return ledger


KEPT = ["submit.requested", "cancel.requested", "exec.succeeded"]


async def until_audit_holds(bus: Bus, last_seq: int) -> None:
    """AUDIT sources RUNS asynchronously."""
    for _ in range(100):
        if (await bus.js.stream_info("AUDIT")).state.last_seq == last_seq:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"AUDIT never reached {last_seq}")


async def test_a_rewritten_history_fails_the_anchor_check(plain: Bus, tmp_path: Path) -> None:
    for i, kind in enumerate(KEPT):  # kinds AUDIT keeps of RUNS (topology.AUDIT_KEPT_EVENTS)
        await plain.js.publish(f"run.ws.r1.{kind}", b"{}", headers={"Nats-Msg-Id": f"m{i}"})
    original = await write_ledger(plain, "r1", [b"a", b"b", b"c"])
    seed = identity.new_user_seed()
    path = tmp_path / "anchors" / "ledger.jsonl"
    await until_audit_holds(plain, 3)
    anchor.append(path, anchor.sign(await anchor.take(plain), seed))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    [doc] = anchor.read(path)
    assert doc["runs"]["ws/r1"] == {"head": original.head, "entries": 3, "digest": ""}
    key = nkeys.from_seed(bytearray(seed)).public_key.decode()
    assert doc["signer"] == key
    assert await anchor.check(plain, anchor.read(path), run_id="r1", workspace="ws", ledger=original,
                              trusted=key) == []

    # rewrite: same length, one event changed; the new chain is internally consistent
    rewritten = await write_ledger(plain, "r1", [b"a", b"B", b"c"])
    assert lg.verify(rewritten) == []
    problems = await anchor.check(plain, anchor.read(path), run_id="r1", workspace="ws", ledger=rewritten,
                                  trusted=key)
    assert problems == [f"ledger entry 2 hashes to {rewritten.head[:12]}…, the anchor of {doc['time']} recorded "
                        f"{original.head[:12]}… (history was rewritten)"]

    # the attack of the issue: empty RUNS, republish edited events, delete AUDIT and let the bootstrap recreate
    # it (on an authenticated server only the break-glass identity could delete it)
    await plain.js.purge_stream("RUNS")
    for i, kind in enumerate(KEPT[:2]):
        await plain.js.publish(f"run.ws.r1.{kind}", b'{"edited":true}', headers={"Nats-Msg-Id": f"x{i}"})
    await plain.js.delete_stream("AUDIT")
    await bootstrap(plain)
    # the new AUDIT sources what RUNS holds now, under sequences of its own (a mirror kept RUNS' 4..5)
    await until_audit_holds(plain, 2)
    problems = await anchor.check(plain, anchor.read(path), run_id="r1", workspace="ws", ledger=original,
                                  trusted=key)
    assert problems == ["AUDIT holds messages 1..2; an anchor recorded 1..3 (AUDIT was emptied, shrunk or "
                        "recreated)"]

    # a forged line (edited after signing) is refused before anything else
    forged = {**doc, "runs": {"ws/r1": {**doc["runs"]["ws/r1"], "head": rewritten.head}}}
    assert (await anchor.check(plain, [forged], run_id="r1", workspace="ws", ledger=rewritten,
                               trusted=key))[0].endswith(
        "does not verify: signature does not match the request (tampered, or signed by another key)")


def sealed(run_id: str, bodies: list[bytes], digest: str) -> lg.Ledger:
    """A ledger of ``bodies`` closed by a terminal event, sealed with the bundle digest ``digest``."""
    ledger = lg.Ledger(run_id=run_id, workspace="ws")
    for i, body in enumerate(bodies):
        ledger = lg.append(ledger, fake_event(run_id, i, body))
    end = Event(id=f"{run_id}.1.end", type="exec.succeeded", source="/svc/test", subject=run_id,
                time="2026-01-01T00:00:00Z", data=b"{}", attempt=1, seq=len(bodies) + 1)
    ledger = lg.claim_seal(lg.append(ledger, end), end)
    assert ledger.seal is not None
    return msgspec.structs.replace(ledger, seal=msgspec.structs.replace(
        ledger.seal, bundle=f"runs/{run_id}/bundle.json", digest=digest))


async def test_a_sealed_ledger_kept_as_its_seal_alone_is_anchored_and_a_rewrite_is_caught(
        plain: Bus, tmp_path: Path) -> None:
    """Issue 27: a sealed run's ledger is kept on the bus as its seal (the bundle's digest, the chain's head and
    length), its entries in the bundle. The anchor records them from the seal; a ledger rewritten together with
    its bundle (another chain, its seal naming the new bundle) or a bundle replaced under the same chain fails."""
    original = sealed("r2", [b"a", b"b"], "d" * 64)
    await kv.put(plain, "ledger", "run.ws.r2", lg.encode(lg.seal_only(original)))
    seed = identity.new_user_seed()
    key = nkeys.from_seed(bytearray(seed)).public_key.decode()
    path = tmp_path / "anchors" / "ledger.jsonl"
    anchor.append(path, anchor.sign(await anchor.take(plain), seed))
    [doc] = anchor.read(path)
    assert doc["runs"]["ws/r2"] == {"head": original.head, "entries": 3, "digest": "d" * 64}
    for honest in (original, lg.seal_only(original)):  # with its entries read back from the bundle, or the seal
        assert await anchor.check(plain, anchor.read(path), run_id="r2", workspace="ws", ledger=honest,
                                  trusted=key) == []

    rewritten = sealed("r2", [b"a", b"B"], "e" * 64)
    for ledger in (rewritten, lg.seal_only(rewritten)):
        assert await anchor.check(plain, anchor.read(path), run_id="r2", workspace="ws", ledger=ledger,
                                  trusted=key) == [
            f"ledger entry 2 hashes to {rewritten.head[:12]}…, the anchor of {doc['time']} recorded "
            f"{original.head[:12]}… (history was rewritten)"]
    replaced = lg.seal_only(sealed("r2", [b"a", b"b"], "e" * 64))
    assert await anchor.check(plain, anchor.read(path), run_id="r2", workspace="ws", ledger=replaced,
                              trusted=key) == [
        f"the ledger seals {'e' * 12}…, the anchor of {doc['time']} recorded {'d' * 12}… (the sealed bundle was "
        "replaced)"]
    truncated = lg.seal_only(sealed("r2", [b"a"], "d" * 64))
    assert await anchor.check(plain, anchor.read(path), run_id="r2", workspace="ws", ledger=truncated,
                              trusted=key) == [
        f"the ledger holds 2 entries; the anchor of {doc['time']} recorded 3 (history was truncated or rewritten)"]
