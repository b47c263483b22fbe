"""Replica requests: names and counts are checked before anything starts or is written, with exact errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from taugrid.stack import scaling

TAU = [sys.executable, "-m", "taugrid.cli.main"]
SERVICES = ", ".join(scaling.SERVICES)


def tau(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TAU_DATA_DIR": str(data_dir)}
    env.pop("TAU_NATS_URL", None)
    return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("rendrer=2", f"'rendrer=2': unknown service 'rendrer' (did you mean renderer?); services are {SERVICES}"),
        ("nosuch=2", f"'nosuch=2': unknown service 'nosuch'; services are {SERVICES}"),
        ("renderer", "'renderer': expected SERVICE=N with N a whole number, e.g. renderer=2"),
        ("renderer=two", "'renderer=two': expected SERVICE=N with N a whole number, e.g. renderer=2"),
        ("renderer=0", "'renderer=0': at least 1 replica (with none, runs would stop at this stage); "
                       "`tau down` stops the stack"),
        ("renderer=33", "'renderer=33': at most 32 replicas of a service on one machine"),
        ("local-cluster=2", "'local-cluster=2': local_cluster runs exactly once per machine: "
                            "it owns this machine's pods and GPUs"),
        ("node_agent=3", "'node_agent=3': node_agent runs exactly once per machine: it samples this machine's GPUs"),
    ],
)
def test_bad_replica_requests_name_the_problem(item: str, message: str) -> None:
    with pytest.raises(scaling.ScaleError) as err:
        scaling.parse_scale([item])
    assert str(err.value) == message


def test_good_replica_requests() -> None:
    assert scaling.parse_scale(["renderer=3", "admission-watcher=2", "node_agent=1"]) == {
        "renderer": 3, "admission_watcher": 2, "node_agent": 1,
    }


def test_up_with_a_typo_on_a_stopped_stack_exits_2_naming_the_valid_services(tmp_path: Path) -> None:
    proc = tau("up", "--scale", "rendrer=2", data_dir=tmp_path / "tau")
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: --scale 'rendrer=2': unknown service 'rendrer' (did you mean renderer?); services are {SERVICES}\n"
    )
    assert not (tmp_path / "tau" / "stack.json").exists()  # nothing was started


def test_scale_and_stack_on_a_stopped_stack_say_how_to_start_it(tmp_path: Path) -> None:
    d = tmp_path / "tau"
    proc = tau("scale", "renderer=2", data_dir=d)
    assert (proc.returncode, proc.stderr) == (
        4, f"error: the stack is not running (data dir {d}): start it with `tau up --scale renderer=2`\n"
    )
    proc = tau("scale", "rendrer=2", data_dir=d)
    assert proc.returncode == 2 and "unknown service 'rendrer' (did you mean renderer?)" in proc.stderr
    proc = tau("stack", data_dir=d)
    assert (proc.returncode, proc.stderr) == (
        4, f"error: the stack is not running (data dir {d}): start it with `tau up`\n"
    )


def test_control_file_round_trip_and_bad_entries(tmp_path: Path) -> None:
    request = scaling.write_request(tmp_path, {"renderer": 2})
    assert scaling.read_request(scaling.control_path(tmp_path)) == (request, {"renderer": 2}, [])
    scaling.control_path(tmp_path).write_text('{"request": 7, "replicas": {"renderer": 3, "node_agent": 2}}')
    assert scaling.read_request(scaling.control_path(tmp_path)) == (
        7, {"renderer": 3}, ["'node_agent=2': node_agent runs exactly once per machine: it samples this machine's GPUs"]
    )
    scaling.control_path(tmp_path).write_text("not json")
    assert scaling.read_request(scaling.control_path(tmp_path)) == (0, {}, [])


@pytest.mark.parametrize("command", [["scale"], ["stack"], ["up"], ["outputs"]])
def test_stack_and_outputs_commands_have_help(command: list[str]) -> None:
    proc = subprocess.run([*TAU, *command, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage:" in proc.stdout


def test_tau_stack_prints_a_sign_in_link_only_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23 item 6: a sign-in link is a credential: `tau stack` names the portal and how to sign in;
    `tau stack --token` (or `tau portal`) prints a fresh link, and `tau up` once, as the stack comes up."""
    from taugrid.cli import stack

    monkeypatch.setattr(stack, "_portal_link", lambda state: "http://127.0.0.1:8080/login?token=SECRET")
    state: dict[str, object] = {"nats_url": "nats://127.0.0.1:4222", "data_dir": "/d", "services": [],
                                "portal": {"url": "http://127.0.0.1:8080", "key": "UKEY"}}
    stack._report(state, "text", "running")
    shown = capsys.readouterr().out
    assert "SECRET" not in shown
    assert "web portal: http://127.0.0.1:8080 (sign in with the link `tau portal` prints)" in shown
    stack._report(state, "json", "running")
    assert "SECRET" not in capsys.readouterr().out
    stack._report(state, "text", "running", token=True)
    assert "web portal: http://127.0.0.1:8080/login?token=SECRET" in capsys.readouterr().out
    stack._report(state, "text", "up")
    assert "token=SECRET" in capsys.readouterr().out
