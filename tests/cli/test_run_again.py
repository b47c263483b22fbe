"""`tau run retry` and `tau run resume` run the old run's config and code by default and the project's current ones
with `--from`, and say which; `resume` after an OOMKilled run is refused unless --force or `--from` changes compute.
Against a real nats-server with authentication on: the old run is a stored submission and its finished record; the
new one is read back from the stream as it was submitted (no services run)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taugrid.bus import kv
from taugrid.client.client import Client
from taugrid.core.contracts import ResolvedRun, SubmitRequested
from taugrid.core.limits import SNAPSHOT_UPLOAD_MAX_BYTES
from taugrid.core.states import RunRecord
from taugrid.sources import snapshots
from tests.platforms import people_platform
from tests.secure_nats import SecureNats, started

TAU = [sys.executable, "-m", "taugrid.cli.main"]
PLATFORM = people_platform("vision")
CONFIG = "name: train\nentrypoint: main.py\ncompute: {gpus: 0, memory_limit: 200Mi}\n"
RAISED = CONFIG.replace("200Mi", "2Gi")


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecureNats]:
    async with started(tmp_path_factory.mktemp("run-again"), owner="carol", platform=PLATFORM) as nats:
        yield nats


class Old:
    """A finished run of a project: its submission in the stream and its record as the projection left it."""

    def __init__(self, server: SecureNats, project: Path) -> None:
        self.server, self.project = server, project

    async def submit(self, *, reason: str, exit_code: int | None) -> str:
        bus, boot = await self.server.connect("carol"), await self.server.connect("bootstrap")
        try:
            run_id = await Client(bus).submit(self.project / "tau.yaml", workspace="vision")
            req = await self.request(run_id)  # accepted as the submitter would: its snapshot promoted to sources
            await snapshots.promote(boot, req.source_object, req.source_digest, max_bytes=SNAPSHOT_UPLOAD_MAX_BYTES)
            resolved = ResolvedRun(run_id=run_id, submission_id="s", workspace="vision", namespace="ns",
                                   name="train", checkpoint_dir="/data/vision/checkpoints/old")
            record = RunRecord(run_id=run_id, workspace="vision", name="train", state="failed", reason=reason,
                               exit_code=exit_code, resolved=resolved)
            await kv.put(boot, "run_state", f"run.vision.{run_id}", record)
            return run_id
        finally:
            await bus.close()
            await boot.close()

    async def request(self, run_id: str) -> SubmitRequested:
        """The new run's submission, as it went onto the stream: read back from HISTORY, whose feed copies it a
        moment after RUNS stored it."""
        bus = await self.server.connect("carol")
        try:
            for _ in range(200):
                async for ev in Client(bus).replay(f"run.vision.{run_id}.submit.>"):
                    return ev.payload(SubmitRequested)
                await asyncio.sleep(0.05)
        finally:
            await bus.close()
        raise AssertionError(f"no submission of {run_id}")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "proj"
    d.mkdir()
    (d / "main.py").write_text("print('hi')\n")
    (d / "tau.yaml").write_text(CONFIG)
    return d


def tau(server: SecureNats, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TAU_")}, "TAU_NATS_URL": server.url,
           "TAU_NATS_CREDS": str(server.creds("carol")), "TAU_DATA_DIR": str(cwd / "carol")}
    return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


async def test_resume_after_an_oom_is_refused_until_compute_changes_or_force(server: SecureNats,
                                                                             project: Path) -> None:
    old = Old(server, project)
    run_id = await old.submit(reason="OOMKilled: not in resilience.retry_on (Preempted, Evicted)", exit_code=137)

    plain = tau(server, project, "run", "resume", run_id)
    assert (plain.returncode, plain.stdout) == (2, "")
    assert plain.stderr == (
        f"error: run {run_id} was OOMKilled and its config would be killed the same way: raise compute.memory_limit "
        f"in tau.yaml, then `tau run resume {run_id} --from .` (the project's current config and code), or pass "
        "--force to resume it as it was\n")
    unchanged = tau(server, project, "run", "resume", run_id, "--from", ".")
    assert unchanged.returncode == 2
    assert unchanged.stderr == (f"error: run {run_id} was OOMKilled and tau.yaml leaves compute as it was: raise "
                                "compute.memory_limit there, or pass --force to resume it anyway\n")

    (project / "tau.yaml").write_text(RAISED)
    raised = tau(server, project, "run", "resume", run_id, "--from", ".", "--output", "json")
    assert raised.returncode == 0, raised.stderr
    got = json.loads(raised.stdout)
    assert (got["resumes"], got["config"], got["project"], got["config_changed"], got["files_changed"]) == (
        run_id, "project", "tau.yaml", True, True)
    req = await old.request(got["run_id"])
    assert (req.config_text, req.resumes, req.resume_from) == (RAISED, run_id, "/data/vision/checkpoints/old")

    forced = tau(server, project, "run", "resume", run_id, "--force", "--checkpoint", "/data/vision/ckpt/7")
    assert forced.returncode == 0, forced.stderr
    new_id = forced.stdout.strip()
    assert forced.stderr == (f"note: {new_id} runs {run_id}'s config and code as submitted (`--from .` runs the "
                             "project's current tau.yaml and code instead)\n")
    req = await old.request(new_id)
    assert (req.config_text, req.resume_from) == (CONFIG, "/data/vision/ckpt/7")


async def test_retry_keeps_the_old_config_unless_from_names_the_project(server: SecureNats, project: Path) -> None:
    old = Old(server, project)
    run_id = await old.submit(reason="OOMKilled", exit_code=137)
    (project / "tau.yaml").write_text(RAISED)
    (project / "main.py").write_text("print('fixed')\n")

    same = tau(server, project, "run", "retry", run_id, "--output", "json")
    assert same.returncode == 0, same.stderr
    got = json.loads(same.stdout)
    assert (got["retries"], got["config"], got["project"]) == (run_id, "run", None)
    kept = await old.request(got["run_id"])
    assert (kept.config_text, kept.retries) == (CONFIG, run_id)

    edited = tau(server, project.parent, "run", "retry", run_id, "--from", "proj")
    assert edited.returncode == 0, edited.stderr
    new_id = edited.stdout.strip()
    assert edited.stderr == (f"note: {new_id} runs proj/tau.yaml and its project's code as they are now (its files "
                             f"differ from {run_id}'s; tau.yaml changed)\n")
    req = await old.request(new_id)
    assert (req.config_text, req.retries, req.resume_from) == (RAISED, run_id, "")
    assert req.source_digest not in ("", kept.source_digest)


def test_from_names_a_project_not_a_checkpoint(server: SecureNats, project: Path) -> None:
    bad = tau(server, project, "run", "resume", "any-run", "--from", "/data/vision/checkpoints")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == ("error: --from takes a project folder holding a tau.yaml, or the tau.yaml itself: "
                          "'/data/vision/checkpoints' is neither (the checkpoint to resume from is `--checkpoint "
                          "PATH`)\n")
