"""Shared fixtures: a real nats-server per test session on a free port with a temp JetStream store.

`make test` runs the suite on pytest-xdist workers (``-n``, ``--dist loadfile``: a module's tests on one worker, in
file order, the e2e modules together, see ``scope_of``); a session is then one worker's, so each worker has its own
servers (free ports, temp stores, no fixed path) and, when it runs e2e modules, its own `tau up` stack."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import Bus, connect
from taugrid.bus.bootstrap import bootstrap
from taugrid.stack import natsserver
from tests.secure_nats import SecureNats, started

E2E = "tests/e2e/"
# The e2e modules run on two `tau up` stacks, each on one worker: these on the first (about half the e2e time, as
# measured; test_chaos.py first among them, as in a plain run), every other e2e module on the second.
FIRST_STACK = {f"{E2E}{name}.py" for name in ("test_chaos", "test_cohorts", "test_hardening", "test_pipeline",
                                               "test_portal_browser")}


def scope_of(nodeid: str) -> str:
    """The unit a worker is handed: a module, or the e2e modules of one stack. Sharing a stack, as a plain `pytest`
    run shares one, they run one after another in file order; two stacks are half the e2e time each, a unit short
    enough to keep every worker busy to the end, and no more stacks than that run at a time."""
    module = nodeid.split("::", 1)[0]
    if not module.startswith(E2E):
        return module
    return f"{E2E} (stack 1)" if module in FIRST_STACK else f"{E2E} (stack 2)"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s ``--dist loadfile``, by ``scope_of`` rather than by module."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return Scheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, the e2e modules come first (file order kept): with ``--no-loadscope-reorder`` the
    scheduler hands units out in this order, and the e2e ones are the longest, so one handed out last would keep
    the run going while the other workers sit idle. Every worker sorts alike, as the scheduler requires; a plain
    `pytest` run keeps the collection's order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: not item.nodeid.startswith(E2E))  # stable: file order within each part


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = tmp_path_factory.mktemp("nats")
    proc, port = natsserver.start(store, log_file=store / "nats.log")
    url = f"nats://127.0.0.1:{port}"
    os.environ["TAU_NATS_URL"] = url
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
async def bootstrapped(nats_url: str) -> str:
    bus = await connect(nats_url, name="test-bootstrap")
    await bootstrap(bus)
    await bus.close()
    return nats_url


@pytest.fixture
async def bus(bootstrapped: str) -> AsyncIterator[Bus]:
    b = await connect(bootstrapped, name="test")
    yield b
    await b.close()


@pytest.fixture
def fresh_nats(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """A private server for fault tests (kill and restart)."""
    proc, port = natsserver.start(tmp_path / "nats", log_file=tmp_path / "nats.log")
    yield proc, port, tmp_path / "nats"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
async def private_bus(fresh_nats: tuple[subprocess.Popen[bytes], int, Path]) -> AsyncIterator[Bus]:
    """A bootstrap-named connection to a private, empty server (no streams yet): tests that make their own."""
    _, port, _ = fresh_nats
    bus = await connect(f"nats://127.0.0.1:{port}", name="bootstrap")
    yield bus
    await bus.close()


@pytest.fixture(scope="session")
async def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecureNats]:
    """A bootstrapped nats-server with authentication on (see tests/secure_nats.py); people alice (researcher
    in vision), bob (researcher in language), carol (platform admin); a user per service."""
    async with started(tmp_path_factory.mktemp("secure-nats")) as server:
        yield server
