"""`tau up` returns once every service replica has said it is consuming, so a first submission does not sit on
the bus while services are still importing."""

from __future__ import annotations

from pathlib import Path

from taugrid.cli.stack import _starting


def test_a_replica_is_starting_until_its_log_says_it_started_with_its_own_pid(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    state = {"services": [{"service": "submitter", "replica": 0, "pid": 41},
                          {"service": "renderer", "replica": 1, "pid": 42},
                          {"service": "policy", "replica": 0, "pid": 43}]}
    (tmp_path / "logs" / "submitter-0.log").write_text(
        "2026-11-30 14:50:51,293 submitter[41] INFO taugrid.service: submitter started (pid 41) with 2 consumer(s)\n")
    # an earlier process of the same replica said so, not this one
    (tmp_path / "logs" / "renderer-1.log").write_text("renderer started (pid 7) with 1 consumer(s)\n")
    assert _starting(tmp_path, state) == ["renderer-1", "policy-0"]
