"""What real Kueue (v0.19.2, ElasticJobsViaWorkloadSlices beta, on by default) and KubeRay need for an elastic run,
rendered and validated against the schemas: the ``kueue.x-k8s.io/elastic-job`` opt-in on the Job or RayJob; a Job
whose ``parallelism`` is the size (Indexed, ``completions`` up to the maximum, done when pod 0 succeeds) running
torchrun's elastic mode (``--nnodes=MIN:MAX``, c10d rendezvous on pod 0, no fixed node rank); Ray workers between
``minReplicas`` and ``maxReplicas`` with KubeRay's in-tree autoscaler."""

from __future__ import annotations

from typing import Any

from render_runs import build_run

from taugrid.config.launch import ELASTIC_MAX_RESTARTS
from taugrid.render import render, validate

ELASTIC = "kueue.x-k8s.io/elastic-job"


def _only(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


def test_an_elastic_torchrun_job_opts_in_to_kueue_slices_and_runs_torchrun_elastic() -> None:
    run = build_run(launcher="torchrun", nodes=3, processes_per_node=2, elastic_min=2, elastic_max=4)
    manifests = render(run, attempt=1)
    for m in manifests:
        validate(m)
    job = _only(manifests, "Job")
    name = job["metadata"]["name"]
    assert job["metadata"]["annotations"][ELASTIC] == "true"
    spec = job["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == ("Indexed", 3, 4)
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command == ["python3", "-m", "torch.distributed.run", "--nnodes=2:4", "--nproc_per_node=2",
                       f"--max-restarts={ELASTIC_MAX_RESTARTS}", "--rdzv_backend=c10d",
                       f"--rdzv_endpoint={name}-0.{name}-headless:29500", f"--rdzv_id={name}", "train.py"]
    assert _only(manifests, "Service")["spec"]["clusterIP"] == "None"


def test_an_elastic_run_starting_on_one_node_still_gets_the_rendezvous_service() -> None:
    manifests = render(build_run(launcher="torchrun", nodes=1, elastic_min=1, elastic_max=2), attempt=1)
    assert sorted(m["kind"] for m in manifests) == ["Job", "Service"]
    assert _only(manifests, "Job")["spec"]["parallelism"] == 1


def test_a_fixed_job_has_no_elastic_opt_in() -> None:
    job = _only(render(build_run(launcher="torchrun", nodes=2), attempt=1), "Job")
    assert ELASTIC not in job["metadata"]["annotations"] and "successPolicy" not in job["spec"]


def test_elastic_ray_workers_autoscale_between_the_bounds() -> None:
    run = build_run(run_id="ray-el", engine="ray", launcher="ray-train", command=[], workers=2, gpus_per_worker=1,
                    elastic_min=1, elastic_max=4)
    (rayjob,) = render(run, attempt=1)
    validate(rayjob)
    assert rayjob["metadata"]["annotations"][ELASTIC] == "true"
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True
    (group,) = cluster["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 1, 4)
