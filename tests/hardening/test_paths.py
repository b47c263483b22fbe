"""Paths stay inside: entrypoints and runtime.working_dir inside the project snapshot, storage.output and
resilience.checkpoint_path inside `<output root>/<workspace>/`; refused with the field named by `tau run
validate` and by the submitter/policy stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taugrid.config.taujob import load_tau_config
from taugrid.core.contracts import Rejected
from taugrid.core.errors import ConfigError
from tests.hardening.conftest import Stack

TAU = [sys.executable, "-m", "taugrid.cli.main"]


def issue_of(text: str) -> dict[str, object]:
    with pytest.raises(ConfigError) as err:
        load_tau_config(text)
    [issue] = err.value.issues
    return issue


@pytest.mark.parametrize("entrypoint", ["../../etc/passwd", "/usr/bin/id", "python3 ../outside.py", "~/x.sh"])
def test_an_entrypoint_outside_the_snapshot_is_refused(entrypoint: str) -> None:
    issue = issue_of(f"name: t\nentrypoint: {entrypoint!r}\n")
    assert (issue["field"], issue["line"]) == ("entrypoint", 2)
    word = entrypoint.split()[-1]
    assert issue["message"] == (
        f"{word!r} is outside the project snapshot: an entrypoint runs a file of the project (relative to the "
        "folder holding tau.yaml) or a command on PATH")


def test_the_alias_that_named_the_entrypoint_is_the_field() -> None:
    assert issue_of("name: t\nrun: {script: /bin/id}\n")["field"] == "run.script"


@pytest.mark.parametrize("entrypoint", ["train.py", "bin/train.py", "./run.sh", "echo hi", "python3 -m pkg.main",
                                        "sh -c 'echo done'"])
def test_entrypoints_inside_the_snapshot_or_on_path_are_accepted(entrypoint: str) -> None:
    assert load_tau_config(f"name: t\nentrypoint: {entrypoint!r}\n").entrypoint == entrypoint


def test_a_source_image_keeps_its_own_absolute_entrypoint() -> None:
    cfg = load_tau_config("name: t\nentrypoint: /opt/app/train.py\n"
                          "run: {source: {image: 'r.io/x@sha256:" + "a" * 64 + "', path: /opt/app}}\n")
    assert cfg.entrypoint == "/opt/app/train.py"


@pytest.mark.parametrize("wd", ["../../../..", "src/../../x", "/"])
def test_a_working_dir_outside_the_snapshot_is_refused(wd: str) -> None:
    issue = issue_of(f"name: t\nentrypoint: t.py\nruntime: {{working_dir: {wd!r}}}\n")
    assert (issue["field"], issue["line"]) == ("runtime.working_dir", 3)
    assert str(issue["message"]).startswith(f"{wd!r} is outside the project snapshot")


def test_tau_run_validate_refuses_an_escaping_entrypoint_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "tau.yaml").write_text("name: t\nentrypoint: ../../etc/passwd\n")
    proc = subprocess.run([*TAU, "run", "validate", str(tmp_path), "--offline", "--output", "json"],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    assert proc.returncode == 2, proc.stderr
    [issue] = json.loads(proc.stdout)["issues"]
    assert (issue["field"], issue["line"]) == ("entrypoint", 2)


async def test_the_submitter_refuses_an_escaping_entrypoint(stack: Stack) -> None:
    run_id = await stack.client.submit_text("name: t\nentrypoint: /usr/bin/id\n", workspace="team-a", name="t")
    evs = await stack.wait_for(run_id, {"submit.rejected", "submit.accepted"})
    assert evs[-1].type == "submit.rejected"
    assert evs[-1].payload(Rejected).reasons[0].field == "entrypoint"


@pytest.mark.parametrize(("key", "field"), [("storage: {output: OUT}", "storage.output"),
                                            ("resilience: {checkpoint_path: OUT}", "resilience.checkpoint_path")])
@pytest.mark.parametrize("where", ["{root}/other/run-1", "{root}/team-a/../other/x", "{root}", "relative/dir",
                                   "{root}/team-a"])
async def test_output_and_checkpoint_paths_outside_the_workspace_are_refused(
        stack: Stack, key: str, field: str, where: str) -> None:
    root = str(stack.tmp / "outputs")
    path = where.format(root=root)
    run_id = await stack.client.submit_text(f"name: t\nentrypoint: t.py\n{key.replace('OUT', repr(path))}\n",
                                            workspace="team-a", name="t")
    evs = await stack.wait_for(run_id, {"policy.rejected", "policy.approved", "submit.rejected"})
    assert evs[-1].type == "policy.rejected"
    [issue] = evs[-1].payload(Rejected).reasons
    assert (issue.field, issue.message) == (
        field, f"{path!r} is outside {root}/team-a/, the output directory of workspace 'team-a'")


@pytest.mark.parametrize(("key", "field"), [("storage: {output: OUT}", "storage.output"),
                                            ("resilience: {checkpoint_path: OUT}", "resilience.checkpoint_path")])
async def test_another_runs_output_directory_is_refused(stack: Stack, key: str, field: str) -> None:
    root = str(stack.tmp / "outputs")
    first = await stack.client.submit_text("name: first\nentrypoint: t.py\n", workspace="team-a", name="first")
    evs = await stack.wait_for(first, {"policy.approved"})
    assert evs[-1].as_dict()["run"]["output_dir"] == f"{root}/team-a/{first}"
    path = f"{root}/team-a/{first}/metrics"
    run_id = await stack.client.submit_text(f"name: t\nentrypoint: t.py\n{key.replace('OUT', repr(path))}\n",
                                            workspace="team-a", name="t")
    evs = await stack.wait_for(run_id, {"policy.rejected", "policy.approved", "submit.rejected"})
    assert evs[-1].type == "policy.rejected"
    [issue] = evs[-1].payload(Rejected).reasons
    assert (issue.field, issue.message, issue.fix) == (
        field, f"{path!r} is inside the output directory of run {first!r}",
        f"name a directory of your own under {root}/team-a/ (e.g. {root}/team-a/<name>), not another run's")


async def test_paths_inside_the_workspace_are_accepted(stack: Stack) -> None:
    root = str(stack.tmp / "outputs")
    run_id = await stack.client.submit_text(
        f"name: t\nentrypoint: t.py\nstorage: {{output: '{root}/team-a/mine/'}}\n"
        f"resilience: {{checkpoint_path: '{root}/team-a/mine/ckpt'}}\n", workspace="team-a", name="t")
    evs = await stack.wait_for(run_id, {"policy.rejected", "policy.approved"})
    assert evs[-1].type == "policy.approved", evs[-1].as_dict()
    run = evs[-1].as_dict()["run"]
    assert (run["output_dir"], run["resilience"]["checkpoint_path"]) == (
        f"{root}/team-a/mine", f"{root}/team-a/mine/ckpt")
