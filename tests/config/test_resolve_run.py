"""resolve_run: the platform wins and fails closed; every rejection reason comes back at once."""

from pathlib import Path

import pytest

from taugrid.config.machine import default_platform
from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import TauConfig, config_hash, load_tau_config
from taugrid.core.contracts import ResolvedRun, decode, encode
from taugrid.core.errors import ConfigError

SAMPLE = load_platform((Path(__file__).resolve().parents[2] / "deploy" / "platform.yaml").read_text())
IMAGE = "mcr.microsoft.com/aks/ai-runtime/ray:py3.12"


def resolve(text: str, platform=SAMPLE, workspace: str | None = None) -> ResolvedRun:
    cfg = load_tau_config(text)
    return resolve_run(
        cfg,
        platform,
        run_id="train-0a1b2c",
        submission_id="sub-1",
        workspace=workspace,
        platform_revision=7,
        config_hash=config_hash(cfg),
        source_object="src/abc",
        source_digest="sha256:abc",
        user="ada",
    )


def rejected(text: str, platform=SAMPLE, workspace: str | None = None) -> dict[str, dict]:
    with pytest.raises(ConfigError) as info:
        resolve(text, platform, workspace)
    return {str(i["field"]): i for i in info.value.issues}


def test_defaults_on_a_cpu_machine():
    run = resolve(
        "name: train\nentrypoint: train.py\nargs: [--lr, '0.1']\n",
        default_platform(4, 16 << 30, [], output_root="/runs"),
    )
    assert (run.workspace, run.namespace, run.local_queue, run.cluster_queue) == ("default",) * 3 + ("local",)
    assert (run.priority_class, run.priority, run.preemptible) == ("normal", 100, True)
    assert run.profile == "cpu-small" and (run.resources.cpu, run.resources.memory, run.resources.gpu) == (
        1,
        1 << 30,
        0,
    )
    assert run.command == ["python3", "train.py", "--lr", "0.1"] and run.launcher == "python"
    assert (
        run.output_dir == "/runs/default/train-0a1b2c"
        and run.checkpoint_dir == run.output_dir + "/checkpoints"
    )
    assert run.resilience.checkpoint_path == run.checkpoint_dir and run.resilience.max_retries == 0
    assert (run.platform_revision, run.source_digest, run.image) == (7, "sha256:abc", "")
    assert decode(encode(run), ResolvedRun) == run


def test_profile_supplies_resources_and_placement():
    run = resolve(
        f"name: train\nentrypoint: train.py\nimage: {IMAGE}\npolicy: {{workspace: vision, profile: a100-1}}\n"
    )
    assert (run.resources.cpu, run.resources.memory, run.resources.gpu) == (16, 64 << 30, 1)
    assert run.node_selector == {"taugrid.io/gpu-class": "a100-80gb"}
    assert run.tolerations == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert run.active_deadline_s == 72 * 3600  # the workspace cap is the default deadline


def test_explicit_requests_beat_the_profile():
    run = resolve(
        f"name: t\nentrypoint: t.py\nimage: {IMAGE}\ncompute: {{cpu_request: 500m, memory_request: 2Gi, "
        "gpus: 0, memory_limit: 4Gi}\npolicy: {workspace: language}\n"
    )
    assert (run.resources.cpu, run.resources.memory, run.resources.gpu) == (0.5, 2 << 30, 0)
    assert run.limits is not None and run.limits.memory == 4 << 30 and run.limits.cpu == 0.5


def test_priority_from_tier_class_or_workspace_default():
    base = f"name: t\nentrypoint: t.py\nimage: {IMAGE}\npolicy: {{workspace: vision, "
    assert resolve(base + "priority_tier: high}\n").priority == 200
    run = resolve(base + "workload_priority_class: critical, preemptible: false}\n")
    assert (run.priority_class, run.priority, run.preemptible) == ("critical", 1000, False)
    assert resolve(base + "priority_tier: default}\n").priority_class == "normal"
    found = rejected(base + "preemptible: false}\n")
    assert "critical" in found["policy.preemptible"]["fix"]


def test_fractional_gpu_from_the_run_or_a_profile():
    run = resolve(
        f"name: t\nentrypoint: t.py\nimage: {IMAGE}\ncompute: {{gpu_fraction: 0.25}}\n"
        "policy: {workspace: vision}\n"
    )
    assert (run.resources.gpu, run.resources.gpu_fraction) == (0, 0.25)
    run = resolve(
        f"name: t\nentrypoint: t.py\nimage: {IMAGE}\npolicy: {{workspace: vision, profile: a100-half}}\n"
    )
    assert (run.resources.gpu, run.resources.gpu_fraction, run.resources.cpu) == (0, 0.5, 8)
    run = resolve(
        "name: t\nentrypoint: t.py\ncompute: {gpu_memory: 20Gi}\n",
        default_platform(8, 64 << 30, ["NVIDIA H200"]),
    )
    assert run.resources.gpu_memory_mb == 20 * 1024


def test_every_rejection_reason_comes_back_at_once():
    found = rejected(
        "name: t\nentrypoint: t.py\nimage: docker.io/me/x:1\ncompute: {gpus: 20}\n"
        "policy: {workspace: vision, profile: a100-8, queue: other, namespace: prod, "
        "priority_tier: urgent}\n"
        "resilience: {max_retries: 9}\nrun: {active_deadline: 100h}\nstorage: {output: /tmp/out}\n"
    )
    assert set(found) >= {
        "image",
        "compute.gpus",
        "policy.queue",
        "policy.namespace",
        "policy.priority_tier",
        "resilience.max_retries",
        "run.active_deadline",
        "storage.output",
    }
    assert found["compute.gpus"]["line"] == 4 and "16" in found["compute.gpus"]["message"]
    assert "vision-queue" in found["policy.queue"]["fix"]


def test_unknown_workspace_lists_the_known_ones():
    found = rejected("name: t\nentrypoint: t.py\npolicy: {workspace: robotics}\n")
    assert (
        "language, vision" in found["policy.workspace"]["message"] and found["policy.workspace"]["line"] == 3
    )
    found = rejected("name: t\nentrypoint: t.py\n", workspace="robotics")
    assert found["policy.workspace"]["line"] is None


def test_image_rules():
    assert "runtime.image" in rejected("name: t\nentrypoint: t.py\npolicy: {workspace: vision}\n")
    assert (
        resolve(
            "name: t\nentrypoint: t.py\nruntime: {image: nvcr.io/nvidia/pytorch:24.05-py3}\n"
            "policy: {workspace: vision}\n"
        ).image
        == "nvcr.io/nvidia/pytorch:24.05-py3"
    )


def test_a_source_image_job_runs_in_its_source_image_at_its_path():
    code = "registry.example/code@sha256:" + "1f" * 32
    box = default_platform(4, 16 << 30, [])
    run = resolve(f"name: t\nentrypoint: t.py\nrun: {{source: {{image: '{code}', path: /opt/p}}}}\n", box)
    assert (run.image, run.source_image, run.source_path) == (code, code, "/opt/p")
    found = rejected(f"name: t\nentrypoint: t.py\nimage: other:1\nrun: {{source: {{image: '{code}'}}}}\n", box)
    assert found["image"]["message"] == (
        f"a source-image job runs in run.source.image ({code!r}), not 'other:1'"
    )


def test_profile_must_be_allowed_in_the_workspace():
    found = rejected(
        f"name: t\nentrypoint: t.py\nimage: {IMAGE}\npolicy: {{workspace: language, profile: a100-half}}\n"
    )
    assert "not allowed" in found["policy.profile"]["message"]


def test_requests_larger_than_the_machine_are_refused():
    found = rejected(
        "name: t\nentrypoint: t.py\ncompute: {cpu_request: 64, gpus: 2}\n",
        default_platform(8, 32 << 30, ["NVIDIA H200"]),
    )
    assert {"compute.cpu_request", "compute.gpus"} <= set(found)


def test_torchrun_and_command_launchers():
    gpu_box = default_platform(32, 256 << 30, ["NVIDIA H200"] * 4)
    run = resolve(
        "name: t\nentrypoint: train.py\nargs: [--x]\ncompute: {gpus: 4}\nexecution: {launcher: torchrun}\n",
        gpu_box,
    )
    assert run.command == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        "train.py",
        "--x",
    ]
    assert run.processes_per_node == 4
    run = resolve("name: t\nentrypoint: ./run.sh\nargs: [a b]\n", gpu_box)
    assert (run.launcher, run.command) == ("command", ["./run.sh", "a b"])
    run = resolve("name: t\nentrypoint: echo hi\n", gpu_box)
    assert run.command == ["sh", "-c", "echo hi"]


def test_ray_runs_use_workers_and_a_python_entrypoint():
    run = resolve(
        "name: t\nentrypoint: train.py\ncompute: {workers: 2, gpus_per_worker: 1, worker_cpu_request: 4}\n",
        default_platform(32, 256 << 30, ["NVIDIA H200"] * 4),
    )
    assert (run.engine, run.launcher, run.workers, run.gpus_per_worker) == ("ray", "ray-train", 2, 1)
    assert run.command == ["python", "train.py"] and run.resources.cpu == 4


def test_a_config_built_in_code_gets_the_same_checks():
    with pytest.raises(ConfigError) as info:
        resolve_run(
            TauConfig(),
            SAMPLE,
            run_id="r",
            submission_id="s",
            workspace="vision",
            platform_revision=1,
            config_hash="",
        )
    assert {"name", "entrypoint"} <= {i["field"] for i in info.value.issues}


def test_a_namespace_alone_resolves_its_workspace():
    run = resolve(f"name: t\nentrypoint: t.py\nimage: {IMAGE}\n"
                  "policy: {namespace: team-language, queue: language-queue}\n")
    assert (run.workspace, run.namespace, run.local_queue) == ("language", "team-language", "language-queue")


def test_a_namespace_that_contradicts_the_workspace_names_both():
    found = rejected("name: t\nentrypoint: t.py\npolicy: {workspace: vision, namespace: team-language}\n")
    assert (found["policy.namespace"]["message"], found["policy.namespace"]["fix"]) == (
        "workspace 'vision' runs in namespace 'team-vision', not 'team-language'",
        "remove policy.namespace (the workspace decides it), or name the workspace of that namespace")


def test_a_namespace_of_several_workspaces_asks_which():
    shared = SAMPLE.model_copy(update={"workspaces": [
        SAMPLE.workspaces[0], SAMPLE.workspaces[1].model_copy(update={"namespace": "team-vision"})]})
    found = rejected("name: t\nentrypoint: t.py\npolicy: {namespace: team-vision}\n", platform=shared)
    assert (found["policy.namespace"]["message"], found["policy.namespace"]["fix"]) == (
        "namespace 'team-vision' holds workspaces language, vision", "set policy.workspace to the one this run "
        "belongs to")


DEPARTMENTS = load_platform("""
resource_flavors: [{name: default}]
departments:
  - name: research
    deserved: {nvidia.com/gpu: 2}
    limit: {nvidia.com/gpu: 6}
    projects:
      - {name: vision, deserved: {nvidia.com/gpu: 1}, limit: {nvidia.com/gpu: 4}}
local_queues: [{name: q, namespace: team-vision, cluster_queue: vision}]
workspaces: [{name: vision, namespace: team-vision, local_queue: q}]
""")


def test_a_kai_project_may_ask_beyond_its_deserved_quota_up_to_its_limit():
    run = resolve("name: t\nentrypoint: t.py\ncompute: {gpus: 4, cpu_request: 8}\n", DEPARTMENTS, "vision")
    assert run.cluster_queue == "vision" and run.labels == {"kai.scheduler/queue": "vision"}
    found = rejected("name: t\nentrypoint: t.py\ncompute: {gpus: 5}\n", DEPARTMENTS, "vision")
    assert found["compute.gpus"]["message"] == ("asks for 5 nvidia.com/gpu in total; project 'vision' (department "
                                                "'research') has a limit and can never hold more than 4, so the "
                                                "run would never start")
