"""tau.yaml §1.3 rules: reserved env, size limits, engine-specific fields, launcher shape, names."""

import pytest

from taugrid.config.taujob import load_tau_config
from taugrid.core.errors import ConfigError

MINIMAL = "name: train\nentrypoint: train.py\n"


def fields(text: str) -> dict[str, dict]:
    with pytest.raises(ConfigError) as info:
        load_tau_config(text)
    return {str(i["field"]): i for i in info.value.issues}


def test_reserved_env_keys_are_rejected_with_their_lines():
    found = fields(
        MINIMAL + "runtime:\n  env:\n    TAU_RUN: x\n    tau_lower: y\n    MASTER_ADDR: h\n"
        "    NCCL_DEBUG: INFO\n    TAU_RESUME_FROM: /ckpt\n"
    )
    assert set(found) == {
        "runtime.env.TAU_RUN",
        "runtime.env.tau_lower",
        "runtime.env.MASTER_ADDR",
        "runtime.env.NCCL_DEBUG",
    }
    assert found["runtime.env.TAU_RUN"]["line"] == 5 and found["runtime.env.NCCL_DEBUG"]["line"] == 8


def test_nccl_override_is_allowed_when_asked_for():
    cfg = load_tau_config(
        MINIMAL + "runtime: {env: {NCCL_DEBUG: INFO}}\nexecution: {allow_nccl_override: true}\n"
    )
    assert cfg.runtime.env == {"NCCL_DEBUG": "INFO"}


def test_env_secret_keys_and_references_are_checked():
    found = fields(
        MINIMAL + 'runtime: {env_secret: {TAU_X: "s:k", HF: "no-key", OK: "hf-credentials:token"}}\n'
    )
    assert set(found) == {"runtime.env_secret.TAU_X", "runtime.env_secret.HF"}


def test_env_size_limits():
    big = "x" * (65 * 1024)
    found = fields(MINIMAL + f"runtime:\n  env:\n    A: {big}\n")
    assert "64 KiB" in found["runtime.env.A"]["message"]
    mid = "x" * (50 * 1024)
    found = fields(MINIMAL + f"runtime:\n  env:\n    A: {mid}\n    B: {mid}\n    C: {mid}\n")
    assert "128 KiB" in found["runtime.env"]["message"]


def test_engine_specific_fields():
    found = fields(
        MINIMAL + "engine: job\ncompute: {workers: 2, gpus_per_worker: 1}\nruntime: {pip: [torch]}\n"
    )
    assert {"compute.workers", "compute.gpus_per_worker", "runtime.pip"} <= set(found)
    found = fields(MINIMAL + "engine: ray\ncompute: {gpus: 1}\nruntime: {working_dir: /app}\n")
    assert {"compute.gpus", "runtime.working_dir"} <= set(found)
    assert "Job-only" in found["compute.gpus"]["message"]


def test_multi_node_needs_job_and_torchrun():
    assert "execution.nodes" in fields(MINIMAL + "execution: {nodes: 2}\n")
    load_tau_config(MINIMAL + "compute: {gpus: 8}\nexecution: {nodes: 2, launcher: torchrun}\n")


def test_torchrun_needs_a_python_entrypoint_and_enough_gpus():
    found = fields(
        "name: t\nentrypoint: run.sh\ncompute: {gpus: 2}\n"
        "execution: {launcher: torchrun, processes_per_node: 4}\n"
    )
    assert {"entrypoint", "execution.processes_per_node"} <= set(found)


def test_name_and_entrypoint_are_required_and_name_is_dns():
    assert {"name", "entrypoint"} <= set(fields("compute: {gpus: 1}\n"))
    assert "DNS" in fields("name: My_Run\nentrypoint: a.py\n")["name"]["message"]


def test_rayjob_names_are_at_most_47_characters():
    long = "a" * 50
    assert "47" in fields(f"name: {long}\nentrypoint: a.py\nengine: ray\n")["name"]["message"]
    load_tau_config(f"name: {long}\nentrypoint: a.py\n")


def test_gpu_fraction_must_be_a_proper_fraction_of_a_single_gpu():
    assert "compute.gpu_fraction" in fields(MINIMAL + "compute: {gpu_fraction: 1.5}\n")
    assert "compute.gpu_fraction" in fields(MINIMAL + "compute: {gpu_fraction: 0.5, gpus: 2}\n")
    assert "compute.gpu_memory" in fields(MINIMAL + "compute: {gpu_fraction: 0.5, gpu_memory: 20Gi}\n")
    cfg = load_tau_config(MINIMAL + "compute: {gpu_memory: 20Gi, placement: spread, gang: true}\n")
    assert cfg.compute.gpu_memory == "20Gi" and cfg.compute.placement == "spread"


def test_a_partial_gang_is_refused_naming_the_key_and_the_fix():
    found = fields(MINIMAL + "compute: {gpus: 2, gang: false}\n")["compute.gang"]
    assert "a run's pods always start together or not at all" in str(found["message"])
    assert str(found["fix"]).startswith("remove compute.gang")


def test_retry_reasons_are_known_and_suggested():
    found = fields(MINIMAL + "resilience: {retry_on: [Preemted]}\n")
    assert "did you mean 'Preempted'?" in found["resilience.retry_on[0]"]["message"]


def test_all_rule_violations_come_back_together():
    found = fields(
        "name: Bad_Name\nentrypoint: x.sh\nruntime: {env: {TAU_A: b}}\nexecution: {launcher: torchrun}\n"
    )
    assert {"name", "runtime.env.TAU_A", "entrypoint"} <= set(found)


@pytest.mark.parametrize("wd", ["/home/ada/project", "../shared", "src/../../x"])
def test_ray_working_dir_must_stay_inside_the_shipped_project(wd: str) -> None:
    found = fields(MINIMAL + f"engine: ray\nrun: {{working_dir: '{wd}'}}\n")
    assert found["run.working_dir"]["message"] == (
        f"{wd!r} is outside the project directory that is shipped (the config file's directory)"
    )
    assert load_tau_config(MINIMAL + "engine: ray\nrun: {working_dir: src}\n").run.working_dir == "src"
