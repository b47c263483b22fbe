"""TauGrid's own configs (ported under tests/config/taugrid/, each naming its source file) read as TauGrid reads
them: every config TauGrid's parser accepts is accepted, with exactly TauGrid's unknown-key warnings (and its
did-you-mean), every one it rejects is rejected naming the field; each shipped example resolves under a platform
that defines what it names (``taugrid/platform.yaml``) and renders manifests that validate, and ``tau run FILE
--dry-run --platform FILE`` prints them with no stack."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from taugrid.config.platform import load_platform
from taugrid.config.project import project_root
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import config_hash, load_tau_config
from taugrid.config.taurules import entrypoint_escape
from taugrid.core.errors import ConfigError
from taugrid.render import render, validate

HERE = Path(__file__).resolve().parent / "taugrid"
REPO = Path(__file__).resolve().parents[2]
PARSER = sorted((HERE / "parser").glob("*.yaml"))
EXAMPLES = sorted(p for p in (HERE / "examples").rglob("*.yaml"))
PLATFORM = load_platform((HERE / "platform.yaml").read_text())

# Parser configs TauGrid accepts that name what this test platform does not define (TauGrid refuses them too on
# a cluster without it): the field the refusal names.
REFUSED_AT_RESOLVE = {
    "managed_pass_through.yaml": "policy.namespace",  # namespace 'research': no workspace runs there
    "unknown_known_keys.yaml": "policy.profile",  # profile 'research-training'
}


def _header(path: Path) -> dict[str, str]:
    """The ``# key: value`` lines at the top of a ported file (source, taugrid, warns)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].strip().partition(":")
        if sep and key in ("source", "taugrid", "warns"):
            out[key] = value.strip()
    return out


def _unknown(cfg: object) -> list[str]:
    """TauGrid-style rendering of the unknown-key warnings: ``path`` or ``path -> suggestion``."""
    out = []
    for w in cfg.warnings:  # type: ignore[attr-defined]
        if w.get("kind") != "unknown":
            continue
        message = str(w["message"])
        hint = message.split("did you mean '")[1].rstrip("'?") if "did you mean" in message else ""
        out.append(f"{w['field']} -> {hint}" if hint else str(w["field"]))
    return out


def test_every_ported_file_names_its_source() -> None:
    assert len(PARSER) >= 50 and len(EXAMPLES) >= 11
    for path in [*PARSER, *EXAMPLES]:
        text = path.read_text()
        assert "Azure/taugrid" in text.splitlines()[0], path


@pytest.mark.parametrize("path", PARSER, ids=lambda p: p.stem)
def test_parser_config_is_read_as_taugrid_reads_it(path: Path) -> None:
    header = _header(path)
    verdict, _, field = header["taugrid"].partition(" ")
    if verdict == "rejects":
        with pytest.raises(ConfigError) as info:
            load_tau_config(path.read_text(), path=path.name)
        assert field in [i["field"] for i in info.value.issues], info.value
        return
    assert verdict == "accepts"
    cfg = load_tau_config(path.read_text(), path=path.name)
    expected = [w.strip() for w in header.get("warns", "").split(",") if w.strip()]
    assert _unknown(cfg) == expected


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(HERE / "examples")))
def test_shipped_example_loads_without_warning_and_renders_valid_manifests(path: Path) -> None:
    name = str(path.relative_to(HERE / "examples"))
    cfg = load_tau_config(path.read_text(), path=name)
    assert _unknown(cfg) == []  # TauGrid's TestShippedExampleConfigsWarnNothing
    subdir = path.parent.name if entrypoint_escape(cfg) == 1 else ""  # the client ships examples/ then
    kw = dict(run_id=f"{cfg.name}-0a1b2c", submission_id="s-1", workspace=None, platform_revision=1,
              config_hash=config_hash(cfg), project_subdir=subdir)
    run = resolve_run(cfg, PLATFORM, **kw)  # type: ignore[arg-type]
    manifests = render(run, attempt=1)
    for manifest in manifests:
        validate(manifest)
    assert [m["kind"] for m in manifests] == (["RayJob"] if cfg.engine == "ray" else ["Job"])


def _resolve(cfg: object, **kw: object) -> object:
    args: dict[str, object] = dict(run_id="r-0a1b2c", submission_id="s-1", workspace=None, platform_revision=1,
                                   config_hash="h")
    return resolve_run(cfg, PLATFORM, **{**args, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("path", [p for p in PARSER if _header(p)["taugrid"] == "accepts"], ids=lambda p: p.stem)
def test_every_accepted_parser_config_resolves(path: Path) -> None:
    """Issue 23 item 7: TauGrid's /data/... outputs and checkpoints are no reason to refuse a config; the only
    refusals left name what the test platform lacks."""
    cfg = load_tau_config(path.read_text(), path=path.name)
    if path.name in REFUSED_AT_RESOLVE:
        with pytest.raises(ConfigError) as info:
            _resolve(cfg)
        assert [i["field"] for i in info.value.issues] == [REFUSED_AT_RESOLVE[path.name]]
        return
    _resolve(cfg)


def test_a_taugrid_data_path_is_read_inside_the_workspaces_own_directory() -> None:
    """/data/<x> outside the output root is <output root>/<workspace>/<x>; one already under the workspace's
    directory is kept; a checkpoint path follows the same rule and reaches the run as TAU_RESUME_FROM."""
    market = load_tau_config((HERE / "examples/market-policy/tau.yaml").read_text())
    assert market.storage.output == "/data/market-policy"
    assert _resolve(market).output_dir == "/data/tau-workspaces/default/market-policy"  # type: ignore[attr-defined]
    stellar = load_tau_config((HERE / "examples/portal-ray-stellar/tau.yaml").read_text())
    assert _resolve(stellar).output_dir == "/data/tau-workspaces/default/portal-ray-stellar"  # type: ignore[attr-defined]
    cfg = load_tau_config("name: t\nentrypoint: t.py\nresilience: {checkpoint_path: /data/checkpoints/ray-train}\n"
                          "storage: {output: /data/checkpoints/../runs/x}\n")
    run = _resolve(cfg, workspace="ray")
    assert (run.output_dir, run.resilience.checkpoint_path) == (  # type: ignore[attr-defined]
        "/data/projects/ray/runs/x", "/data/projects/ray/checkpoints/ray-train")


@pytest.mark.parametrize("path", ["/data/tau-workspaces/ray/x", "/data/tau-workspaces/default/../ray/x",
                                  "/data/tau-workspaces", "/data", "/data/../etc/x", "/etc/x", "checkpoints/x"])
def test_a_path_that_leaves_the_workspace_is_still_refused_with_line_and_fix(path: str) -> None:
    text = f"name: t\nentrypoint: t.py\nstorage:\n  output: {path}\n"
    cfg = load_tau_config(text, path="tau.yaml")
    with pytest.raises(ConfigError) as info:
        _resolve(cfg)
    [issue] = info.value.issues
    base = "/data/tau-workspaces/default"
    assert (issue["field"], issue["line"], issue["message"]) == (
        "storage.output", 4, f"{path!r} is outside {base}/, the output directory of workspace 'default'")
    assert f"/data/<name> (read as {base}/<name>)" in str(issue["fix"])


def test_managed_quickstarts_map_onto_the_resolved_run() -> None:
    """AKS GPU quickstart: workers 1 = one GPU pod doing the work (taugrid's CPU-only head beside it), 16 CPUs
    and 64Gi on it, the env list as env; the CPU demo: workers 5 = 1 head (cpus/memory) + 4 workers
    (worker_cpus/worker_memory)."""
    kw = dict(submission_id="s", workspace=None, platform_revision=1, config_hash="h")
    gpu = load_tau_config((HERE / "examples/aks-gpu-quickstart/tau.yaml").read_text())
    run = resolve_run(gpu, PLATFORM, run_id="gpu-1", **kw)  # type: ignore[arg-type]
    assert (run.engine, run.workers, run.gpus_per_worker, run.resources.cpu, run.resources.memory,
            run.head_resources, run.env) == ("ray", 1, 1, 16.0, 64 << 30, None,
                                              {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"})
    cpu = load_tau_config((HERE / "examples/cpu-multi-interest-ray/tau.yaml").read_text())
    run = resolve_run(cpu, PLATFORM, run_id="cpu-1", **kw)  # type: ignore[arg-type]
    assert run.head_resources is not None
    assert (run.workers, run.gpus_per_worker, run.resources.cpu, run.resources.memory, run.head_resources.cpu,
            run.head_resources.memory) == (4, 0, 2.0, 4 << 30, 1.0, 2 << 30)
    head = render(run, attempt=1)[0]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    # a multi-pod GPU manifest keeps TauGrid's GPUs: 2 pods x 8 GPUs = 2 GPU workers beside the CPU-only head
    multi = load_tau_config((HERE / "parser/unknown_known_keys.yaml").read_text())
    assert (multi.compute.workers, multi.compute.gpus_per_worker, multi.compute.head_cpu_request) == (2, 8, None)


def test_managed_job_with_several_gpus_runs_torchrun_and_mounts_camel_case_pvcs() -> None:
    cfg = load_tau_config(
        "schema_version: 1\nname: ft\nrun: {entrypoint: train.py, workload_kind: job}\n"
        "compute: {gpus: 4, cpus: 8, memory: 32Gi}\n"
        "storage: {mounts: [{name: cache, pvc: model-cache, mountPath: /models, readOnly: true}]}\n")
    run = resolve_run(cfg, PLATFORM, run_id="ft-1", submission_id="s", workspace=None, platform_revision=1,
                      config_hash="h")
    assert (run.engine, run.launcher, run.processes_per_node, run.resources.gpu, run.resources.cpu) == (
        "job", "torchrun", 4, 4, 8.0)
    pod = render(run, attempt=1)[0]["spec"]["template"]["spec"]
    assert {"name": "pvc-cache", "persistentVolumeClaim": {"claimName": "model-cache", "readOnly": True}} in (
        pod["volumes"])
    assert {"name": "pvc-cache", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def _tau(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taugrid.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "TAU_NATS_URL": "nats://127.0.0.1:1"})


def test_dry_run_of_a_managed_quickstart_prints_valid_manifests_offline() -> None:
    proc = _tau("run", str(HERE / "examples/aks-gpu-quickstart/tau.yaml"), "--dry-run", "--platform",
                str(HERE / "platform.yaml"))
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["kind"] for d in docs] == ["RayJob"]
    validate(docs[0])


def test_a_managed_script_beside_the_folder_ships_the_folder_holding_both(tmp_path: Path) -> None:
    """The AKS CPU quickstart runs ../cpu-multi-interest-ray/train.py: the snapshot is the folder holding both
    (inside the repository), the Ray entrypoint starts in aks-cpu-quickstart within it; outside a repository,
    or past its top, the client refuses."""
    repo = tmp_path / "repo"
    for folder in ("aks-cpu-quickstart", "cpu-multi-interest-ray"):
        shutil.copytree(HERE / "examples" / folder, repo / "examples" / folder)
    path = repo / "examples/aks-cpu-quickstart/tau.yaml"
    cfg = load_tau_config(path.read_text(), path=str(path))
    with pytest.raises(ConfigError) as outside:
        project_root(cfg, path.parent)
    assert [i["field"] for i in outside.value.issues] == ["run.entrypoint"]
    (repo / "examples/cpu-multi-interest-ray/train.py").write_text("print('trained')\n")
    checked = _tau("run", "validate", str(path), "--offline", "--output", "json")
    assert [i["field"] for i in yaml.safe_load(checked.stdout)["issues"]] == ["run.entrypoint"]  # as tau run does
    (repo / ".git").mkdir()
    assert project_root(cfg, path.parent) == (repo / "examples", "aks-cpu-quickstart")
    # `tau run validate` ships (in thought) the same folder: the script is inside it; only what this machine's
    # default platform cannot hold (8 CPUs on a smaller machine) may still be refused, never the entrypoint
    checked = _tau("run", "validate", str(path), "--offline", "--output", "json")
    assert "entrypoint" not in [i["field"] for i in yaml.safe_load(checked.stdout).get("issues", [])], checked.stdout
    proc = _tau("run", str(path), "--dry-run", "--platform", str(HERE / "platform.yaml"))
    assert proc.returncode == 0, proc.stderr
    [rayjob] = list(yaml.safe_load_all(proc.stdout))
    validate(rayjob)
    assert rayjob["spec"]["entrypoint"] == 'cd "${TAU_SOURCE_DIR:-.}" && python ../cpu-multi-interest-ray/train.py'
    env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["TAU_SOURCE_DIR"] == "/tau/source/aks-cpu-quickstart"
    # the policy service sees the config's folder in config_path; without it the script is outside the snapshot
    with pytest.raises(ConfigError) as info:
        resolve_run(cfg, PLATFORM, run_id="q-1", submission_id="s", workspace=None, platform_revision=1,
                    config_hash="h")
    assert [i["field"] for i in info.value.issues] == ["entrypoint"]


def test_validate_prints_the_warnings_and_strict_refuses_them(tmp_path: Path) -> None:
    (tmp_path / "tau.yaml").write_text("schema_version: 1\nname: typo\nrun: {entrypoint: train.py}\n"
                                       "scheduling: {node_selector: {a: b}}\n")
    (tmp_path / "train.py").write_text("print('ok')\n")
    lenient = _tau("run", "validate", str(tmp_path), "--output", "json", "--offline")
    assert lenient.returncode == 0, lenient.stderr
    report = yaml.safe_load(lenient.stdout)
    assert (report["valid"], report["managed"], [w["field"] for w in report["warning_issues"]]) == (
        True, True, ["scheduling"])
    assert "did you mean 'policy'?" in report["warnings"][0]
    text = _tau("run", "validate", str(tmp_path), "--offline")
    assert "warning: " in text.stderr and "unknown config key 'scheduling'" in text.stderr
    strict = _tau("run", "validate", str(tmp_path), "--strict", "--output", "json", "--offline")
    assert strict.returncode == 2
    assert [i["field"] for i in yaml.safe_load(strict.stdout)["issues"]] == ["scheduling"]


def test_validate_takes_the_workspace_its_errors_suggest(tmp_path: Path) -> None:
    """An unknown workspace's fix names --workspace: `tau run validate` has it, as `tau run` does."""
    (tmp_path / "tau.yaml").write_text("schema_version: 1\nname: w\nrun: {entrypoint: train.py}\n")
    (tmp_path / "train.py").write_text("print('ok')\n")
    wrong = _tau("run", "validate", str(tmp_path), "--offline", "--workspace", "nowhere", "--output", "json")
    assert wrong.returncode == 2, wrong.stderr
    [issue] = yaml.safe_load(wrong.stdout)["issues"]
    assert (issue["field"], issue["message"].split(";")[0]) == ("policy.workspace", "unknown workspace 'nowhere'")
    right = _tau("run", "validate", str(tmp_path), "--offline", "-w", "default")
    assert right.returncode == 0, right.stderr
