"""Runs on AMD and Gaudi GPUs (issue 26), resolved on a three-vendor platform and rendered, validated against the
Kubernetes, Kueue and KubeRay schemas: the vendor's device-plugin resource in requests and limits (what Kueue
charges), the toleration of its taint, the profile's image; no visibility variable is rendered (each vendor's
device plugin sets its own in the container it allocates)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import config_hash, load_tau_config
from taugrid.core.devices import VISIBILITY_ENV
from taugrid.render import render, validate

FLEET = load_platform((Path(__file__).resolve().parents[1] / "config" / "vendors" / "platform.yaml").read_text())
GAUDI_IMAGE = "vault.habana.ai/gaudi-docker/1.21.0/ubuntu24.04/habanalabs/pytorch-installer-2.6.0:latest"


def manifests(text: str) -> list[dict[str, Any]]:
    cfg = load_tau_config("name: t\nentrypoint: train.py\n" + text)
    run = resolve_run(cfg, FLEET, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                      config_hash=config_hash(cfg))
    out = render(run, attempt=1)
    for m in out:
        validate(m)
    return out


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in objs:
        if m["kind"] == "Job":
            out.append(m["spec"]["template"]["spec"])
        elif m["kind"] == "RayJob":
            cluster = m["spec"]["rayClusterSpec"]
            out += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    return out


@pytest.mark.parametrize(("text", "resource", "count", "image"), [
    ("policy: {workspace: fleet}\ncompute: {gpus: 2, gpu_vendor: amd}\nruntime: {image: 'rocm/pytorch:latest'}\n",
     "amd.com/gpu", "2", "rocm/pytorch:latest"),
    ("policy: {workspace: fleet, profile: gaudi3-8}\nexecution: {launcher: torchrun, nodes: 2}\n",
     "habana.ai/gaudi", "8", GAUDI_IMAGE),
    ("policy: {workspace: fleet}\ncompute: {gpus: 1, gpu_vendor: nvidia}\n", "nvidia.com/gpu", "1", "python:3.11-slim"),
])
def test_a_job_asks_for_its_vendors_resource_and_tolerates_its_taint(text: str, resource: str, count: str,
                                                                     image: str) -> None:
    (pod,) = pod_specs(manifests(text))
    main = pod["containers"][0]
    gpu = {k: v for k, v in main["resources"]["limits"].items() if k not in ("cpu", "memory")}
    assert gpu == {resource: count} and main["resources"]["requests"][resource] == count
    assert main["image"] == image
    assert {"key": resource, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert not [t for t in pod["tolerations"] if t["key"] != resource and t["key"].endswith(("/gpu", "/gaudi"))]
    assert not [e["name"] for e in main.get("env", []) if e["name"] in VISIBILITY_ENV]


def test_a_ray_run_on_amd_gpus_asks_each_worker_for_amd_gpus() -> None:
    objs = manifests("engine: ray\npolicy: {workspace: fleet}\ncompute: {workers: 2, gpus_per_worker: 4, "
                     "gpu_vendor: amd}\nruntime: {image: 'rocm/ray:latest'}\n")
    (rayjob,) = [m for m in objs if m["kind"] == "RayJob"]
    (worker,) = pod_specs(objs)
    main = worker["containers"][0]
    assert (main["resources"]["limits"]["amd.com/gpu"], main["image"]) == ("4", "rocm/ray:latest")
    assert "nvidia.com/gpu" not in main["resources"]["limits"]
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
