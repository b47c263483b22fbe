"""The embedded nats-server runs with Go's soft memory limit (issue 27): ``natsserver.MEMORY_LIMIT`` unless the
environment names its own ``GOMEMLIMIT``; never with a run's secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.stack import natsserver


def test_the_server_environment_has_the_default_limit_unless_one_is_named() -> None:
    env = natsserver.server_environment({"PATH": "/bin", "TAU_SECRET_WS_KEY": "x"})
    assert env == {"PATH": "/bin", "GOMEMLIMIT": "64MiB"}
    assert natsserver.server_environment({"GOMEMLIMIT": "off"}) == {"GOMEMLIMIT": "off"}
    assert natsserver.server_environment({"GOMEMLIMIT": "2GiB"}) == {"GOMEMLIMIT": "2GiB"}


def test_a_started_server_runs_with_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMEMLIMIT", raising=False)
    monkeypatch.setenv("TAU_SECRET_WS_KEY", "hidden")
    proc, _ = natsserver.start(tmp_path / "nats")
    try:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOMEMLIMIT=64MiB" in environ
        assert not any(e.startswith(b"TAU_SECRET_") for e in environ)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
