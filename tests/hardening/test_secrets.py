"""Secrets: credential-looking literal env refused, the per-workspace 0600 secrets file, the bus server never
inheriting TAU_SECRET_*, and pod directories removed once the run is sealed. (The kubelet and controller halves —
the value reaches only the process, never spec.json, logs or events; another workspace's secret is not found —
are in tests/local/test_kubelet.py and tests/local/test_controller.py.)"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from taugrid import backend
from taugrid.config.taujob import load_tau_config
from taugrid.core.errors import ConfigError
from taugrid.local.cleanup import remove_finished_pods
from taugrid.local.podspec import PodSpecError
from taugrid.local.secrets import SecretStore, redactor, seal, unseal, write_secret
from taugrid.local.shim import MAX_LINE, _pump
from taugrid.stack import natsserver


@pytest.mark.parametrize("name", ["HF_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY",
                                  "MY_SECRET_SALT"])
def test_a_credential_named_literal_env_is_refused_with_the_env_secret_hint(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_tau_config(f"name: t\nentrypoint: t.py\nruntime:\n  env:\n    {name}: abc\n")
    [issue] = err.value.issues
    assert (issue["field"], issue["line"]) == (f"runtime.env.{name}", 5)
    assert issue["message"] == (f"{name} looks like a credential: a literal value would be stored in the run's "
                                "events, the audit trail and its evidence")
    assert str(issue["fix"]).startswith(f'move it to runtime.env_secret, e.g. {name}: "')


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "MAX_TOKENS", "LOG_LEVEL", "AUTHOR"])
def test_ordinary_names_stay_literal(name: str) -> None:
    cfg = load_tau_config(f"name: t\nentrypoint: t.py\nruntime:\n  env:\n    {name}: x\n")
    assert cfg.runtime.env == {name: "x"}


def test_the_secrets_file_is_per_workspace_and_must_be_private(tmp_path: Path) -> None:
    path = write_secret(tmp_path, "team-a", "hf", {"token": "hf_abc"})
    store = SecretStore(tmp_path)
    assert (path, oct(path.stat().st_mode & 0o777)) == (tmp_path / "team-a.yaml", "0o600")
    assert store.resolver()("team-a", "hf") == {"token": "hf_abc"}
    assert store.resolver()("team-b", "hf") is None
    assert store.resolver()("../team-a", "hf") is None
    path.chmod(0o644)
    with pytest.raises(PodSpecError) as err:
        store.resolver()("team-a", "hf")
    assert err.value.reason == "CreateContainerConfigError"
    assert err.value.message == f"secrets file {path} is readable by others (mode 644): run `chmod 600 {path}`"


def test_seal_round_trips_and_redacts() -> None:
    doc = {"env": {"T": "s3cr3t-value", "URL": "https://u:s3cr3t-value@host"}, "command": ["echo", "s3cr3t-value"]}
    sealed = seal(doc, ["s3cr3t-value"])
    assert "s3cr3t-value" not in json.dumps(sealed)
    assert unseal(sealed, ["s3cr3t-value"]) == doc
    assert redactor(["s3cr3t-value", "ab"])(b"token=s3cr3t-value ab") == b"token=[REDACTED] ab"


def test_a_secret_cut_across_two_partial_records_of_one_long_line_is_still_redacted() -> None:
    secret = "hf_" + "x" * 29 + "END"
    line = b"a" * (MAX_LINE - 10) + secret.encode() + b" tail\n"  # the cut falls inside the value
    out = io.BytesIO()
    _pump(io.BytesIO(line + b"next " + secret.encode() + b"\n"), out, redactor([secret]))
    records = out.getvalue().decode().splitlines()
    assert secret not in out.getvalue().decode()
    flags_and_text = [(r.split(" ", 3)[2], r.split(" ", 3)[3]) for r in records]
    assert "".join(t for _, t in flags_and_text[:-1]) == "a" * (MAX_LINE - 10) + "[REDACTED] tail"
    assert [f for f, _ in flags_and_text] == ["P", "F", "F"]
    assert flags_and_text[-1] == ("F", "next [REDACTED]")


def test_the_bus_server_does_not_inherit_tau_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAU_SECRET_HF_TOKEN", "leaked-if-seen")
    proc, _port = natsserver.start(tmp_path / "nats", log_file=tmp_path / "nats.log")
    try:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert b"leaked-if-seen" not in environ and b"TAU_SECRET_" not in environ
        assert b"PATH=" in environ
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert natsserver.without_secrets({"TAU_SECRET_A_B": "x", "TAU_DATA_DIR": "/d"}) == {"TAU_DATA_DIR": "/d"}


def _pod(root: Path, name: str, run_id: str, *, done: bool) -> Path:
    d = root / name
    (d / "work").mkdir(parents=True)
    (d / "pod.json").write_text(json.dumps({"metadata": {"name": name, "labels": {"taugrid.io/run-id": run_id}}}))
    (d / "state.json").write_text(json.dumps({"done": done}))
    return d


def test_only_the_runs_finished_pod_directories_are_removed(tmp_path: Path) -> None:
    _pod(tmp_path, "r-1-a1-pod", "r-1", done=True)
    _pod(tmp_path, "r-1-a2-pod", "r-1", done=False)  # still stopping
    _pod(tmp_path, "r-1-x-a1-pod", "r-1-x", done=True)  # another run whose id extends this one
    assert remove_finished_pods(tmp_path, "r-1") == ["r-1-a1-pod"]
    assert sorted(os.listdir(tmp_path)) == ["r-1-a2-pod", "r-1-x-a1-pod"]


def test_the_backend_port_releases_a_sealed_runs_pods_on_the_embedded_stack_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evidence service asks the port (``backend.release_sealed``), not the local backend: with
    ``TAU_DATA_DIR`` (the embedded stack) the run's finished pod directories go; without it nothing is touched."""
    _pod(tmp_path / "pods", "r-1-a1-pod", "r-1", done=True)
    monkeypatch.delenv("TAU_DATA_DIR", raising=False)
    assert backend.release_sealed("r-1") == [] and (tmp_path / "pods" / "r-1-a1-pod").exists()
    monkeypatch.setenv("TAU_DATA_DIR", str(tmp_path))
    assert backend.release_sealed("r-1") == ["r-1-a1-pod"]
    assert os.listdir(tmp_path / "pods") == []
