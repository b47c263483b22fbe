"""A port probed free can be taken before nats-server binds it (a parallel process's server, an outgoing
connection's local port). A start whose ports were all probed is made again on fresh ones when the server says a
port was in use; a port the caller chose is never swapped. Seen in CI: a 3-server cluster whose node could not bind
its route port never elected a JetStream leader, and a client port another process held made the start look
successful while the server had exited."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from taugrid.core.errors import TauError
from taugrid.ports import free_port
from taugrid.stack import natsserver


@pytest.fixture
def held() -> Iterator[int]:
    """A loopback port another process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def probes_first(monkeypatch: pytest.MonkeyPatch, busy: int, *, at: int = 1) -> list[int]:
    """``free_port`` answering ``busy`` at its ``at``-th call (the race lost), real probes otherwise: the ports it
    gave."""
    given: list[int] = []

    def probe() -> int:
        given.append(busy if len(given) + 1 == at else free_port())
        return given[-1]
    monkeypatch.setattr(natsserver, "free_port", probe)
    return given


def test_a_server_whose_probed_port_was_taken_starts_again_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: int) -> None:
    given = probes_first(monkeypatch, held)
    proc, port = natsserver.start(tmp_path / "nats", log_file=tmp_path / "nats.log")
    try:
        assert port != held and given == [held, port] and proc.poll() is None
        assert b"address already in use" in (tmp_path / "nats.log").read_bytes()
    finally:
        proc.kill()
        proc.wait()


def test_a_port_the_caller_chose_is_never_swapped(tmp_path: Path, held: int) -> None:
    with pytest.raises(TauError, match=r"exited at start \(code 1\) before listening"):
        natsserver.start(tmp_path / "nats", port=held, log_file=tmp_path / "nats.log")


def test_a_cluster_whose_route_port_was_taken_starts_again_on_fresh_ports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: int) -> None:
    given = probes_first(monkeypatch, held, at=4)  # three client ports, then the first node's route port
    cluster = natsserver.Cluster(tmp_path / "nats")
    cluster.start()
    try:
        assert len(given) == 12 and held == given[3]  # six ports a start: a client and a route port a node
        assert held not in {n.route.cluster_port for n in cluster.nodes} | {n.port for n in cluster.nodes}
        assert all(n.proc is not None and n.proc.poll() is None for n in cluster.nodes)
        assert b"address already in use" in (tmp_path / "nats-n0.log").read_bytes()
    finally:
        cluster.stop()
