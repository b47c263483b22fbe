"""Inputs bounded by what they expand to (issue 22, item 5), attacked as a researcher would.

A 150 KB ``tau.yaml`` with 12,000 aliases of one 100 KiB string made the submitter build a 1.2 GB
``submit.accepted``; a 200k-deep JSON body dead-lettered the run-record projection and the seal and made
``tau events`` die with ``RecursionError``, printing nothing. Here each is refused fast, naming the limit and the
fix, and the readers of the bus (the projection, the seal, ``tau events``, the portal) carry on around the hostile
event, which they show as undecodable, while the run it was aimed at ends as it would have."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest

from taugrid import runrecord
from taugrid.bus import Bus, connect, dlq
from taugrid.bus.bootstrap import ensure_consumer
from taugrid.bus.consumer import ConsumerLoop
from taugrid.bus.topology import ConsumerSpec
from taugrid.client.access import Viewer
from taugrid.config.platform import load_platform
from taugrid.config.taujob import load_tau_config
from taugrid.core import contracts as c
from taugrid.core import nesting, states
from taugrid.core.errors import ConfigError
from taugrid.evidence.verify import verify_run
from taugrid.local.podspec import PodSpecError
from taugrid.local.secrets import SecretStore
from taugrid.runrecord import Projector
from taugrid_services.portal import reads
from tests.owners import acting_as, emit_as_owner
from tests.security.sealing import finish_and_seal, new_run, publish_run

HEAD = "name: bomb\nentrypoint: train.py\nexecution:\n  configs:\n"
DEEP = b"[" * 200_000 + b"]" * 200_000  # 400 KB: under every size limit
TOO_DEEP = ("JSON nests deeper than 64 levels (the limit for an event payload, core.limits.EVENT_MAX_DEPTH): not "
            "read; a publisher must send flatter data")


def aliases_of_a_large_string(copies: int = 12_000) -> str:
    return (HEAD + '    blob: &s "' + "x" * (100 * 1024) + '"\n    copies:\n' + "      - *s\n" * copies)


# ---------------------------------------------------------------- YAML


def test_twelve_thousand_aliases_of_one_large_string_are_refused_fast_naming_the_limit_and_the_fix() -> None:
    text = aliases_of_a_large_string()
    assert len(text) < 256 * 1024 and text.count("*s") < 20_000  # under the size and node limits
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()  # CPU seconds: what the refusal costs, not how busy the machine is
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    assert time.process_time() - start < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB: never expanded
    assert str(err.value) == (
        "tau.yaml:6: YAML aliases expand this document to more than 512 KiB (at least 614501 bytes as JSON): "
        "repeating a large value through aliases is refused\n"
        "    fix: write each large value once, or ship large data as a file in the project folder")
    assert err.value.issues[0]["line"] == 6  # `copies:`, where the expansion passed the bound


def test_a_platform_yaml_expanding_past_two_mib_is_refused() -> None:
    text = 'x: &s "' + "y" * (100 * 1024) + '"\nworkspaces: [' + ", ".join(["*s"] * 30) + "]\n"
    with pytest.raises(ConfigError) as err:
        load_platform(text)
    assert str(err.value).startswith("platform.yaml:2: YAML aliases expand this document to more than 2 MiB (at "
                                     "least ")


def test_deep_nesting_is_refused_before_the_parser_recurses() -> None:
    text = HEAD + "    x: " + "[" * 100_000 + "]" * 100_000 + "\n"
    start = time.process_time()  # CPU seconds: what the refusal costs, not how busy the machine is
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    assert time.process_time() - start < 2.0
    assert str(err.value) == ("tau.yaml:5: the document nests deeper than 32 levels of lists and mappings (aliases "
                              "expanded)\n    fix: flatten the nested lists and mappings")


def test_nesting_is_counted_through_aliases_and_thirty_two_levels_still_load() -> None:
    chained = (HEAD + "    a: &a " + "[" * 10 + "1" + "]" * 10 + "\n    b: &b " + "[" * 10 + "*a" + "]" * 10 +
               "\n    c: " + "[" * 10 + "*b" + "]" * 10 + "\n")  # 10 levels each, 30 + 3 once expanded
    with pytest.raises(ConfigError, match=r"^tau.yaml:7: the document nests deeper than 32 levels"):
        load_tau_config(chained)
    deepest = HEAD + "    x: " + "[" * 29 + "1" + "]" * 29 + "\n"  # its scalar at level 32
    value = load_tau_config(deepest).execution.configs["x"]
    for _ in range(29):
        [value] = value
    assert value == 1
    with pytest.raises(ConfigError, match="nests deeper than 32 levels"):
        load_tau_config(HEAD + "    x: " + "[" * 30 + "1" + "]" * 30 + "\n")


def test_merge_keys_and_a_few_aliases_still_work() -> None:
    text = (HEAD + "    base: &base {lr: 0.1, steps: 10}\n    small: {<<: *base, warmup: 5}\n"
            "    again: [*base, *base]\n")
    assert load_tau_config(text).execution.configs == {
        "base": {"lr": 0.1, "steps": 10}, "small": {"lr": 0.1, "steps": 10, "warmup": 5},
        "again": [{"lr": 0.1, "steps": 10}, {"lr": 0.1, "steps": 10}]}


def test_a_secrets_file_that_expands_too_far_fails_the_pod_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "sec-a.yaml"
    path.write_text('api: {token: &t "' + "z" * 100_000 + '"}\nmore: {' +
                    ", ".join(f"k{i}: *t" for i in range(60)) + "}\n")
    path.chmod(0o600)
    with pytest.raises(PodSpecError) as err:
        SecretStore(tmp_path).load("sec-a")
    assert str(err.value).startswith(f"secrets file {path} cannot be read: YAML aliases expand this document to "
                                     "more than 4 MiB")


# ---------------------------------------------------------------- JSON depth


def test_a_payload_is_refused_past_sixty_four_levels_and_brackets_in_strings_do_not_count() -> None:
    assert nesting.decode_any(b"[" * 64 + b"]" * 64) is not None
    for hostile in (b"[" * 65 + b"]" * 65, b'{"a":' * 65 + b"1" + b"}" * 65, DEEP):
        with pytest.raises(msgspec.DecodeError) as err:
            nesting.decode_any(hostile)
        assert str(err.value) == TOO_DEEP
    assert nesting.decode(b'{"reason": "' + b"[" * 1000 + b'"}', c.CancelRequested).reason == "[" * 1000
    start = time.process_time()
    assert nesting.depth(b"[" + b'{"k": [[1]]},' * 150_000 + b"{}]") == 4  # 2 MB, linear
    assert time.process_time() - start < 1.0


def test_the_depth_check_answers_a_short_payload_by_its_length_and_still_counts_a_long_one() -> None:
    # each level takes a byte, so a payload no longer than the limit is never deeper; one byte more can be
    assert [nesting.nests_deeper(data, limit=3) for data in (b"[[[", b"[[[[", b"[[[]]]", b"[[]]x", b'"[[[["')] == [
        False, True, False, False, False]
    assert nesting.nests_deeper(b"[" * 65 + b"]" * 65) and not nesting.nests_deeper(b"[" * 64 + b"]" * 64)


async def publish_deep(bus: Bus, ws: str, run: str, event_type: str = "cancel.requested") -> int:
    """What eve could publish: a person's request on a run of her workspace, its body 200,000 levels deep."""
    return await bus.publish(f"run.{ws}.{run}.{event_type}", DEEP, event_type=event_type, ce_subject=run,
                             msg_id=f"deep-{uuid.uuid4().hex}", workspace=ws)


async def until(check, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_the_projection_dead_letters_a_deep_event_with_the_reason_and_keeps_the_run_going(bus: Bus) -> None:
    ws, run = new_run()
    durable = f"deep-{ws}"
    await ensure_consumer(bus, ConsumerSpec(durable, "RUNS", [f"run.{ws}.>"]))
    loop = ConsumerLoop(bus, stream="RUNS", durable=durable, handler=Projector(bus).project, fetch_timeout=0.2,
                        ordered=False)
    task = asyncio.create_task(loop.run())
    try:
        await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="submit.requested",
                            payload=c.SubmitRequested(submission_id="s1", config_text="name: t\n", workspace=ws))
        deep_seq = await publish_deep(bus, ws, run)
        await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="submit.accepted",
                            payload=c.SubmitAccepted(submission_id="s1", config={"name": "t"}, config_hash="h"))

        async def settled() -> bool:
            record, _ = await runrecord.get(bus, ws, run)
            return (record is not None and record.state == "accepted"
                    and bool(await dlq.dead_letters(bus, durable=durable)))

        await until(settled)
    finally:
        loop.stopping.set()
        await asyncio.wait_for(task, 10)
    [letter] = await dlq.dead_letters(bus, durable=durable)
    assert (letter.kind, letter.stream_seq, letter.error) == (
        "refused", deep_seq, f"undecodable cancel.requested payload: {TOO_DEEP}")
    record, _ = await runrecord.get(bus, ws, run)
    assert record is not None
    assert [h["type"] for h in record.history] == ["submit.requested", "submit.accepted"]
    assert (record.state, record.name, record.cancel_requested) == ("accepted", "t", False)


async def test_a_run_with_a_deep_event_is_still_sealed_and_verifies(bus: Bus, tmp_path: Path) -> None:
    ws, run = new_run()
    await publish_run(bus, ws, run, tmp_path, config_text="name: train\n", config={"name": "train"})
    deep_seq = await publish_deep(bus, ws, run)
    bundle = await finish_and_seal(bus, ws, run)
    assert [e["type"] for e in bundle["events"]] == ["submit.requested", "submit.accepted", "policy.approved",
                                                    "exec.running", "cancel.requested", "exec.succeeded"]
    [deep] = [e for e in bundle["events"] if e["seq"] == deep_seq]
    assert (deep["data"], deep["undecodable"]) == (None, TOO_DEEP)
    assert "undecodable" not in bundle["events"][0]
    assert bundle["terminal"]["state"] == "succeeded"
    report = await verify_run(bus, run, workspace=ws)
    assert (report.ok, report.problems, report.entries) == (True, [], 6), report.problems


async def test_the_portal_usage_skips_a_deep_approval(bus: Bus) -> None:
    ws, run = new_run()
    await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="submit.requested",
                        payload=c.SubmitRequested(submission_id="s1", config_text="name: t\n", workspace=ws))
    with acting_as(bus, "policy"):
        await publish_deep(bus, ws, run, "policy.approved")
    rows = await reads.usage(bus, Viewer("eve", "U" + "A" * 55, "researcher", (ws,)), by="run", since=None)
    assert [(r["run"], r["gpu_seconds"]) for r in rows] == [(run, 0.0)]


def test_tau_events_lists_a_deep_event_as_undecodable(bootstrapped: str, tmp_path: Path) -> None:
    ws, run = new_run()

    async def publish() -> int:
        bus = await connect(bootstrapped, name="test")
        try:
            await runrecord.create(bus, states.RunRecord(run_id=run, workspace=ws, created=time.time()))
            await emit_as_owner(bus, workspace=ws, run_id=run, attempt=1, event_type="submit.requested",
                                payload=c.SubmitRequested(submission_id="s1", config_text="name: t\n", workspace=ws))
            return await publish_deep(bus, ws, run)
        finally:
            await bus.close()

    deep_seq = asyncio.run(publish())
    env = {**os.environ, "TAU_NATS_URL": bootstrapped, "TAU_DATA_DIR": str(tmp_path)}
    tau = [sys.executable, "-m", "taugrid.cli.main", "events", "--run", run]
    table = subprocess.run(tau, capture_output=True, text=True, env=env, timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert [ln.split()[3] for ln in lines] == ["submit.requested", "cancel.requested"]
    assert lines[1].endswith(f"undecodable payload ({len(DEEP)} bytes): {TOO_DEEP}")
    listed = subprocess.run([*tau, "-o", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    docs = [json.loads(ln) for ln in listed.stdout.splitlines()]
    assert [(d["short_type"], d["data"] is None) for d in docs] == [("submit.requested", False),
                                                                     ("cancel.requested", True)]
    assert (docs[1]["seq"], docs[1]["undecodable"]) == (deep_seq, TOO_DEEP)
