"""End to end through the CLI against the embedded stack: every stage, real processes, real bus."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.e2e.conftest import Stack, write_project

REPO = Path(__file__).resolve().parents[2]
STAGES = ["submit.requested", "submit.accepted", "policy.approved", "render.applied", "admission.admitted",
          "exec.running", "exec.succeeded", "evidence.sealed"]


def test_quickstart_succeeds_with_every_stage_in_order_and_one_trace(stack: Stack) -> None:
    proc = stack.tau("run", str(REPO / "examples" / "quickstart"), "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    status = stack.json("status", run_id)
    assert status["state"] == "succeeded" and status["attempt"] == 1
    assert [(p["name"], p["status"]) for p in status["phases"]] == [
        ("submitted", "done"), ("policy", "done"), ("rendered", "done"), ("admission", "done"),
        ("raycluster", "skipped"), ("scheduling", "done"), ("image-pull", "done"), ("init", "done"),
        ("container-start", "done"), ("running", "done"), ("finished", "done")]
    assert [(p["phase"], [(c["kind"], c["name"], c["state"], c["exit_code"]) for c in p["containers"]])
            for p in status["pods"]] == [  # the source fetch init container, then the run's own
        ("Succeeded", [("init", "tau-source-fetch", "terminated", 0), ("app", "main", "terminated", 0)])]
    events = stack.wait_sealed(run_id)
    types = [e["short_type"] for e in events]
    assert [t for t in types if t in STAGES] == STAGES
    assert {"id", "type", "source", "subject", "time", "traceparent", "data"} <= set(events[0])
    # every event has its time and its whole id, those stored without either (a service's run event stamped by
    # the store, under its id's short key: issue 27) as well
    assert all(len(e["time"]) == 24 and e["id"].startswith(f"{run_id}.{e['attempt']}.{e['short_type']}")
               for e in events), [(e["id"], e["time"]) for e in events]
    trace_ids = {e["traceparent"].split("-")[1] for e in events}
    assert len(trace_ids) == 1, trace_ids
    sources = {e["source"] for e in events}
    assert {"/svc/client", "/svc/submitter", "/svc/policy", "/svc/renderer", "/svc/admission-watcher",
            "/svc/evidence"} <= sources
    sealed = events[-1]["data"]
    assert sealed["terminal_state"] == "succeeded" and len(sealed["digest"]) == 64
    logs = stack.tau("logs", run_id, check=True).stdout
    assert "final test accuracy" in logs
    verify = stack.json("verify", run_id)
    assert verify["ok"] is True, verify
    bundle = stack.json("evidence", run_id)
    assert bundle["terminal"]["state"] == "succeeded" and "train.py" in bundle["config"]["text"]
    human = stack.tau("evidence", run_id, check=True).stdout
    assert "succeeded" in human and "attempt 1: exec.succeeded exit=0" in human
    assert [(e["id"], e["time"]) for e in bundle["events"]] == [(e["id"], e["time"]) for e in events
                                                                 if e["seq"] <= bundle["terminal"]["seq"]]
    accounting = bundle["accounting"]  # sealed with the run, recomputed by verify from the bundled events
    assert accounting["running_s"] > 0 and accounting["clock"] == "ce-time" and verify["accounting"] == accounting
    assert "  accounting  queued " in human


def test_failing_script_is_retried_per_resilience_then_gives_up(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "flaky", (
        "import os, sys\n"
        "print('attempt', os.environ['TAU_RETRY_ATTEMPT'], 'of', os.environ['TAU_RETRY_MAX'],"
        " 'reason', os.environ.get('TAU_RETRY_REASON', '-'), 'resume', os.environ.get('TAU_RESUME_FROM', '-'))\n"
        "sys.exit(3)\n"
    ), "name: flaky\nentrypoint: main.py\ncompute: {gpus: 0}\n"
       "resilience: {max_retries: 2, retry_on: [Error], backoff_initial: 200ms, backoff_max: 1s}\n")
    proc = stack.tau("run", str(cfg), "--follow", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    status = stack.json("status", run_id)
    assert status["state"] == "failed" and status["attempt"] == 3
    assert "no retries left" in status["reason"]
    types = [e["short_type"] for e in stack.wait_sealed(run_id)]
    assert types.count("exec.failed") == 3
    assert types.count("recovery.retrying") == 2
    assert types.count("recovery.gave_up") == 1 and types[-1] == "evidence.sealed"
    logs = stack.tau("logs", run_id, check=True).stdout
    assert "attempt 1 of 2 reason -" in logs
    assert "attempt 3 of 2 reason Error resume" in logs


def test_cancel_stops_the_process(stack: Stack, tmp_path: Path, exchange: Path) -> None:
    marker = exchange / "pid"
    cfg = write_project(tmp_path, "sleeper", (
        "import os, time\n"
        f"open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "print('sleeping', flush=True)\n"
        "time.sleep(600)\n"
    ), "name: sleeper\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    run_id = stack.tau("run", str(cfg), check=True).stdout.strip()
    stack.wait_state(run_id, {"running"})
    for _ in range(50):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.1)
    pid = int(marker.read_text())
    os.kill(pid, 0)  # alive
    stack.tau("cancel", run_id, check=True)
    status = stack.wait_state(run_id, {"cancelled"}, timeout=60)
    assert status["state"] == "cancelled"
    gone = False
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            gone = True
            break
        time.sleep(0.1)
    assert gone, "the workload process survived cancel"
    types = [e["short_type"] for e in stack.wait_sealed(run_id)]
    assert "cancel.requested" in types and "exec.cancelled" in types


def test_bad_input_gets_clear_errors_and_no_service_dies(stack: Stack, tmp_path: Path) -> None:
    before = {(s["service"], s["replica"]): s["pid"] for s in stack.state()["services"]}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tau.yaml").write_text("name: bad\nentrypoint: main.py\ncompute:\n  gpuz: 1\n")
    proc = stack.tau("run", str(bad / "tau.yaml"))
    assert proc.returncode == 2
    assert "compute.gpuz" in proc.stderr and ":4" in proc.stderr and "gpus" in proc.stderr

    cfg = write_project(tmp_path, "nows", "print('hi')\n",
                        "name: nows\nentrypoint: main.py\npolicy: {workspace: nowhere}\n")
    proc = stack.tau("run", str(cfg), "--follow", timeout=60)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    status = stack.json("status", run_id)
    assert status["state"] == "rejected" and "nowhere" in status["message"]
    rejected = [e for e in stack.events(run_id) if e["short_type"] == "policy.rejected"][0]
    assert rejected["data"]["reasons"][0]["field"] == "policy.workspace"

    # A client that skips validation and publishes garbage gets a rejection, not a dead service.
    import asyncio

    from taugrid.client import open_client

    async def raw() -> str:
        state = stack.state()  # the stack is authenticated: use the credentials `tau up` wrote for its user
        client = await open_client(state["nats_url"], creds=state["user_creds"])
        try:
            return await client.submit_text("name: [unclosed\n", workspace="default", name="garbage")
        finally:
            await client.close()

    garbage = asyncio.run(raw())
    assert stack.wait_state(garbage, {"rejected"})["state"] == "rejected"
    after = {(s["service"], s["replica"]): s["pid"] for s in stack.state()["services"]}
    assert after == before


def test_evidence_and_the_run_record_run_niced_and_the_run_path_does_not(stack: Stack) -> None:
    """A burst's CPU goes to the stages before admission first; the seal follows a run's end anyway, and no stage
    on the path waits for the run record's projection."""
    nice = {s["service"]: os.getpriority(os.PRIO_PROCESS, s["pid"]) for s in stack.state()["services"]
            if s["replica"] == 0}
    supervisor = os.getpriority(os.PRIO_PROCESS, stack.state()["pid"])
    background = {"evidence", "run_record"}
    assert {svc: nice[svc] for svc in background} == dict.fromkeys(background, supervisor + 10)
    assert {svc: n for svc, n in nice.items() if svc not in background} == dict.fromkeys(
        [svc for svc in nice if svc not in background], supervisor)
    assert {"submitter", "policy", "renderer", "admission_watcher", "local_cluster"} <= set(nice)


def test_two_renderer_replicas_share_the_work_without_duplicates(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "tiny", "print('ok')\n", "name: tiny\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    runs = [stack.tau("run", str(cfg), check=True).stdout.strip() for _ in range(12)]
    for r in runs:
        stack.wait_state(r, {"succeeded"}, timeout=120)
    for r in runs:
        types = [e["short_type"] for e in stack.wait_sealed(r)]
        assert types.count("render.applied") == 1 and types.count("exec.succeeded") == 1
        assert types.count("evidence.sealed") == 1
    logs = {i: (stack.data_dir / "logs" / f"renderer-{i}.log").read_text() for i in (0, 1)}
    handled = {i: {r for r in runs if f"applied {r} " in text} for i, text in logs.items()}
    assert handled[0] and handled[1], "both replicas should have rendered some runs"
    assert handled[0].isdisjoint(handled[1]) and handled[0] | handled[1] == set(runs)


def test_dry_run_prints_the_manifests_that_would_be_applied(stack: Stack) -> None:
    import yaml

    proc = stack.tau("run", str(REPO / "examples" / "quickstart"), "--dry-run", check=True)
    docs = list(yaml.safe_load_all(proc.stdout))
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    assert job["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    assert all("quickstart-dryrun" not in r["run_id"] for r in stack.json("list", "--limit", "0")["runs"])


def test_a_silent_run_is_stopped_as_hung_and_retried_per_policy(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "hung", (
        "import os, time\n"
        "print('started attempt', os.environ['TAU_RETRY_ATTEMPT'], flush=True)\n"
        "time.sleep(300)\n"
    ), "name: hung\nentrypoint: main.py\ncompute: {gpus: 0}\n"
       "resilience: {max_retries: 1, retry_on: [Hang], hang_timeout: 2s, backoff_initial: 100ms}\n")
    proc = stack.tau("run", str(cfg), "--follow", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    run_id = proc.stdout.splitlines()[0].strip()
    events = stack.wait_sealed(run_id)
    failed = [e["data"] for e in events if e["short_type"] == "exec.failed"]
    assert [f["reason"] for f in failed] == ["Hang", "Hang"]
    gave_up = next(e["data"] for e in events if e["short_type"] == "recovery.gave_up")
    assert gave_up["classification"] == "hang"


def test_resume_starts_a_new_run_from_the_last_checkpoint(stack: Stack) -> None:
    first = stack.tau("run", str(REPO / "examples" / "quickstart"), "--follow", timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    old = first.stdout.splitlines()[0].strip()
    proc = stack.tau("run", "resume", old, "--follow", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    new = proc.stdout.splitlines()[0].strip()
    assert new != old
    old_ckpt = stack.json("status", old)["resolved"]["checkpoint_dir"]
    logs = stack.tau("logs", new, check=True).stdout
    assert f"resumed from {old_ckpt}/last.json at epoch 30" in logs
    running = stack.tau("run", "resume", "no-such-run")
    assert running.returncode == 3


def test_diagnose_names_the_failure_and_retry_runs_the_same_code_again(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "broken", "print('loading', flush=True)\nraise ValueError('bad learning rate')\n",
                        "name: broken\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    first = stack.tau("run", str(cfg), "--follow", timeout=120)
    assert first.returncode == 1, first.stdout + first.stderr
    old = first.stdout.splitlines()[0].strip()
    found = stack.json("diagnose", old)
    assert (found["state"], found["classification"], found["cause"]) == (
        "failed", "app_error", "the script exited with code 1")
    assert found["last_lines"][0] == "loading" and found["last_lines"][-1] == "ValueError: bad learning rate"
    assert found["next_step"] == (f"fix the error its last lines show, then `tau run retry {old} --from .` in the "
                                  "project folder")
    human = stack.tau("diagnose", old, check=True).stdout
    assert human.startswith(f"{old}: failed — the script exited with code 1\n")
    again = stack.json("run", "retry", old)
    assert again["retries"] == old and again["run_id"] != old
    assert stack.wait_state(again["run_id"], {"failed", "succeeded"}, timeout=90)["state"] == "failed"
    events = stack.events(again["run_id"])
    accepted = next(e["data"] for e in events if e["short_type"] == "submit.accepted")
    requested = next(e["data"] for e in events if e["short_type"] == "submit.requested")
    assert (accepted["retries"], requested["config_text"]) == (old, cfg.read_text())
    assert stack.tau("diagnose", "no-such-run").returncode == 3


def test_reproduce_reruns_the_sealed_config_source_and_platform_revision(stack: Stack, tmp_path: Path) -> None:
    cfg = write_project(tmp_path, "repro", "print('same code', flush=True)\n",
                        "name: repro\nentrypoint: main.py\ncompute: {gpus: 0}\n")
    first = stack.tau("run", str(cfg), "--follow", timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    old = first.stdout.splitlines()[0].strip()
    stack.wait_sealed(old)
    (tmp_path / "repro" / "main.py").write_text("print('edited since', flush=True)\n")  # the sealed code runs
    again = stack.json("reproduce", old)
    sealed = stack.json("evidence", old)
    assert (again["reproduces"], again["source_digest"], again["platform_revision"]) == (
        old, sealed["source"]["digest"], sealed["platform"]["revision"])
    assert stack.wait_state(again["run_id"], {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    assert stack.tau("logs", again["run_id"], check=True).stdout == "same code\n"
    approved = next(e["data"] for e in stack.events(again["run_id"]) if e["short_type"] == "policy.approved")
    assert approved["platform_revision"] == sealed["platform"]["revision"]
    assert stack.tau("reproduce", "no-such-run").returncode == 3
