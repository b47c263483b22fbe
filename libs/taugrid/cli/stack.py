"""``tau up`` / ``tau down``: the embedded stack (private nats-server + every service as its own process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from taugrid.cli.common import EXIT_FAILED, data_dir, emit_json, fail, output_option
from taugrid.local.pods import pid_alive


def _state(d: Path) -> dict[str, object] | None:
    try:
        return json.loads((d / "stack.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


@click.command(help="Start the embedded stack in the background: nats-server and every service as a process.")
@click.option("--scale", multiple=True, help="SERVICE=N replicas, e.g. --scale renderer=3 (repeatable).")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the stack to be ready.")
@output_option
def up(scale: tuple[str, ...], timeout: float, output: str) -> None:
    d = data_dir()
    d.mkdir(parents=True, exist_ok=True)
    state = _state(d)
    if state and state.get("phase") == "ready" and pid_alive(state.get("pid")):
        _report(state, output, "already running")
        return
    (d / "stack.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "taugrid.stack.supervisor", "--data-dir", str(d)]
    for s in scale:
        cmd += ["--scale", s]
    log = open(d / "supervisor.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + timeout
    shown = False
    while time.time() < deadline:
        state = _state(d)
        if state and state.get("phase") == "ready":
            _report(state, output, "up")
            return
        if proc.poll() is not None:
            fail(
                f"the stack failed to start (exit {proc.returncode}); see {d / 'supervisor.log'}", EXIT_FAILED
            )
        if not shown and output != "json":
            click.echo("starting nats-server and services …", err=True)
            shown = True
        time.sleep(0.2)
    fail(f"the stack did not become ready within {timeout:.0f}s; see {d / 'supervisor.log'}", EXIT_FAILED)


def _report(state: dict[str, object], output: str, what: str) -> None:
    if output == "json":
        emit_json(state)
        return
    services = state.get("services") or []
    assert isinstance(services, list)
    click.echo(f"taugrid stack {what}: {state['nats_url']} (data in {state['data_dir']})")
    for s in services:
        click.echo(f"  {s['service']:<18} replica {s['replica']}  pid {s['pid']}")


@click.command(help="Stop the embedded stack: services drain, then nats-server stops.")
@click.option("--timeout", default=30.0, show_default=True)
def down(timeout: float) -> None:
    d = data_dir()
    state = _state(d)
    if not state or not pid_alive(state.get("pid")):
        click.echo("the stack is not running")
        return
    os.kill(int(state["pid"]), signal.SIGTERM)  # type: ignore[call-overload]
    deadline = time.time() + timeout
    while time.time() < deadline and pid_alive(state.get("pid")):
        time.sleep(0.2)
    if pid_alive(state.get("pid")):
        fail("the stack did not stop in time", EXIT_FAILED)
    click.echo("taugrid stack stopped")
