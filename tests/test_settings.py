"""The data dir is resolved in one place: TAU_DATA_DIR, else /var/lib/taugrid for root (where per-workspace run
users can pass; a ~/.tau made before keeps its stack until that exists), else ~/.tau. The CLI, the client and
the services all ask ``taugrid.settings``, so `tau up`, `tau down` and a later `tau` agree."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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


def test_the_client_takes_the_bus_from_its_settings_and_tau_nats_url_set_to_the_default_still_wins(
        machine: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = machine
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for env in ("TAU_NATS_URL", "TAU_NATS_CREDS", "TAU_NATS_CA"):
        monkeypatch.delenv(env, raising=False)
    (home / ".tau").mkdir()
    (home / ".tau" / "login.json").write_text(
        '{"server": "tls://bus:4222", "creds": "/saved/me.creds", "ca": "/saved/ca.crt"}')
    assert (locate.bus_url(), locate.bus_creds(), locate.bus_ca()) == (
        "tls://bus:4222", Path("/saved/me.creds"), Path("/saved/ca.crt"))  # unset: `tau login`'s server
    monkeypatch.setenv("TAU_NATS_URL", "nats://127.0.0.1:4222")  # the default address, set on purpose
    monkeypatch.setenv("TAU_NATS_CREDS", "~/mine.creds")
    monkeypatch.setenv("TAU_NATS_CA", " ")  # blank: unset, so `tau login`'s CA for its server
    assert locate.bus_url() == "nats://127.0.0.1:4222"
    assert locate.bus_creds() == home / "mine.creds"
    assert locate.bus_ca("tls://bus:4222") == Path("/saved/ca.crt")


# ---------------------------------------------------------------- one typed settings object (issue #29, item 4)

SOURCE = [*Path("libs").rglob("*.py"), *Path("services").rglob("*.py")]
NAME = re.compile(r"\bTAU_[A-Z][A-Z0-9_]*")
# A direct read of a TAU_ variable: os.environ.get / [...] / getenv, or .get on a mapping called env/environ/e.
DIRECT_READ = re.compile(r"(?:os\.environ\[\s*(?:['\"]TAU_|[A-Z_]+_ENV\b)(?![^\]]*\]\s*=[^=])"
                         r"|(?:\benviron|\benv|\be)\.get\(\s*(?:['\"]TAU_|[A-Z_]+_ENV\b)|getenv\()")


def _names_in_strings(path: Path) -> set[str]:
    """Every TAU_* name in the file's string literals (f-strings' text included), docstrings too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {n for n in NAME.findall(node.value) if not n.endswith("_")}  # TAU_HEALTH_*: a family
    return found


def test_every_tau_variable_in_the_source_is_a_declared_setting_or_one_taugrid_hands_down() -> None:
    declared = {var.env for _, _, var, _ in settings.variables()}
    undeclared = {f"{name} ({path})" for path in SOURCE for name in _names_in_strings(path)
                  if name not in declared and name not in settings.HANDED_DOWN
                  and not name.startswith(tuple(settings.HANDED_DOWN_PREFIXES))}
    assert undeclared == set(), "declare each in taugrid/settings/model.py (type, default, why)"
    assert not declared & set(settings.HANDED_DOWN)  # a name is a setting or handed down, never both


def test_no_file_reads_a_tau_variable_around_the_settings_object() -> None:
    reading = {str(path) for path in SOURCE if "taugrid/settings/" not in str(path)
               and DIRECT_READ.search(path.read_text())}
    assert reading == set()


def test_defaults_are_the_ones_the_code_had() -> None:
    from taugrid.bus.connection import DEFAULT_URL
    from taugrid.health import ib, monitor, rules

    defaults = settings.Settings()
    assert settings.Settings.from_env({}) == defaults
    assert monitor.policy(defaults.health) == rules.Policy()  # the monitor's thresholds, unchanged
    assert defaults.health.ib_sysfs == ib.SYSFS_ROOT and defaults.bus.url == DEFAULT_URL
    assert (defaults.health.drain_grace_s, defaults.health.recovery_settle_s, defaults.anchor.interval_s,
            defaults.kube.bridge_lease_ttl_s, defaults.source_fetch.timeout_s) == (30, 10.0, 60.0, 15.0, 120.0)
    assert (defaults.process.backend, defaults.process.log_level, defaults.metrics.addr) == (
        "local", "INFO", "127.0.0.1")


def test_values_are_typed_and_blank_means_unset_except_where_blank_is_a_value() -> None:
    got = settings.Settings.from_env({
        "TAU_NATS_CREDS": "~/svc.creds", "TAU_HEALTH_DRAIN_GRACE_S": " 45 ", "TAU_METRICS_PORT": "9100",
        "TAU_WATCH_NAMESPACES": "team-b, team-a,,team-b", "TAU_LOCAL_SIMULATE": "yes", "TAU_LOG_LEVEL": "debug",
        "TAU_BACKEND": "Kubernetes", "TAU_EVIDENCE_KEEP_OUTPUTS": "64Mi", "TAU_IB_SYSFS": "",
        "TAU_CONTAINER_ENGINES": "", "TAU_ANCHOR_INTERVAL_S": "", "KUBECONFIG": "/k/config"})
    assert got.bus.creds == Path.home() / "svc.creds"
    assert (got.health.drain_grace_s, got.metrics.port, got.kube.watch_namespaces) == (45, 9100, ("team-b", "team-a"))
    assert (got.local.simulate, got.process.log_level, got.process.backend) == (True, "DEBUG", "kubernetes")
    assert got.evidence.keep_outputs == 64 << 20
    assert (got.health.ib_sysfs, got.local.container_engines) == ("", ())  # set but empty: none
    assert got.anchor.interval_s == 60.0  # blank: the default
    assert got.kube.kubeconfig == "/k/config"  # the Kubernetes clients' own variable, when TAU_KUBECONFIG is unset
    assert settings.Settings.from_env({"TAU_KUBECONFIG": "/t", "KUBECONFIG": "/k"}).kube.kubeconfig == "/t"


@pytest.mark.parametrize(("env", "value", "error"), [
    ("TAU_HEALTH_DRAIN_GRACE_S", "abc", "TAU_HEALTH_DRAIN_GRACE_S='abc': must be a whole number of seconds; set e.g. "
                                        "TAU_HEALTH_DRAIN_GRACE_S=30, or unset it for the default (30)"),
    ("TAU_BUS_REPLICAS", "9", "TAU_BUS_REPLICAS='9': must be a whole number from 1 to 5 (3 for a 3-node cluster); "
                              "set e.g. TAU_BUS_REPLICAS=3, or unset it for the default (1)"),
    ("TAU_BACKEND", "kubernets", "TAU_BACKEND='kubernets': must be one of local, kubernetes; set e.g. "
                                 "TAU_BACKEND=local, or unset it for the default (local)"),
    ("TAU_METRICS_PORT", "70000", "TAU_METRICS_PORT='70000': must be a port number, 0 to 65535; set e.g. "
                                  "TAU_METRICS_PORT=8080, or unset it for the default (unset)"),
    ("TAU_LOCAL_SIMULATE", "maybe", "TAU_LOCAL_SIMULATE='maybe': must be 1, true, yes, on or 0, false, no, off; "
                                    "set e.g. TAU_LOCAL_SIMULATE=1, or unset it for the default (off)"),
    ("TAU_NODE_SAMPLE_INTERVAL", "0", "TAU_NODE_SAMPLE_INTERVAL='0': must be a number of seconds above 0; set e.g. "
                                      "TAU_NODE_SAMPLE_INTERVAL=5, or unset it for the default (5.0)"),
    ("TAU_RECOVERY_HEALTH_SETTLE_S", "nan", "TAU_RECOVERY_HEALTH_SETTLE_S='nan': must be a number of seconds; set "
                                            "e.g. TAU_RECOVERY_HEALTH_SETTLE_S=10, or unset it for the default (10.0)"),
    ("TAU_HEALTH_MAX_CORDONED", "-1", "TAU_HEALTH_MAX_CORDONED='-1': must be a whole number, 0 or more; set e.g. "
                                      "TAU_HEALTH_MAX_CORDONED=3, or unset it for the default (3)"),
    ("TAU_LOG_LEVEL", "loud", "TAU_LOG_LEVEL='loud': must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL; set e.g. "
                              "TAU_LOG_LEVEL=WARNING, or unset it for the default (INFO)"),
])
def test_a_value_that_does_not_parse_names_the_variable_and_the_fix(env: str, value: str, error: str) -> None:
    with pytest.raises(settings.SettingsError) as refused:
        settings.Settings.from_env({env: value})
    assert str(refused.value) == error


def test_a_heartbeat_interval_below_the_sample_interval_is_refused_naming_both_and_the_fix() -> None:
    with pytest.raises(settings.SettingsError) as refused:
        settings.Settings.from_env({"TAU_NODE_SAMPLE_INTERVAL": "10", "TAU_NODE_HEARTBEAT_INTERVAL": "7.5"})
    assert str(refused.value) == (
        "TAU_NODE_HEARTBEAT_INTERVAL=7.5 is below TAU_NODE_SAMPLE_INTERVAL=10: a heartbeat is a sample, so it "
        "cannot come more often than samples are taken; set TAU_NODE_HEARTBEAT_INTERVAL to 10 or more, or unset it "
        "for the default (60.0)")
    with pytest.raises(settings.SettingsError) as refused:  # the default heartbeat would not do either
        settings.Settings.from_env({"TAU_NODE_SAMPLE_INTERVAL": "90"})
    assert str(refused.value).endswith("set TAU_NODE_HEARTBEAT_INTERVAL to 90 or more")
    equal = settings.Settings.from_env({"TAU_NODE_SAMPLE_INTERVAL": "10", "TAU_NODE_HEARTBEAT_INTERVAL": "10"})
    assert (equal.health.sample_interval_s, equal.health.heartbeat_interval_s) == (10.0, 10.0)


def test_a_process_parses_once_and_again_only_when_a_tau_variable_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAU_NODE_NAME", "n1")
    first = settings.current()
    assert settings.current() is first and first.local.node_name == "n1"
    monkeypatch.setenv("PATH_UNRELATED_TO_TAU", "x")
    assert settings.current() is first
    monkeypatch.setenv("TAU_NODE_NAME", "n2")
    assert settings.current().local.node_name == "n2"


def test_the_variables_are_walked_again_only_when_the_environment_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some callers ask once a message (the evidence four times a seal): an unchanged environment is not walked
    again (a copy of CPython's own dict of it is compared), a changed one is, and a removed variable is seen."""
    walks: list[tuple[tuple[str, str], ...]] = []
    walk = settings._tau_items

    def counted() -> tuple[tuple[str, str], ...]:
        walks.append(walk())
        return walks[-1]

    monkeypatch.setattr(settings, "_tau_items", counted)
    monkeypatch.setenv("TAU_NODE_NAME", "n1")
    first = settings.current()
    assert {id(settings.current()) for _ in range(100)} == {id(first)}
    assert len(walks) == 1
    monkeypatch.setenv("PATH_UNRELATED_TO_TAU", "y")
    assert (settings.current() is first, len(walks)) == (True, 2)
    monkeypatch.delenv("TAU_NODE_NAME")
    assert (settings.current().local.node_name, len(walks)) == ("", 3)
    assert (settings.current().local.node_name, len(walks)) == ("", 3)


def test_a_service_with_a_bad_value_stops_at_its_start_naming_it() -> None:
    env = {**os.environ, "TAU_HEALTH_DRAIN_GRACE_S": "soon", "TAU_NATS_URL": "nats://127.0.0.1:1"}
    done = subprocess.run([sys.executable, "-m", "taugrid_services.recovery"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "recovery: TAU_HEALTH_DRAIN_GRACE_S='soon': must be a whole number of seconds; set e.g. "
        "TAU_HEALTH_DRAIN_GRACE_S=30, or unset it for the default (30)")


def test_the_architecture_doc_lists_every_setting() -> None:
    from taugrid.settings.__main__ import handed_down, table

    doc = Path("docs/architecture.md").read_text()
    assert table() in doc and handed_down() in doc  # regenerate with `python -m taugrid.settings`
