"""TauGrid's own example shapes (reference ``taugrid.md`` §1.5–1.6 and the skill's worked examples: CPU eval
Job, 1-GPU Job with secrets, 2×8 torchrun Job, Ray Train 2×8, Ray Tune, source-image Job, metrics Job), under
a platform that defines what they name (``deploy/platform.yaml``), resolve, render to manifests that validate,
and carry the source fetch on every pod — except the source-image Job, whose code is in its image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import config_hash, load_tau_config
from taugrid.render import render, validate
from taugrid.sources.archive import source_object

PLATFORM = load_platform((Path(__file__).resolve().parents[2] / "deploy" / "platform.yaml").read_text())
DIGEST = "sha256:" + "c0" * 32
RAY_IMAGE = "mcr.microsoft.com/aks/ai-runtime/ray:py3.12-ray2.56.0-cuda13.0"
PYTORCH = "nvcr.io/nvidia/pytorch:24.05-py3"

EXAMPLES = {
    "cpu_eval_job": f"""
name: eval
entrypoint: eval.py
runtime: {{image: "{PYTORCH}"}}
compute: {{gpus: 0, cpu_request: "4", memory_request: 16Gi}}
policy: {{workspace: vision, profile: cpu-small}}
""",
    "gpu_job_with_secrets": f"""
name: finetune
entrypoint: train.py
runtime:
  image: "{PYTORCH}"
  env: {{LOG_LEVEL: info}}
  env_secret: {{HF_TOKEN: "hf-credentials:token"}}
compute: {{gpus: 1}}
policy: {{workspace: vision, profile: a100-1}}
""",
    "torchrun_2x8": f"""
name: pretrain
entrypoint: train.py
runtime: {{image: "{PYTORCH}", working_dir: /workspace}}
compute: {{gpus: 8}}
execution: {{launcher: torchrun, nodes: 2, processes_per_node: 8}}
policy: {{workspace: vision, profile: a100-8}}
""",
    "ray_train_2x8": f"""
name: ray-train
engine: rayjob
entrypoint: train_ray.py
run: {{working_dir: ., working_dir_excludes: [".venv", "data"]}}
runtime: {{image: "{RAY_IMAGE}", pip: ["torch>=2.4.0"]}}
compute: {{workers: 2, gpus_per_worker: 8}}
execution: {{launcher: ray-train}}
policy: {{workspace: vision, profile: a100-8}}
""",
    "ray_tune": f"""
name: tune
engine: rayjob
entrypoint: tune.py
runtime: {{image: "{RAY_IMAGE}"}}
compute: {{workers: 2, gpus_per_worker: 1}}
execution: {{launcher: ray-tune, metric: loss, mode: min, num_samples: 8, configs: {{lr: [0.001, 0.01]}}}}
policy: {{workspace: vision, profile: a100-1}}
""",
    "source_image_job": f"""
name: from-image
entrypoint: bin/train.py
run: {{source: {{image: "registry.example.com/vision/train@sha256:{'ab' * 32}", path: /opt/project}}}}
compute: {{gpus: 1}}
policy: {{workspace: vision, profile: a100-1}}
""",
    "metrics_job": f"""
name: metrics
entrypoint: train.py
runtime: {{image: "{PYTORCH}"}}
compute: {{gpus: 1}}
metrics: {{history: ["metrics/*.jsonl"]}}
experiment: {{project: research, name: lr-sweep, group: baseline}}
policy: {{workspace: vision, profile: a100-1}}
""",
}


def _pods(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]["spec"]]
    if manifest["kind"] == "RayJob":
        cluster = manifest["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]["spec"]] + [
            g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    return []


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_taugrid_example_renders_valid_manifests_carrying_the_source_fetch(example: str) -> None:
    cfg = load_tau_config(EXAMPLES[example], path=f"{example}/tau.yaml")
    run = resolve_run(cfg, PLATFORM, run_id=f"{cfg.name}-0a1b2c", submission_id="s-1", workspace=None,
                      platform_revision=1, config_hash=config_hash(cfg), source_object=source_object(DIGEST),
                      source_digest=DIGEST)
    manifests = render(run, attempt=1)
    for manifest in manifests:
        validate(manifest)
    pods = [pod for m in manifests for pod in _pods(m)]
    assert len(pods) == (2 if cfg.engine == "ray" else 1)
    for pod in pods:
        if example == "source_image_job":
            assert "initContainers" not in pod
            assert (pod["containers"][0]["image"], pod["containers"][0]["workingDir"]) == (
                run.source_image, "/opt/project")
            continue
        assert [c["name"] for c in pod["initContainers"]] == ["tau-source-fetch"]
        assert {"name": "TAU_SOURCE_OBJECT", "value": source_object(DIGEST)} in pod["initContainers"][0]["env"]
        assert {"name": "tau-source", "emptyDir": {}} in pod["volumes"]
        main = pod["containers"][0]
        assert main["volumeMounts"][0]["name"] == "tau-source"
        assert main["workingDir"] == main["volumeMounts"][0]["mountPath"]
