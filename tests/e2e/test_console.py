"""A researcher's first hour, through the real CLI: the run's console, its summary, read commands and exits."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.e2e.conftest import TAU, Stack, write_project

CRASH = 'print("hello from the script", flush=True)\nraise ValueError("learning rate must be positive")\n'


def test_follow_shows_the_scripts_output_and_a_failure_summary(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "crash", CRASH,
                        "name: crash\nentrypoint: main.py\ncompute: {gpus: 0}\nresilience: {max_retries: 1}\n")
    proc = stack.tau("run", "--follow", cwd=cfg.parent, timeout=180)  # no argument: the tau.yaml here
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    run_id = lines[0]
    assert "hello from the script" in lines  # the script's own line, as it printed it
    # the failure's last line comes before the event that says the pod failed, which the gave_up and seal follow
    failed_at = next(i for i, x in enumerate(lines) if " exec.failed " in x)
    assert lines.index("ValueError: learning rate must be positive") < failed_at
    # each an event's line (``[time] type ...``); any other line there fails with the whole console shown
    assert [x.split("] ", 1)[1].split()[0] if "] " in x else x for x in lines[failed_at:failed_at + 3]] == [
        "exec.failed", "recovery.gave_up", "evidence.sealed"], proc.stdout
    summary = lines[next(i for i, x in enumerate(lines) if x.startswith("last ")):]
    assert summary[0].endswith(f"line(s) of output (all of it: `tau logs {run_id}`):")
    assert "  ValueError: learning rate must be positive" in summary
    assert "  reason: Error: not in resilience.retry_on (Preempted, Evicted)" in summary
    assert "      tip: add Error to resilience.retry_on to retry crashes" in summary
    assert proc.stderr == (
        "warning: resilience.max_retries is 1 but resilience.retry_on (Preempted, Evicted) does not cover Error, "
        "so a crash is not retried: add Error to resilience.retry_on to retry crashes\n")
    status = stack.json("status", run_id)
    assert (status["state"], status["cluster_queue"], status["message"], status["hint"]) == (
        "failed", "local", "", "add Error to resilience.retry_on to retry crashes")
    followed = stack.tau("logs", run_id, "-f", timeout=120)  # ends by itself: the run has finished
    assert (followed.returncode, followed.stderr) == (0, "")
    assert followed.stdout.splitlines()[0] == "hello from the script"
    assert followed.stdout.splitlines()[-1] == "ValueError: learning rate must be positive"


def test_logs_separate_attempts(stack: Stack, tmp_path: Path) -> None:
    script = "import os\nprint('try', os.environ['TAU_RETRY_ATTEMPT'])\nraise SystemExit(2)\n"
    cfg = write_project(tmp_path, "twice", script,
                        "name: twice\nentrypoint: main.py\ncompute: {gpus: 0}\n"
                        "resilience: {max_retries: 1, retry_on: [Error], backoff_initial: 200ms}\n")
    proc = stack.tau("run", str(cfg.parent), "--follow", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0]
    assert "── attempt 2 (retry after Error, backoff 0.2s) ──" in proc.stdout.splitlines()
    assert any(x.endswith("recovery.retrying    attempt 2 after Error; backoff: it starts in 0.2s")
               for x in proc.stdout.splitlines())
    logs = stack.tau("logs", run_id, check=True).stdout.splitlines()
    assert logs == ["try 1", "── attempt 2 ──", "try 2"]


def test_read_commands_order_filter_and_explain(stack: Stack, tmp_path: Path) -> None:
    ok = write_project(tmp_path, "ok", "print('fine')\n", "name: ok\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    first = stack.tau("run", str(ok.parent), "--follow", timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    bad = write_project(tmp_path, "nows", "print('hi')\n",
                        "name: nows\nentrypoint: main.py\npolicy: {workspace: nowhere}\n")
    second = stack.tau("run", str(bad.parent), "--follow", timeout=180)
    assert second.returncode == 5
    ok_id, bad_id = first.stdout.splitlines()[0], second.stdout.splitlines()[0]

    everything = stack.json("list", "--limit", "0")
    assert everything["next"] is None
    listed = everything["runs"]
    assert [r["run_id"] for r in listed][:2] == [bad_id, ok_id]  # newest first
    created = [r["created"] for r in listed]
    assert created == sorted(created, reverse=True)
    assert listed[0]["why"] == "policy.workspace: unknown workspace 'nowhere'; known workspaces: default"
    first_page = stack.json("list", "--limit", "1")
    assert [r["run_id"] for r in first_page["runs"]] == [bad_id]
    second_page = stack.json("list", "--limit", "1", "--cursor", first_page["next"])
    assert [r["run_id"] for r in second_page["runs"]] == [ok_id]  # the page after the first, by its cursor
    assert {r["state"] for r in stack.json("list", "--state", "rejected", "--limit", "0")["runs"]} == {"rejected"}
    assert stack.json("list", "--user", "nobody-at-all") == {"runs": [], "next": None}
    bad_cursor = stack.tau("list", "--cursor", "nonsense!")
    assert bad_cursor.returncode == 2 and bad_cursor.stderr.splitlines()[-1] == (
        "Error: Invalid value for --cursor: value 'nonsense!' is not a cursor of a runs list: pass the `next` "
        "value of the previous page unchanged")
    assert stack.tau("list", "--limit", "-1").returncode == 2
    table = stack.tau("list", "--limit", "2", check=True).stdout.splitlines()
    assert table[0].split() == ["RUN", "WORKSPACE", "USER", "STATE", "ATTEMPT", "AGE", "DURATION", "REASON"]
    assert table[1].startswith(bad_id) and "rejected" in table[1] and "policy.workspace" in table[1]

    missing = stack.tau("evidence", "nosuchrun")
    assert (missing.returncode, missing.stderr) == (3, "error: run nosuchrun not found (see `tau list`)\n")
    for command in (["status", "nosuchrun"], ["logs", "nosuchrun"], ["cancel", "nosuchrun"],
                    ["events", "--run", "nosuchrun"], ["verify", "nosuchrun"]):
        assert stack.tau(*command).returncode == 3, command

    validated = stack.tau("run", "validate", str(ok.parent), check=True).stdout
    assert validated.startswith(f"{ok} (job run 'ok'): valid against platform revision ")


def test_cancel_twice_interrupted_logs_and_a_closed_pipe_exit_cleanly(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "sleeper", "import time\nprint('up', flush=True)\ntime.sleep(600)\n",
                        "name: sleeper\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg.parent), check=True).stdout.strip()
    stack.wait_state(run_id, {"running"}, timeout=120)
    # SIGINT as at a terminal: a test run started in the background of a non-interactive shell (`cmd &`)
    # inherits SIGINT ignored, and Python then never installs its handler, so the follower would not hear it
    follower = subprocess.Popen([*TAU, "logs", run_id, "-f"], env=stack.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert follower.stdout is not None
    assert follower.stdout.readline() == "up\n"  # it is connected and following
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=60)
    assert (follower.returncode, err) == (130, "")

    stack.tau("cancel", run_id, check=True)
    stack.wait_state(run_id, {"cancelled"}, timeout=60)
    again = stack.tau("cancel", run_id, check=True)
    assert again.stdout == f"{run_id}: already cancelled\n"
    row = next(r for r in stack.json("list", "--limit", "0")["runs"] if r["run_id"] == run_id)
    assert row["why"].startswith("cancelled by ")

    piped = subprocess.run(" ".join([*TAU, "events"]) + " | head -1", shell=True, env=stack.env,
                           capture_output=True, text=True, timeout=120)
    assert piped.stderr == "" and len(piped.stdout.splitlines()) == 1


def test_an_unreachable_stack_is_one_line_and_exit_4(stack: Stack) -> None:
    proc = subprocess.run([*TAU, "list"], env={**stack.env, "TAU_NATS_URL": "nats://127.0.0.1:9"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4
    assert proc.stderr == ("error: cannot reach the taugrid stack at nats://127.0.0.1:9 (is the stack up? "
                           "start it with `tau up`, or set TAU_NATS_URL)\n")
