"""Every supported shape renders to schema-valid manifests that match a reviewed golden file.

Regenerate the goldens with ``UPDATE_GOLDEN=1 pytest tests/render`` and review the diff by eye.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_runs import build_run

from taugrid.core.contracts import Resilience, ResolvedRun, Resources
from taugrid.render import render, to_yaml, validate

GOLDEN = Path(__file__).parent / "golden"
GI = 1 << 30


def _shapes() -> dict[str, ResolvedRun]:
    return {
        "python_cpu": build_run(
            resources=Resources(cpu=2, memory=4 * GI),
            limits=Resources(cpu=4, memory=8 * GI),
            command=["python3", "train.py", "--epochs", "3"],
            args=["--epochs", "3"],
            env={"LOG_LEVEL": "info"},
            working_dir="/workspace",
            output_dir="/data/outputs/train-3f9a1c",
            checkpoint_dir="/data/checkpoints/train-3f9a1c",
            active_deadline_s=3600,
            node_selector={"kubernetes.io/arch": "amd64"},
        ),
        "gpu_1": build_run(
            image="nvcr.io/nvidia/pytorch:24.05-py3",
            resources=Resources(cpu=8, memory=64 * GI, gpu=1),
            priority_class="tau-high",
            resilience=Resilience(max_retries=2, checkpoint_path="/data/checkpoints/train"),
            data_pvc="team-a-data",
            tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        ),
        "torchrun_single_4": build_run(
            launcher="torchrun",
            processes_per_node=4,
            resources=Resources(cpu=16, memory=128 * GI, gpu=4),
            command=[
                "python3",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=4",
                "train.py",
            ],
        ),
        "torchrun_2node": build_run(
            launcher="torchrun",
            nodes=2,
            processes_per_node=8,
            args=["--lr", "3e-4"],
            resources=Resources(cpu=32, memory=256 * GI, gpu=8),
            priority_class="tau-high",
        ),
        "fractional_gpu": build_run(resources=Resources(cpu=2, memory=8 * GI, gpu_fraction=0.5)),
        "restricted": build_run(security_restricted=True, data_pvc="team-a-data"),
        "env_secret": build_run(
            env={"HF_HOME": "/data/hf"},
            env_secret={"HF_TOKEN": "hf-credentials:token", "WANDB_API_KEY": "wandb:api-key"},
        ),
        "rayjob_2x1_pip": build_run(
            run_id="ray-tune-7c21d0",
            name="ray-tune",
            engine="ray",
            launcher="ray-train",
            command=[],
            entrypoint="train_ray.py",
            args=["--trials", "8"],
            workers=2,
            gpus_per_worker=1,
            resources=Resources(cpu=8, memory=32 * GI),
            pip=["torch==2.4.0", "ray[train]==2.46.0"],
            env={"LOG_LEVEL": "info"},
            env_secret={"HF_TOKEN": "hf-credentials:token"},
            priority_class="tau-high",
            active_deadline_s=7200,
        ),
    }


SHAPES = _shapes()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_renders_valid_manifests_matching_golden(shape: str) -> None:
    manifests = render(SHAPES[shape], attempt=1)
    for manifest in manifests:
        validate(manifest)
    text = to_yaml(manifests)
    assert list(yaml.safe_load_all(text)) == manifests
    path = GOLDEN / f"{shape}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden {path.name}; run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(encoding="utf-8")


def _pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]]
    if manifest["kind"] == "RayJob":
        cluster = manifest["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return []


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_object_and_pod_carries_tau_metadata(shape: str) -> None:
    run = SHAPES[shape]
    for manifest in render(run, attempt=3):
        for meta in [manifest["metadata"]] + [t["metadata"] for t in _pod_templates(manifest)]:
            assert meta["labels"]["taugrid.io/managed-by"] == "taugrid"
            assert meta["labels"]["taugrid.io/run-id"] == run.run_id
            assert meta["labels"]["taugrid.io/workspace"] == run.workspace
            assert meta["labels"]["taugrid.io/attempt"] == "3"
            assert meta["annotations"]["taugrid.io/config-hash"] == run.config_hash
            assert meta["annotations"]["taugrid.io/source-digest"] == run.source_digest
            assert meta["annotations"]["taugrid.io/submission-id"] == run.submission_id
        if manifest["kind"] in ("Job", "RayJob"):
            assert manifest["spec"]["suspend"] is True
            assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == run.local_queue
            assert manifest["metadata"]["labels"].get("kueue.x-k8s.io/priority-class") == (
                run.priority_class or None
            )
