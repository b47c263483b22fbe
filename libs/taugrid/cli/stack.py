"""``tau up`` / ``tau down`` / ``tau scale`` / ``tau stack``: the embedded stack (private nats-server + every
service as its own process, replica counts changeable while it runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from taugrid.cli.common import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, data_dir, emit_json, fail, output_option
from taugrid.cli.portal_cmd import DEFAULT_TTL_S, sign_in_url, stack_portal
from taugrid.cli.stackstate import read_state, running
from taugrid.core.errors import PermanentError
from taugrid.local import runas
from taugrid.local.pods import pid_alive
from taugrid.stack import LAST_STATE, auth, operator, scaling
from taugrid.stack.natsserver import SECRET_ENV_PREFIX, layout_problem, without_secrets


def _parse_scale(items: tuple[str, ...]) -> dict[str, int]:
    try:
        return scaling.parse_scale(items)
    except scaling.ScaleError as err:
        fail(f"--scale {err}", EXIT_USAGE)
        raise AssertionError from err


@click.command(
    help="Start the embedded stack in the background: nats-server and every service as a process. "
    "On a running stack, --scale changes replica counts live (like `tau scale`)."
)
@click.option(
    "--scale", multiple=True, help="SERVICE=N replicas, e.g. --scale renderer=3 (repeatable)."
)
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the stack to be ready.")
@click.option("--ha", is_flag=True, help="Run the bus as a 3-server JetStream cluster (every stream on all three, "
              "so any one server may die). A data dir keeps the kind it was made with.")
@click.option("--break-glass-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the break-glass key the first time (default: this stack's folder under "
              "~/.config/taugrid, never the data dir). Keep it offline.")
@click.option("--platform", "platform_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="The platform.yaml a new data dir starts with (instead of one derived from this "
              "machine). One that names clusters starts a hub, a leaf server and a local cluster per cluster, and "
              "the dispatcher (docs §13d).")
@output_option
def up(scale: tuple[str, ...], timeout: float, ha: bool, break_glass_file: Path | None, platform_file: Path | None,
       output: str) -> None:
    wanted = _parse_scale(scale)  # refuse a typo before anything starts
    d = data_dir()
    d.mkdir(parents=True, exist_ok=True)
    state = running(d)
    if state and ha and not state.get("ha"):
        fail(f"the stack in {d} is running with a single nats-server; --ha needs a new data dir "
             "(TAU_DATA_DIR=… tau up --ha)", EXIT_USAGE)
    problem = layout_problem(d / "nats", ha=ha)
    if problem and not state:
        fail(problem, EXIT_USAGE)
    if state and platform_file is not None:
        fail(f"the stack in {d} is running: --platform only seeds a new data dir; use `tau platform apply "
             f"{platform_file}` (then `tau down` and `tau up` if it changes clusters)", EXIT_USAGE)
    if state and wanted:
        _report(_apply_scale(d, wanted, timeout), output, "rescaled")
        return
    if state:
        _report(state, output, "already running")
        return
    if (d / "stack.json").exists():  # kept for the new stack to listen where this one did (supervisor.last_ports)
        (d / "stack.json").replace(d / LAST_STATE)
    env = {**without_secrets(os.environ), runas.ENV: _run_as(d)}
    _operator_keys(d, break_glass_file)
    cmd = [sys.executable, "-m", "taugrid.stack.supervisor", "--data-dir", str(d)] + (["--ha"] if ha else [])
    if platform_file is not None:
        cmd += ["--platform", str(platform_file.resolve())]
    for s in scale:
        cmd += ["--scale", s]
    log = open(d / "supervisor.log", "ab")  # noqa: SIM115 - owned by the child
    if any(k.startswith(SECRET_ENV_PREFIX) for k in os.environ):
        click.echo(f"warning: {SECRET_ENV_PREFIX}* variables are not passed to the stack nor to runs (every "
                   f"process would inherit them): put each secret in {d / 'secrets'}/<workspace>.yaml "
                   "(mode 0600) as `secret-name: {key: value}`", err=True)
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
    )
    deadline = time.time() + timeout
    shown = False
    while time.time() < deadline:
        state = read_state(d)
        if state and state.get("phase") == "ready":
            _report(_wait_for_services(d, state, deadline, output), output, "up")
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


def _run_as(d: Path) -> str:
    """Which OS user the stack's runs will run as (``runas.decide``); said once, here, when it is the stack's own
    (a run can then read everything the stack can). Refuses TAU_RUN_AS=workspace where it cannot be had."""
    decision = runas.decide(d.absolute())
    if decision.refused:
        fail(decision.refused, EXIT_USAGE)
    if decision.mode == runas.STACK:
        click.echo(f"warning: runs will run as this stack's own OS user ({decision.why}), so a run can read the "
                   f"platform's keys in {d / 'creds'}, every workspace's secrets and outputs and other runs' "
                   "environments. Start the stack as root, with a data dir and an interpreter every user can "
                   "reach, to run each workspace as its own OS user (TAU_RUN_AS=workspace insists on it).", err=True)
    elif decision.note:
        click.echo(f"note: {decision.note}", err=True)
    return decision.mode


def _operator_keys(d: Path, break_glass_file: Path | None) -> None:
    """The break-glass key written outside the data dir (once), and the anchor key pinned in the operator's
    own folder (``stack.operator``), each said when it happens."""
    try:
        glass = operator.issue_break_glass(d, path=break_glass_file)
    except (OSError, PermanentError) as exc:
        fail(f"cannot write the break-glass key: {exc}", EXIT_FAILED)
        raise AssertionError from exc  # fail() exits
    if glass.news:
        click.echo(glass.news, err=True)
    key = auth.ensure_key(d / "creds" / "anchor.nk", "anchor").public_key
    pin, before = operator.pin_anchor_key(d, key)
    if before is None:
        click.echo(f"audit anchors are signed by {key}, pinned in {pin}: `tau verify --anchor` refuses any other "
                   "signer", err=True)
    elif before != key:
        click.echo(f"warning: the stack signs its audit anchors with {key}, but {pin} pins {before}: `tau verify "
                   f"--anchor` refuses the new anchors. If you replaced {d / 'creds' / 'anchor.nk'} yourself, "
                   f"remove {pin} and run `tau up` again to pin the new key.", err=True)


def _starting(d: Path, state: dict[str, object]) -> list[str]:
    """The service replicas that have not said they are consuming yet (their pid in their ready file,
    ``supervisor.ready_file``): until then a submission waits on the bus for them."""
    waiting = []
    for svc in state.get("services") or []:  # type: ignore[attr-defined]
        try:
            said = scaling.ready_file(d, svc["service"], svc["replica"]).read_text().strip() == str(svc["pid"])
        except OSError:
            said = False
        if not said:
            waiting.append(f"{svc['service']}-{svc['replica']}")
    return waiting


def _wait_for_services(d: Path, state: dict[str, object], deadline: float, output: str) -> dict[str, object]:
    """Wait (until ``deadline``) for every service to have bound its consumers; say which are still starting
    if some are not by then (the stack works, but runs wait for them)."""
    said = False
    while (waiting := _starting(d, state)) and time.time() < deadline:
        if not said and output != "json":
            click.echo(f"waiting for the services to connect: {', '.join(waiting)} …", err=True)
            said = True
        time.sleep(0.5)
        state = read_state(d) or state
    if waiting and output != "json":
        click.echo(f"warning: still starting: {', '.join(waiting)} (what they handle waits on the bus until "
                   f"they connect; see {d / 'logs'})", err=True)
    return state


def _apply_scale(d: Path, wanted: dict[str, int], timeout: float) -> dict[str, object]:
    """Write the request to the control file and wait until the supervisor reports it applied and every
    wanted replica has a live process."""
    request = scaling.write_request(d, wanted)
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = read_state(d)
        if state and int(state.get("scale_request") or 0) >= request and _settled(state, wanted):
            return state
        if state is None or not pid_alive(state.get("pid")):
            fail(f"the stack stopped while scaling; see {d / 'supervisor.log'}", EXIT_FAILED)
        time.sleep(0.2)
    fail(f"the stack did not apply the new replica counts within {timeout:.0f}s; see {d / 'supervisor.log'}",
         EXIT_FAILED)
    raise AssertionError


def _settled(state: dict[str, object], wanted: dict[str, int]) -> bool:
    """Every wanted replica runs and no surplus one of those services is still draining."""
    services = state.get("services") or []
    retiring = state.get("retiring") or []
    assert isinstance(services, list) and isinstance(retiring, list)
    if any(r["service"] in wanted for r in retiring):
        return False
    for svc, n in wanted.items():
        live = [s for s in services if s["service"] == svc and s["pid"]]
        if len(live) != n:
            return False
    return True


def _report(state: dict[str, object], output: str, what: str, *, token: bool | None = None) -> None:
    """``token``: print a fresh portal sign-in link (a credential): asked for, or by default only when the
    stack has just come up."""
    if token is None:
        token = what == "up"
    link = _portal_link(state) if token else None
    if output == "json":
        emit_json({**state, "portal_sign_in_url": link} if link else state)
        return
    bus = " (3-server JetStream cluster)" if state.get("ha") else ""
    click.echo(f"taugrid stack {what}: {state['nats_url']}{bus} (data in {state['data_dir']})")
    run_as = state.get("run_as")
    if isinstance(run_as, dict):
        click.echo("runs run as " + ("each workspace's own OS user (tau-ws-<workspace>)"
                                     if run_as.get("mode") == runas.WORKSPACE
                                     else f"the stack's own OS user ({run_as.get('why')})"))
    click.echo(replica_table(state))
    if link:
        click.echo(f"web portal: {link}")
        click.echo("  (a sign-in link for you, valid 12h; `tau portal` prints a new one)")
    elif (portal := stack_portal(state)) is not None:
        click.echo(f"web portal: {portal[0]} (sign in with the link `tau portal` prints)")


def _portal_link(state: dict[str, object]) -> str | None:
    """A sign-in link to the stack's portal for the person who started it (signed with their key)."""
    from taugrid.bus.identity import load_user_seed

    found = stack_portal(state)
    seed = load_user_seed() if found else None
    if found is None or seed is None:
        return None
    return sign_in_url(found[0], delegate=found[1], seed=seed, ttl_s=DEFAULT_TTL_S)


def replica_table(state: dict[str, object]) -> str:
    """One line per service: replica count, pids, restarts."""
    services = state.get("services") or []
    assert isinstance(services, list)
    lines = [f"  {'SERVICE':<18} {'REPLICAS':>8}  {'RESTARTS':>8}  PIDS"]
    for svc in scaling.SERVICES:
        procs = sorted((s for s in services if s["service"] == svc), key=lambda s: s["replica"])
        if not procs:
            continue
        pids = ", ".join(str(s["pid"]) if s["pid"] else "(restarting)" for s in procs)
        restarts = sum(int(s.get("restarts") or 0) for s in procs)
        lines.append(f"  {svc:<18} {len(procs):>8}  {restarts:>8}  {pids}")
    return "\n".join(lines)


@click.command(
    help="Change replica counts of a running stack's services live, e.g. `tau scale renderer=2 policy=2`. "
    f"Services: {', '.join(scaling.SERVICES)}; {' and '.join(sorted(scaling.SINGLETONS))} run once."
)
@click.argument("replicas", nargs=-1, required=True, metavar="SERVICE=N...")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the new replicas.")
@output_option
def scale(replicas: tuple[str, ...], timeout: float, output: str) -> None:
    try:
        wanted = scaling.parse_scale(replicas)
    except scaling.ScaleError as err:
        fail(str(err), EXIT_USAGE)
        return
    d = data_dir()
    if running(d) is None:
        fail(f"the stack is not running (data dir {d}): start it with `tau up --scale "
             + " ".join(replicas) + "`", EXIT_UNAVAILABLE)
    _report(_apply_scale(d, wanted, timeout), output, "rescaled")


@click.command("stack", help="Show the embedded stack: NATS URL, data dir, and replicas per service with pids.")
@click.option("--token", is_flag=True, help="Also print a fresh portal sign-in link (a credential, valid 12h; "
              "as `tau portal` does).")
@output_option
def stack_status(token: bool, output: str) -> None:
    show_stack(output, token=token)


def show_stack(output: str, *, token: bool = False) -> None:
    """The running stack's URL, data dir and replicas (also `tau status --stack`)."""
    d = data_dir()
    state = running(d)
    if state is None:
        fail(f"the stack is not running (data dir {d}): start it with `tau up`", EXIT_UNAVAILABLE)
        return
    _report(state, output, "running", token=token)


@click.command(help="Stop the embedded stack: services drain, then nats-server stops.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the stack to stop.")
def down(timeout: float) -> None:
    d = data_dir()
    state = read_state(d)
    if not state or not pid_alive(state.get("pid")):
        click.echo("the stack is not running")
        return
    os.kill(int(state["pid"]), signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline and pid_alive(state.get("pid")):
        time.sleep(0.2)
    if pid_alive(state.get("pid")):
        fail("the stack did not stop in time", EXIT_FAILED)
    click.echo("taugrid stack stopped")
