"""The data dir is resolved in one place: TAU_DATA_DIR, else /var/lib/taugrid for root (where per-workspace run
users can pass; a ~/.tau made before keeps its stack until that exists), else ~/.tau. The CLI, the client and
the services all ask ``taugrid.settings``, so `tau up`, `tau down` and a later `tau` agree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taugrid import settings
from taugrid.bus import identity
from taugrid.client import locate


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(a home, where the system data dir would be), neither holding a data dir yet."""
    home, system = tmp_path / "home", tmp_path / "var-lib-taugrid"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(settings.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(settings, "SYSTEM_DATA_DIR", system)
    return home, system


def test_root_keeps_its_data_where_other_users_may_pass(machine: tuple[Path, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home, system = machine
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert settings.data_dir() == system
    assert locate.data_dir() == identity.data_dir() == system  # the CLI finds stack.json and creds/ there
    assert locate.login_file() == system / "login.json"
    (home / ".tau").mkdir()  # a data dir an older `tau up` made as root: its stack and keys stay found
    assert settings.data_dir() == home / ".tau"
    system.mkdir()
    assert settings.data_dir() == system
    assert settings.stack_data_dir() is None  # not on an embedded stack's service


def test_anyone_else_keeps_theirs_in_their_home(machine: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home, system = machine
    system.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert settings.data_dir() == home / ".tau"
    assert locate.login_file() == home / ".tau" / "login.json"  # where `tau login --creds` stored the server


def test_tau_data_dir_wins_for_everyone(machine: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = machine
    monkeypatch.setenv(settings.DATA_DIR_ENV, "~/stacks/a")
    for uid in (0, 1000):
        monkeypatch.setattr(os, "geteuid", lambda uid=uid: uid)
        assert settings.data_dir() == settings.stack_data_dir() == home / "stacks" / "a"
    assert settings.data_dir({settings.DATA_DIR_ENV: "/srv/tau"}) == Path("/srv/tau")
    assert settings.stack_data_dir({settings.DATA_DIR_ENV: "  "}) is None
