"""Scaling a running stack: `tau scale` / `tau up --scale` change replica counts live; the supervisor starts
new replicas and retires surplus ones (SIGTERM, drain), and `tau stack` shows them with their pids."""

from __future__ import annotations

import psutil

from tests.e2e.conftest import Stack


def _renderer_pids(stack: Stack) -> set[int]:
    supervisor = psutil.Process(stack.state()["pid"])
    return {
        p.pid for p in supervisor.children()
        if "taugrid_services.renderer" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE
    }


def test_scale_renderer_up_and_back_on_a_running_stack(stack: Stack) -> None:
    before = _renderer_pids(stack)
    assert len(before) == 2  # the session stack starts with --scale renderer=2

    grown = stack.json("scale", "renderer=3")
    assert grown["replicas"]["renderer"] == 3
    listed = {s["pid"] for s in grown["services"] if s["service"] == "renderer"}
    assert _renderer_pids(stack) == listed and before < listed and len(listed) == 3

    shrunk = stack.json("up", "--scale", "renderer=2")  # `tau up --scale` on a running stack rescales too
    assert shrunk["replicas"]["renderer"] == 2 and shrunk["retiring"] == []
    assert _renderer_pids(stack) == before  # the highest replica retired; the first two kept running

    table = stack.tau("stack", check=True).stdout.splitlines()
    renderer = next(line for line in table if line.split()[0] == "renderer")
    # replicas 2 (the restart count is left out: the session stack is shared with the chaos test, which kills one)
    assert renderer.split()[1] == "2" and set(renderer.split(None, 3)[3].split(", ")) == {
        str(p) for p in before
    }
    assert stack.tau("scale", "rendrer=2").returncode == 2
