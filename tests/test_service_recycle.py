"""``Service.recycle``: a service asks to be started afresh, stops as on SIGTERM (its loops and timers end, its bus
is closed), and ``main`` then runs the same program again in the same process (``os.execv``: same pid, arguments
and environment); a service that stops for any other reason is not started again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taugrid import service
from taugrid.service import Service


async def test_a_recycled_service_drains_and_says_why(bootstrapped: str) -> None:
    ticks: list[int] = []
    seen: list[Service] = []

    async def start(svc: Service) -> None:
        seen.append(svc)

        async def tick() -> None:
            ticks.append(1)
            if len(ticks) == 3:
                svc.recycle("swollen")
                svc.recycle("asked twice")  # the first reason stands

        svc.every(0.01, tick)

    why = await asyncio.wait_for(service.run("recycle-test", start, url=bootstrapped), 20)
    [svc] = seen
    assert (why, svc.recycling, len(ticks)) == ("swollen", "swollen", 3)
    assert svc.stopping.is_set() and svc.bus.nc.is_closed


async def test_a_stop_asked_while_draining_to_be_recycled_is_for_good(bootstrapped: str) -> None:
    """SIGTERM (``terminate``) during a recycle's drain wins: ``tau down`` waits for the process to exit, not for
    it to start again; and a recycle asked once stopping changes nothing."""
    seen: list[Service] = []

    async def start(svc: Service) -> None:
        seen.append(svc)

        async def tick() -> None:
            svc.recycle("swollen")
            svc.terminate()
            svc.recycle("asked again while stopping")

        svc.every(0.01, tick)

    why = await asyncio.wait_for(service.run("recycle-test", start, url=bootstrapped), 20)
    assert (why, seen[0].recycling, seen[0].stopping.is_set()) == ("", "", True)


@pytest.mark.parametrize(("why", "execs"), [("swollen", 1), ("", 0)])
def test_main_runs_the_program_again_only_when_recycled(monkeypatch: pytest.MonkeyPatch, why: str,
                                                         execs: int) -> None:
    calls: list[tuple[str, list[str]]] = []

    async def run(name: str, start: object, *, given: object = None) -> str:
        return why

    monkeypatch.setattr(service, "run", run)
    monkeypatch.setattr(service.os, "execv", lambda path, args: calls.append((path, list(args))))
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "taugrid_services.local_cluster"])
    monkeypatch.setitem(sys.modules, "uvloop", None)  # main installs uvloop's policy: not in this test process
    service.main("recycle-test", lambda svc: asyncio.sleep(0))
    assert calls == [(sys.executable, [sys.executable, "-m", "taugrid_services.local_cluster"])] * execs


PROGRAM = """
import os, sys
from pathlib import Path
from taugrid.service import main

log = Path(sys.argv[1])

async def start(svc):
    starts = log.read_text().splitlines() if log.exists() else []
    log.write_text("\\n".join([*starts, str(os.getpid())]) + "\\n")
    if not starts:
        svc.recycle("the first start asks for a second")
    else:
        svc.stop()

main("recycle-program", start)
"""


def test_a_recycled_program_runs_again_in_the_same_process(bootstrapped: str, tmp_path: Path) -> None:
    """The real ``os.execv``: the program's second start sees the first one's record, under the same pid, and the
    process then ends as a stopped service does (exit 0)."""
    log = tmp_path / "starts"
    env = {**os.environ, "TAU_NATS_URL": bootstrapped}
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], env=env, timeout=60, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    first, second = log.read_text().splitlines()
    assert first == second and "recycling: the first start asks for a second" in done.stderr
