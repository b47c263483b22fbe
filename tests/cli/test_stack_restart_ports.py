"""`tau up` on a data dir whose stack ran before listens where it did (issue 23: nothing an operator does loses
people): `tau login --server URL` and portal links keep working across `tau down` and `tau up`; a port now taken
by something else is not waited for, a free one is taken instead."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from taugrid.ports import free_port
from taugrid.stack.supervisor import last_ports


def _state(path: Path, nats_url: str, portal_url: str) -> Path:
    path.write_text(json.dumps({"phase": "stopped", "nats_url": nats_url, "portal": {"url": portal_url}}))
    return path


def test_the_last_stacks_ports_are_taken_again_when_free(tmp_path: Path) -> None:
    bus, portal = free_port(), free_port()
    state = _state(tmp_path / "stack.json", f"nats://127.0.0.1:{bus}", f"http://127.0.0.1:{portal}")
    assert last_ports(state) == (bus, portal)
    ha = _state(tmp_path / "ha.json", f"nats://127.0.0.1:{bus},nats://127.0.0.1:{free_port()}",
                f"http://127.0.0.1:{portal}")
    assert last_ports(ha) == (bus, portal)  # the first server's


def test_a_port_taken_meanwhile_or_no_previous_stack_means_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = _state(tmp_path / "stack.json", f"nats://127.0.0.1:{port}", "http://127.0.0.1:not-a-port")
        assert last_ports(state) == (None, None)
    assert last_ports(tmp_path / "none.json") == (None, None)
    (tmp_path / "bad.json").write_text("{")
    assert last_ports(tmp_path / "bad.json") == (None, None)
