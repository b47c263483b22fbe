"""``policy.mode: elastic`` with ``policy.elastic``: each malformed range is refused naming its line, the field and
the fix; a well-formed torchrun or Ray range resolves and renders (a Ray Tune run is refused: it sizes its trials
itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from taugrid.config.elastic import elastic_bounds
from taugrid.config.launch import ELASTIC_MAX_RESTARTS, build_command
from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import TauConfig, load_tau_config
from taugrid.core.errors import ConfigError
from taugrid.render import render, validate

PLATFORM = load_platform((Path(__file__).resolve().parent / "taugrid" / "platform.yaml").read_text())

TORCHRUN = """\
name: grow
engine: job
entrypoint: train.py
policy:
  workspace: default
  mode: elastic
  elastic: {elastic}
execution:
  launcher: torchrun
  nodes: {nodes}
"""


def issues(text: str) -> list[tuple[str, int | None, str, str]]:
    try:
        load_tau_config(text, path="tau.yaml")
    except ConfigError as err:
        return [(str(i["field"]), i.get("line"), str(i["message"]), str(i["fix"])) for i in err.issues]
    return []


def test_a_well_formed_torchrun_range_is_accepted_and_resolved() -> None:
    text = TORCHRUN.format(elastic="{min: 2, max: 4, step: 1, cooldown: 2m}", nodes=3)
    assert issues(text) == []
    run = resolve_run(load_tau_config(text, path="tau.yaml"), PLATFORM, run_id="grow-1", submission_id="s",
                      workspace=None, platform_revision=1, config_hash="h")
    assert (run.nodes, run.elastic_min, run.elastic_max, run.elastic_step, run.elastic_cooldown_s) == (3, 2, 4, 1, 120)
    manifests = render(run, attempt=1)
    for m in manifests:
        validate(m)
    (job,) = [m for m in manifests if m["kind"] == "Job"]
    assert job["metadata"]["annotations"]["taugrid.io/elastic"] == "2:4:1:120"
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (3, 4)
    # a pod joining in a growth reads the rendezvous' MASTER_ADDR of its round: torchrun's shared store is off
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    fixed = resolve_run(load_tau_config(text.replace("mode: elastic", "mode: fixed").replace(
        "  elastic: {min: 2, max: 4, step: 1, cooldown: 2m}\n", ""), path="tau.yaml"), PLATFORM, run_id="grow-1",
        submission_id="s", workspace=None, platform_revision=1, config_hash="h")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in fixed.platform_env


def test_an_elastic_ray_run_is_accepted_and_renders_its_worker_range() -> None:
    ray = """\
name: grow
engine: ray
entrypoint: train.py
policy: {workspace: ray, mode: elastic, elastic: {min: 1, max: 3, cooldown: 0}}
compute: {workers: 2}
"""
    assert issues(ray) == []  # the local cluster runs it as a Ray cluster whose workers resize (local/raycluster.py)
    run = resolve_run(load_tau_config(ray, path="tau.yaml"), PLATFORM, run_id="grow-1", submission_id="s",
                      workspace=None, platform_revision=1, config_hash="h")
    assert (run.workers, run.elastic_min, run.elastic_max) == (2, 1, 3)
    (rayjob,) = [m for m in render(run, attempt=1) if m["kind"] == "RayJob"]
    validate(rayjob)
    assert rayjob["metadata"]["annotations"]["taugrid.io/elastic"] == "1:3:1:0"
    [workers] = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (2, 1, 3)


def test_an_elastic_ray_tune_run_is_refused_with_its_fix() -> None:
    tune = """\
name: grow
engine: ray
entrypoint: train.py
policy: {workspace: ray, mode: elastic, elastic: {min: 1, max: 3}}
compute: {workers: 2}
execution: {launcher: ray-tune, metric: loss, mode: min, configs: {param_space: {lr: [0.1, 0.01]}}}
"""
    assert [(f, line, x) for f, line, _, x in issues(tune) if f == "policy.mode"] == [
        ("policy.mode", 4, "remove policy.mode, or use execution.launcher: ray-train")]


def test_bounds_default_max_to_the_written_size() -> None:
    cfg = TauConfig.model_validate(yaml.safe_load(TORCHRUN.format(elastic="{min: 2}", nodes=3)))
    assert elastic_bounds(cfg) == (2, 3)
    assert cfg.policy.elastic is not None and cfg.policy.elastic.cooldown == 60.0


@pytest.mark.parametrize(("elastic", "nodes", "field", "fix"), [
    ("{min: 5, max: 4}", 4, "policy.elastic.min", "set min to at most 4"),
    ("{min: 2, max: 4}", 5, "execution.nodes", "set execution.nodes between 2 and 4"),
    ("{min: 3}", 3, "policy.elastic", "raise max above min, or set policy.mode: fixed"),
    ("{min: 2, max: 4, step: 3}", 3, "policy.elastic.step", "set step to at most 2"),
])
def test_a_bad_range_is_refused_with_its_fix(elastic: str, nodes: int, field: str, fix: str) -> None:
    found = issues(TORCHRUN.format(elastic=elastic, nodes=nodes))
    assert [(f, x) for f, _, _, x in found] == [(field, fix)]


def test_elastic_without_a_range_or_a_range_without_elastic() -> None:
    no_range = TORCHRUN.replace("  elastic: {elastic}\n", "").format(nodes=2)
    assert [(f, x) for f, _, _, x in issues(no_range)] == [
        ("policy.mode", "add policy.elastic with min (and max, default the written size), e.g. {min: 2, max: 4}")]
    fixed = TORCHRUN.replace("mode: elastic", "mode: fixed").format(elastic="{min: 1, max: 3}", nodes=2)
    assert [(f, line, x) for f, line, _, x in issues(fixed)] == [
        ("policy.elastic", 7, "set policy.mode: elastic, or remove policy.elastic")]


def test_only_resizable_launchers() -> None:
    python = TORCHRUN.replace("launcher: torchrun", "launcher: python").format(elastic="{min: 1, max: 2}", nodes=1)
    assert [(f, x) for f, _, _, x in issues(python)] == [
        ("policy.mode", "set execution.launcher: torchrun, or use engine: ray")]


def test_torchrun_of_an_elastic_run_takes_a_node_range_and_a_c10d_rendezvous() -> None:
    cfg = TauConfig.model_validate(yaml.safe_load(TORCHRUN.format(elastic="{min: 2, max: 4}", nodes=3)))
    launcher, command, nproc = build_command(cfg, 0, lambda *a: None)
    assert (launcher, nproc) == ("torchrun", 1)
    assert command == ["python3", "-m", "torch.distributed.run", "--nnodes=2:4", "--nproc_per_node=1",
                       f"--max-restarts={ELASTIC_MAX_RESTARTS}", "--rdzv_backend=c10d",
                       "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)", "train.py"]
