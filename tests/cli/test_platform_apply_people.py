"""`tau platform apply` never loses people or workspaces: it keeps the users `tau admin user add` made, refuses to
drop a workspace with runs or members unless --prune, shows its diff, and `tau platform show` round-trips; `tau run
retry` of a run whose workspace is gone fails. Against a real nats-server with authentication on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from taugrid.bus import kv
from taugrid.bus.kv import Conflict
from taugrid.client import platformplan
from taugrid.config.platform import load_platform
from taugrid.core.states import RunRecord
from taugrid.stack import auth
from tests.platforms import people_platform
from tests.secure_nats import SecureNats, started

TAU = [sys.executable, "-m", "taugrid.cli.main"]
PLATFORM = people_platform("vision", "language")
QUOTA_CHANGED = people_platform("vision", "language", cpu=16)
ONLY_AUDIO = people_platform("audio")


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecureNats]:
    """A private authenticated server whose stack owner (what `tau up` records) is carol, a platform admin."""
    async with started(tmp_path_factory.mktemp("apply-people"), owner="carol") as nats:
        yield nats


class Tau:
    def __init__(self, server: SecureNats, cwd: Path, name: str = "carol") -> None:
        self.cwd = cwd
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("TAU_")},
                    "TAU_NATS_URL": server.url, "TAU_NATS_CREDS": str(server.creds(name)),
                    "TAU_DATA_DIR": str(cwd / name)}

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=self.cwd, env=self.env)

    def apply(self, text: str, *args: str, name: str = "platform.yaml") -> subprocess.CompletedProcess[str]:
        (self.cwd / name).write_text(text)
        return self("platform", "apply", name, *args)

    def revision(self) -> int:
        return int(json.loads(self("platform", "show", "--output", "json").stdout)["revision"])


def test_a_user_added_by_tau_admin_survives_an_apply_that_does_not_list_them(server: SecureNats,
                                                                             tmp_path: Path) -> None:
    tau = Tau(server, tmp_path)
    assert tau.apply(PLATFORM, "--prune").returncode == 0
    added = tau("admin", "user", "add", "dana", "-w", "vision", "--output", "json")
    assert added.returncode == 0, added.stderr

    applied = tau.apply(QUOTA_CHANGED)
    assert applied.returncode == 0, applied.stderr
    revision = tau.revision()
    assert applied.stdout.splitlines() == [
        "  ~ cluster_queue cq",
        "      quota[default/cpu].nominal_quota: 8 → 16",
        "  = user dana: not in platform.yaml; kept with their memberships (`tau admin user remove dana` or --prune "
        "removes them)",
        "  = workspace vision: members dana kept, not in platform.yaml",
        f"platform revision {revision} applied from platform.yaml (1 change(s) since revision {revision - 1})",
    ]
    listed = json.loads(tau("admin", "user", "list", "--output", "json").stdout)
    assert [(u["user"], u["workspaces"]) for u in listed] == [("dana", ["vision"])]

    # the server's users are rendered from the stored revision (what `tau up`'s supervisor does): dana gets in
    platform = load_platform(json.dumps(json.loads(tau("platform", "show", "--output", "json").stdout)["platform"]))
    assert platform.cluster_queue("cq").nominal("cpu") == 16  # type: ignore[union-attr]
    people = auth.people(platform, local_admin=None)
    assert [(p.name, p.workspaces) for p in people] == [("dana", ("vision",))]
    server.set_people([*(p for p in server.people if p.name != "dana"), *people])
    dana = {**{k: v for k, v in os.environ.items() if not k.startswith("TAU_")}, "TAU_DATA_DIR": str(tmp_path / "dana")}
    for args in (["login", "--server", server.url, "--creds", str(tmp_path / "dana.nk")], ["whoami", "-o", "json"]):
        proc = subprocess.run([*TAU, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=dana)
        assert proc.returncode == 0, proc.stderr
    me = json.loads(proc.stdout)
    assert (me["user"], me["workspaces"]) == ("dana", ["vision"])


def test_show_round_trips_and_an_apply_that_changes_nothing_stores_nothing(server: SecureNats,
                                                                            tmp_path: Path) -> None:
    tau = Tau(server, tmp_path)
    assert tau.apply(PLATFORM, "--prune").returncode == 0
    assert tau("admin", "user", "add", "fay", "-w", "language", "--admin-of", "language").returncode == 0
    assert tau.apply(QUOTA_CHANGED).returncode == 0
    revision = tau.revision()

    (tmp_path / "shown.yaml").write_text(tau("platform", "show").stdout)
    again = tau("platform", "apply", "shown.yaml")
    assert (again.returncode, again.stdout) == (0, f"shown.yaml changes nothing: the platform stays at revision "
                                                   f"{revision}\n")
    same = json.loads(tau.apply(QUOTA_CHANGED, "--output", "json").stdout)
    assert (same["applied"], same["revision"], same["changes"]) == (False, revision, [])
    assert [(k["kind"], k["name"], k["action"]) for k in same["kept"]] == [("user", "fay", "keep"),
                                                                          ("workspace", "language", "keep")]
    assert tau.revision() == revision


async def test_an_apply_refuses_to_drop_a_workspace_with_runs_or_members_unless_pruned(server: SecureNats,
                                                                                       tmp_path: Path) -> None:
    tau = Tau(server, tmp_path)
    assert tau.apply(PLATFORM, "--prune").returncode == 0
    assert tau("admin", "user", "add", "erin", "-w", "vision").returncode == 0
    run_id = "old-run-1"
    await _store_run(server, RunRecord(run_id=run_id, workspace="language", state="failed", reason="Error"))
    revision = tau.revision()

    refused = tau.apply(ONLY_AUDIO)
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: platform.yaml would remove workspace 'vision' (members: erin) and workspace 'language' (1 run); "
        "nothing was applied. Keep them in platform.yaml (`tau platform show` prints the current platform), or pass "
        "--prune to remove them: their runs can no longer be retried and their members lose them\n")
    assert refused.stdout.splitlines()[:3] == ["  + workspace audio", "  - workspace vision: members: erin",
                                               "  - workspace language: 1 run"]
    dry = json.loads(tau("platform", "apply", "platform.yaml", "--dry-run", "--output", "json").stdout)
    assert (dry["applied"], dry["dry_run"], dry["previous_revision"]) == (False, True, revision)
    assert dry["refused"] == [{"workspace": "vision", "runs": 0, "members": ["erin"]},
                              {"workspace": "language", "runs": 1, "members": []}]
    assert tau.revision() == revision

    pruned = tau("platform", "apply", "platform.yaml", "--prune", "--output", "json")
    assert pruned.returncode == 0, pruned.stderr
    result = json.loads(pruned.stdout)
    assert (result["schema"], result["applied"], result["revision"]) == ("taugrid.io/platform-apply/v1", True,
                                                                         revision + 1)
    assert [(c["action"], c["kind"], c["name"], c["details"]) for c in result["changes"]] == [
        ("add", "workspace", "audio", []),
        ("remove", "workspace", "vision", ["members: erin"]),
        ("remove", "workspace", "language", ["1 run"]),
        ("remove", "user", "erin", ["their credentials are refused from now on"]),
    ]

    retried = tau("run", "retry", run_id)
    assert retried.returncode == 3
    assert retried.stderr == (
        f"error: `tau run retry` of {run_id}: its workspace 'language' is no longer in the platform (workspaces: "
        "audio); restore it with `tau platform apply`, or submit the project again into another workspace with "
        "`tau run PROJECT --workspace NAME`\n")


async def test_an_apply_planned_before_a_user_was_added_keeps_them(server: SecureNats, tmp_path: Path) -> None:
    tau = Tau(server, tmp_path)
    assert tau.apply(PLATFORM, "--prune").returncode == 0
    bus = await server.connect("carol")
    try:
        planned = await platformplan.plan(bus, QUOTA_CHANGED, path="platform.yaml", prune=False)
        assert tau("admin", "user", "add", "gus").returncode == 0  # written after the plan read the platform
        with pytest.raises(Conflict):
            await platformplan.store(bus, planned)
        replanned, revision = await platformplan.apply(bus, QUOTA_CHANGED, path="platform.yaml", prune=False)
        assert [u.name for u in replanned.platform.users] == ["gus"]
        assert revision == replanned.revision + 1 == tau.revision()
    finally:
        await bus.close()


async def _store_run(server: SecureNats, record: RunRecord) -> None:
    """A finished run's record, as the submitter's projection leaves it."""
    boot = await server.connect("bootstrap")
    try:
        await kv.put(boot, "run_state", f"run.{record.workspace}.{record.run_id}", record)
    finally:
        await boot.close()
