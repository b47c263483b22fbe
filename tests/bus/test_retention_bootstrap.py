"""platform.yaml's ``retention`` reaches the streams through the bootstrap, on a real nats-server: a fresh bus gets
the stored platform's limits (``retention.runs``: HISTORY's, which keeps the runs' events, and RUNS' bound on what
its durables have not acked); a changed platform is reported, not applied, until ``--update`` (break-glass)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from pathlib import Path

import pytest
from nats.js.api import KeyValueConfig, StorageType

from taugrid.bus import Bus, connect
from taugrid.bus.bootstrap import audit_drift, bootstrap, main
from taugrid.bus.platformstore import put_text
from taugrid.config.retention import AUDIT_MAX_AGE_S, DAY, LOGS_MAX_AGE_S, RUNS_MAX_AGE_S
from taugrid.core.errors import ConfigError
from tests.feeds import AUDIT_FEEDS, fed_by

PLATFORM = """\
retention:
  runs: {max_age: 7d, max_bytes: 1Gi}
  logs: {max_age: 2d, max_bytes: 256Mi}
  audit: {max_age: 90d}
"""


async def limits(bus: Bus, stream: str) -> tuple[float, int]:
    config = (await bus.js.stream_info(stream)).config
    return config.max_age or 0.0, config.max_bytes or -1


async def test_a_fresh_bus_gets_the_stored_platforms_limits_and_a_change_waits_for_update(
        private_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    # the platform as `tau platform apply` stores it, before the bootstrap makes the streams
    await private_bus.js.create_key_value(KeyValueConfig(bucket="platform", history=64, storage=StorageType.FILE,
                                                         direct=True))
    await put_text(private_bus, PLATFORM)
    assert await bootstrap(private_bus, replicas=1) == []
    assert await limits(private_bus, "RUNS") == (7 * DAY, 1 << 30)
    # HISTORY keeps the runs' events for retention.runs (RUNS' limits only bound what a durable has not acked)
    assert await limits(private_bus, "HISTORY") == (7 * DAY, 1 << 30)
    assert await limits(private_bus, "LOGS") == (2 * DAY, 256 << 20)
    assert await limits(private_bus, "AUDIT") == (90 * DAY, -1)
    assert await limits(private_bus, "K8S") == (7 * DAY, -1)  # not governed by retention: as declared
    assert await audit_drift(private_bus, 90 * DAY) == []

    # the operator lengthens RUNS and AUDIT: the bootstrap identity may not change a stream, so it reports it
    await put_text(private_bus, PLATFORM.replace("max_age: 7d", "max_age: 10d").replace("90d", "120d"))
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        alarms = await bootstrap(private_bus, replicas=1)
    assert alarms == [f"ALARM: AUDIT max_age is {90 * DAY!r}, declared {120 * DAY!r} (the platform's "
                      "retention.audit.max_age changed? apply it with the break-glass identity: "
                      "python -m taugrid.bus.bootstrap --update)"]  # AUDIT keeps less than asked: an alarm
    assert f"stream RUNS: max_age is {7 * DAY!r}, declared {10 * DAY!r}; not changed" in caplog.text
    assert f"stream HISTORY: max_age is {7 * DAY!r}, declared {10 * DAY!r}; not changed" in caplog.text
    assert await limits(private_bus, "RUNS") == (7 * DAY, 1 << 30)
    assert await limits(private_bus, "HISTORY") == (7 * DAY, 1 << 30)

    # --update (the break-glass identity; this server has no authentication) applies both, AUDIT's protections kept
    assert await bootstrap(private_bus, replicas=1, update=True) == []
    assert await limits(private_bus, "RUNS") == (10 * DAY, 1 << 30)
    assert await limits(private_bus, "HISTORY") == (10 * DAY, 1 << 30)
    assert await limits(private_bus, "AUDIT") == (120 * DAY, -1)
    audit = (await private_bus.js.stream_info("AUDIT")).config
    assert (audit.deny_delete, audit.deny_purge) == (True, True)
    assert await fed_by(private_bus, "AUDIT") == AUDIT_FEEDS  # its sources, its feeds, as they were
    history = (await private_bus.js.stream_info("HISTORY")).config
    assert (history.deny_delete, history.deny_purge) == (True, True)

    # a shorter AUDIT age asked for: AUDIT keeping more than asked loses nothing, so it is pending, not an alarm
    await put_text(private_bus, PLATFORM.replace("90d", "30d"))
    with caplog.at_level(logging.WARNING, logger="taugrid.bootstrap"):
        assert await bootstrap(private_bus, replicas=1) == []
    assert f"stream AUDIT: max_age is {120 * DAY!r}, declared {30 * DAY!r}; not changed" in caplog.text


async def test_no_platform_stored_gives_the_defaults(private_bus: Bus) -> None:
    assert await bootstrap(private_bus, replicas=1) == []
    assert await limits(private_bus, "RUNS") == (RUNS_MAX_AGE_S, -1)
    assert await limits(private_bus, "HISTORY") == (RUNS_MAX_AGE_S, -1)
    assert await limits(private_bus, "LOGS") == (LOGS_MAX_AGE_S, -1)
    assert await limits(private_bus, "AUDIT") == (AUDIT_MAX_AGE_S, -1)


def test_the_charts_bootstrap_takes_the_retention_of_the_platform_file_it_is_about_to_apply(
        fresh_nats: tuple[subprocess.Popen[bytes], int, Path], tmp_path: Path) -> None:
    _, port, _ = fresh_nats
    url = f"nats://127.0.0.1:{port}"
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    assert main([url, "--replicas", "1", "--platform", str(tmp_path / "platform.yaml")]) == 0

    async def stored() -> list[tuple[float, int]]:
        bus = await connect(url, name="test")
        try:
            return [await limits(bus, s) for s in ("RUNS", "HISTORY", "LOGS", "AUDIT")]
        finally:
            await bus.close()

    assert asyncio.run(stored()) == [(7 * DAY, 1 << 30), (7 * DAY, 1 << 30), (2 * DAY, 256 << 20), (90 * DAY, -1)]
    (tmp_path / "bad.yaml").write_text("retention: {runs: {max_age: 1h}}\n")
    with pytest.raises(ConfigError, match="runs.max_age is under 1d"):
        main([url, "--platform", str(tmp_path / "bad.yaml")])
