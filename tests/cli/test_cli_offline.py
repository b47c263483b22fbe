"""CLI commands that need no running stack, and clean failures when the stack is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TAU = [sys.executable, "-m", "taugrid.cli.main"]


def tau(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command", [[], ["run"], ["run", "submit"], ["run", "validate"], ["run", "schema"],
                                     ["run", "resume"],
                                     ["status"], ["logs"], ["list"], ["cancel"], ["events"], ["queue"],
                                     ["evidence"], ["verify"], ["up"], ["down"], ["platform", "apply"],
                                     ["platform", "render"], ["platform", "show"],
                                     ["completion"], ["login"], ["whoami"], ["admin"], ["admin", "user"],
                                     ["admin", "user", "add"], ["admin", "user", "remove"], ["admin", "user", "list"]])
def test_every_command_has_help(command: list[str]) -> None:
    proc = tau(*command, "--help")
    assert proc.returncode == 0 and "Usage:" in proc.stdout


OFFLINE = {"TAU_NATS_URL": "nats://127.0.0.1:1"}


def test_validate_and_schema() -> None:
    ok = tau("run", "validate", "examples/quickstart/tau.yaml", "--offline", "--output", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == {
        "valid": True, "name": "quickstart", "engine": "job", "platform_revision": None,
        "platform": "machine-default", "warnings": [], "managed": False, "warning_issues": []}
    schema = json.loads(tau("run", "schema").stdout)
    assert schema["additionalProperties"] is False and "resilience" in schema["properties"]


def test_invalid_config_exits_2_with_every_issue_as_json(tmp_path: Path) -> None:
    bad = tmp_path / "tau.yaml"
    bad.write_text("name: x\nentrypoint: a.py\nresilience:\n  max_retrys: 2\n")
    proc = tau("run", "validate", str(bad), "--output", "json")
    assert proc.returncode == 2
    issue = json.loads(proc.stdout)["issues"][0]
    assert issue["field"] == "resilience.max_retrys" and issue["line"] == 4 and "max_retries" in issue["message"]


def test_platform_render_emits_valid_kueue_objects() -> None:
    proc = tau("platform", "render", "deploy/platform.yaml")
    assert proc.returncode == 0, proc.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout)]
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"} <= set(kinds)


def test_commands_fail_clearly_when_the_stack_is_down(tmp_path: Path) -> None:
    proc = tau("status", "nope", env={"TAU_NATS_URL": "nats://127.0.0.1:1", "TAU_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 4 and "tau up" in proc.stderr


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # `tau` loads its commands lazily: ask the group, not its dict
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        found.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            found += _all_commands(cmd, (*prefix, name))
    return found


def test_every_option_of_every_command_has_help_text() -> None:
    from taugrid.cli.main import cli

    missing = [f"tau {' '.join(path)} {'/'.join(p.opts)}" for path, cmd in _all_commands(cli)
               for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert missing == []


def test_run_help_shows_the_submit_options() -> None:
    out = tau("run", "--help").stdout
    assert "--follow" in out and "--dry-run" in out and "--workspace" in out
    assert "Usage: tau run [OPTIONS] [TARGET] | COMMAND [ARGS]..." in out


def test_completion_prints_clicks_script_for_each_shell() -> None:
    bash, zsh, fish = (tau("completion", shell) for shell in ("bash", "zsh", "fish"))
    assert bash.returncode == zsh.returncode == fish.returncode == 0
    assert "_TAU_COMPLETE=bash_complete" in bash.stdout and "complete -o nosort -F _tau_completion tau" in bash.stdout
    assert "#compdef tau" in zsh.stdout and "_TAU_COMPLETE=zsh_complete" in zsh.stdout
    assert "complete --no-files --command tau" in fish.stdout
    assert tau("completion", "powershell").returncode == 2


def test_run_of_a_python_file_suggests_the_project_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: train.py\n")
    proc = subprocess.run([*TAU, "run", "train.py"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, **OFFLINE})
    assert proc.returncode == 2
    assert proc.stderr == "error: tau run takes a project folder or a tau.yaml: try `tau run .`\n"


def test_missing_entrypoint_is_named_with_its_line_and_the_nearest_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "tau.yaml").write_text("name: t\ncompute: {gpus: 0}\nentrypoint: trian.py\n")
    proc = tau("run", "validate", str(tmp_path), "--offline", "--output", "json")
    assert proc.returncode == 2
    [issue] = json.loads(proc.stdout)["issues"]
    assert issue["field"] == "entrypoint" and issue["line"] == 3 and issue["fix"] == "did you mean 'train.py'?"
    human = tau("run", "validate", str(tmp_path), "--offline")
    assert human.returncode == 2
    assert human.stderr.startswith(f"error: {tmp_path / 'tau.yaml'}:3: entrypoint: 'trian.py' does not exist")
    # submitting checks the same thing before it needs the stack
    submit = tau("run", str(tmp_path), env=OFFLINE)
    assert submit.returncode == 2 and "did you mean 'train.py'?" in submit.stderr


def test_validate_says_when_the_platform_was_not_checked(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: main.py\nresilience: {max_retries: 1}\n")
    proc = tau("run", "validate", str(tmp_path), env=OFFLINE)
    assert proc.returncode == 0
    assert proc.stdout == (f"{tmp_path / 'tau.yaml'} (job run 't'): valid against this machine's default platform, "
                           "the one `tau up` creates (no stack answered)\n")
    assert proc.stderr == (
        "warning: resilience.max_retries is 1 but resilience.retry_on (Preempted, Evicted) does not cover Error, "
        "so a crash is not retried: add Error to resilience.retry_on to retry crashes\n")


def test_offline_validate_refuses_what_this_machine_cannot_run_and_says_which_platform(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: main.py\ncompute: {gpus: 2}\n")
    machine = {**OFFLINE, "TAU_DECLARED_GPUS": "1x80000", "TAU_DATA_DIR": str(tmp_path / "data")}
    proc = tau("run", "validate", str(tmp_path), env=machine)
    assert proc.returncode == 2
    assert proc.stderr.endswith("(checked against this machine's default platform, the one `tau up` creates "
                                "(no stack answered))\n")
    assert "can never hold more than 1, so the run would never start" in proc.stderr
    as_json = tau("run", "validate", str(tmp_path), "--offline", "-o", "json", env=machine)
    assert as_json.returncode == 2
    issues = json.loads(as_json.stdout)["issues"]
    assert {(i["field"], i["platform"]) for i in issues} == {("compute.gpus", "machine-default")}
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: main.py\ncompute: {gpus: 1}\n")
    fits = tau("run", "validate", str(tmp_path), "--offline", env=machine)
    assert fits.returncode == 0 and fits.stdout.endswith(
        "valid against this machine's default platform, the one `tau up` creates (--offline)\n")


def test_unreachable_stack_is_one_line_and_exit_4(tmp_path: Path) -> None:
    # All six at once: each spends its few seconds on connection attempts, which need no CPU.
    commands = (["list"], ["status", "x"], ["events"], ["logs", "x"], ["evidence", "x"], ["cancel", "x"])
    env = {**os.environ, **OFFLINE, "TAU_DATA_DIR": str(tmp_path)}
    procs = [subprocess.Popen([*TAU, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env=env) for command in commands]
    for command, proc in zip(commands, procs, strict=True):
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 4, command
        assert stderr == ("error: cannot reach the taugrid stack at nats://127.0.0.1:1 (is the stack up? "
                          "start it with `tau up`, or set TAU_NATS_URL)\n"), command


def test_dry_run_works_with_no_stack_against_this_machine_or_a_given_platform(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("print('hi')\n")
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: main.py\n")
    machine = {**OFFLINE, "TAU_DATA_DIR": str(tmp_path / "data")}
    proc = tau("run", str(tmp_path), "--dry-run", env=machine)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("note: dry-run against this machine's default platform, the one `tau up` creates "
                           "(no stack answered)\n")
    [job] = list(yaml.safe_load_all(proc.stdout))
    assert (job["kind"], job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]) == ("Job", "default")
    platform = tmp_path / "platform.yaml"
    platform.write_text(REPO.joinpath("deploy", "platform.yaml").read_text())
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: main.py\npolicy: {workspace: vision}\n"
                                       "runtime: {image: 'nvcr.io/nvidia/pytorch:24.05-py3'}\n")
    given = tau("run", str(tmp_path), "--dry-run", "--platform", str(platform), env=machine)
    assert given.returncode == 0 and given.stderr == "", given.stderr
    assert list(yaml.safe_load_all(given.stdout))[0]["kind"] == "Job"
    refused = tau("run", str(tmp_path), "--platform", str(platform), env=machine)
    assert (refused.returncode, refused.stderr) == (
        2, "error: --platform is for --dry-run (a submission is always checked against the stack's platform)\n")
