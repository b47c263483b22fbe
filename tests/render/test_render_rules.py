"""Renderer rules that goldens alone would not pin down: names, determinism, Kueue pod counts, GPU shapes,
security, rejected inputs, and schema validation (errors listed with paths, speed when warm)."""

from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from packaging.version import Version
from render_runs import build_run

from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.core.errors import PermanentError
from taugrid.render import KUBERNETES_VERSION, manifest_digest, object_name, render, to_yaml, validate
from taugrid.render.crds import CRDS_ENV, crds_dir
from taugrid.render.validate import MIN_KUBERNETES_VERSION, kubernetes_schema_version
from taugrid.render.validate import _clean as remembered

GI = 1 << 30


def _ray(**overrides: Any) -> ResolvedRun:
    fields: dict[str, Any] = {
        "run_id": "ray-7c21d0",
        "engine": "ray",
        "launcher": "ray-train",
        "command": [],
        "workers": 2,
        "gpus_per_worker": 1,
    }
    fields.update(overrides)
    return build_run(**fields)


def _only(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


# ---- names and determinism ----


def test_object_name_is_run_id_and_attempt() -> None:
    assert render(build_run(), attempt=2)[0]["metadata"]["name"] == "train-3f9a1c-a2"


def test_rayjob_name_of_a_long_run_id_fits_47_chars_and_stays_distinct() -> None:
    long_a = "a-very-long-experiment-name-for-sweeping-lr-x-0-3f9a1c"
    long_b = "a-very-long-experiment-name-for-sweeping-lr-x-0-77e0aa"
    name_a = render(_ray(run_id=long_a), attempt=12)[0]["metadata"]["name"]
    name_b = render(_ray(run_id=long_b), attempt=12)[0]["metadata"]["name"]
    assert len(name_a) <= 47 and len(name_b) <= 47
    assert name_a.endswith("-a12") and name_a != name_b
    assert name_a == render(_ray(run_id=long_a), attempt=12)[0]["metadata"]["name"]
    validate(render(_ray(run_id=long_a), attempt=12)[0])


def test_run_id_starting_with_a_digit_gets_a_letter_prefix() -> None:
    assert object_name("7b-finetune-3f9a1c", 0) == "r7b-finetune-3f9a1c-a0"


def test_multi_node_names_leave_room_for_headless_suffix() -> None:
    run = build_run(run_id="x" * 60, launcher="torchrun", nodes=2, processes_per_node=1)
    manifests = render(run, attempt=1)
    for manifest in manifests:
        validate(manifest)
    assert len(_only(manifests, "Service")["metadata"]["name"]) <= 63


def test_same_run_and_attempt_give_identical_manifests_and_digest() -> None:
    for run in (build_run(), build_run(launcher="torchrun", nodes=3), _ray()):
        first, second = render(run, attempt=1), render(run, attempt=1)
        assert first == second
        assert to_yaml(first) == to_yaml(second)
        assert manifest_digest(first) == manifest_digest(second)
        assert manifest_digest(first).startswith("sha256:")
        assert manifest_digest(render(run, attempt=2)) != manifest_digest(first)


# ---- what Kueue will count ----


def test_kueue_counts_one_pod_per_node_for_indexed_job() -> None:
    run = build_run(launcher="torchrun", nodes=4, processes_per_node=8, resources=Resources(gpu=8))
    job = _only(render(run, attempt=0), "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert min(spec["parallelism"], spec["completions"]) == 4
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == f"{job['metadata']['name']}-headless"
    command = pod["containers"][0]["command"]
    assert "--nnodes=4" in command and "--node_rank=$(JOB_COMPLETION_INDEX)" in command
    assert f"--rdzv_endpoint={job['metadata']['name']}-0.{job['metadata']['name']}-headless:29500" in command


def test_headless_service_selects_the_jobs_pods() -> None:
    manifests = render(build_run(launcher="torchrun", nodes=2), attempt=0)
    service, job = _only(manifests, "Service"), _only(manifests, "Job")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert service["spec"]["ports"][0]["port"] == 29500


def test_kueue_counts_head_plus_explicit_worker_replicas_for_rayjob() -> None:
    rayjob = render(_ray(workers=3, gpus_per_worker=2), attempt=0)[0]
    spec = rayjob["spec"]
    assert spec["suspend"] is True and spec["shutdownAfterJobFinishes"] is True
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    assert group["groupName"] != "head"
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    head_resources = head["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in head_resources["requests"]
    worker_resources = group["template"]["spec"]["containers"][0]["resources"]
    assert worker_resources["requests"]["nvidia.com/gpu"] == "2"


def test_ray_cluster_ttl_is_short_even_when_the_run_ttl_is_long() -> None:
    assert (
        render(_ray(ttl_seconds_after_finished=28800), attempt=0)[0]["spec"]["ttlSecondsAfterFinished"] <= 60
    )


def test_ray_runtime_env_never_carries_secret_values() -> None:
    rayjob = render(_ray(env_secret={"HF_TOKEN": "hf:token"}, pip=["numpy"]), attempt=0)[0]
    assert "HF_TOKEN" not in rayjob["spec"]["runtimeEnvYAML"]
    worker = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in worker[
        "env"
    ]


# ---- GPU, env and security shapes ----


def test_fractional_gpu_requests_no_whole_gpu_and_is_annotated() -> None:
    job = render(build_run(resources=Resources(gpu_fraction=0.25)), attempt=0)[0]
    template = job["spec"]["template"]
    requests = template["spec"]["containers"][0]["resources"]["requests"]
    assert "nvidia.com/gpu" not in requests
    assert template["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    assert template["metadata"]["annotations"]["taugrid.io/gpu-fraction"] == "0.25"


def test_gpu_memory_share_uses_gpu_memory_annotation() -> None:
    job = render(build_run(resources=Resources(gpu_memory_mb=2000)), attempt=0)[0]
    assert job["spec"]["template"]["metadata"]["annotations"]["gpu-memory"] == "2000"


def test_cpu_job_gets_no_gpu_toleration() -> None:
    pod = render(build_run(), attempt=0)[0]["spec"]["template"]["spec"]
    assert "tolerations" not in pod


def test_tau_env_overrides_user_env_and_resume_point_is_injected() -> None:
    run = build_run(env={"TAU_RUN_ID": "spoofed", "A": "1"})
    env = render(run, attempt=4, resume_from="/data/ckpt/step-100")[0]["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    values = {e["name"]: e.get("value") for e in env}
    assert values["TAU_RUN_ID"] == run.run_id and values["A"] == "1"
    assert values["TAU_RETRY_ATTEMPT"] == "4"
    assert values["TAU_RESUME_FROM"] == "/data/ckpt/step-100"
    assert [e["name"] for e in env].count("TAU_RUN_ID") == 1


def test_restricted_security_applies_to_every_ray_container() -> None:
    rayjob = render(_ray(security_restricted=True), attempt=0)[0]
    cluster = rayjob["spec"]["rayClusterSpec"]
    for template in [cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]]:
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        sec = template["spec"]["containers"][0]["securityContext"]
        assert sec["allowPrivilegeEscalation"] is False and sec["capabilities"] == {"drop": ["ALL"]}
        assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
    validate(rayjob)


# ---- rejected inputs ----


@pytest.mark.parametrize(
    ("run", "fragment"),
    [
        (build_run(env_secret={"TOKEN": "no-key-here"}), "env_secret.TOKEN"),
        (build_run(local_queue=""), "local queue"),
        (build_run(nodes=2, launcher="python"), "torchrun"),
        (build_run(engine="spark"), "engine"),
        (build_run(engine="ray", workers=0), "workers"),
        (build_run(resources=Resources(gpu_fraction=1.5)), "between 0 and 1"),
    ],
)
def test_bad_runs_are_rejected_permanently_with_the_field_named(run: ResolvedRun, fragment: str) -> None:
    with pytest.raises(PermanentError, match=fragment):
        render(run, attempt=0)


# ---- validation ----


def test_schema_version_is_at_least_1_30() -> None:
    assert Version(KUBERNETES_VERSION) >= Version(MIN_KUBERNETES_VERSION)
    assert tuple(int(p) for p in kubernetes_schema_version().split(".")[:2]) >= (1, 30)


def test_job_with_wrong_type_and_unknown_field_lists_both_paths() -> None:
    job = copy.deepcopy(render(build_run(), attempt=0)[0])
    job["spec"]["backoffLimit"] = "zero"
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(PermanentError) as info:
        validate(job)
    message = str(info.value)
    assert "spec.backoffLimit: 'zero' is not of type" in message
    assert "spec.template.spec.containers[0].imagePullPolicyy: unknown field" in message


def test_rayjob_with_wrong_type_and_unknown_field_lists_both_paths() -> None:
    rayjob = copy.deepcopy(render(_ray(), attempt=0)[0])
    rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2
    with pytest.raises(PermanentError) as info:
        validate(rayjob)
    message = str(info.value)
    assert "spec.rayClusterSpec.headGroupSpec.rayStartParams.num-cpus: 0 is not of type 'string'" in message
    assert "spec.rayClusterSpec.workerGroupSpecs[0].replica: unknown field" in message


def test_invalid_names_and_label_values_are_reported() -> None:
    job = copy.deepcopy(render(build_run(), attempt=0)[0])
    job["metadata"]["name"] = "Train_Job"
    job["metadata"]["labels"]["taugrid.io/workspace"] = "has spaces"
    with pytest.raises(PermanentError) as info:
        validate(job)
    assert "metadata.name: 'Train_Job'" in str(info.value)
    assert "metadata.labels.taugrid.io/workspace" in str(info.value)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(PermanentError, match="no schema for kind Widget"):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


KUEUE_OBJECTS: list[dict[str, Any]] = [
    {"kind": "ResourceFlavor", "metadata": {"name": "a100"}, "spec": {"nodeLabels": {"gpu": "a100"}}},
    {
        "kind": "ClusterQueue",
        "metadata": {"name": "team-a-cq"},
        "spec": {
            "cohortName": "org",
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "a100",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 64},
                                {"name": "memory", "nominalQuota": "512Gi"},
                                {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 0},
                            ],
                        }
                    ],
                }
            ],
        },
    },
    {
        "kind": "LocalQueue",
        "metadata": {"name": "team-a-lq", "namespace": "team-a"},
        "spec": {"clusterQueue": "team-a-cq"},
    },
    {"kind": "Cohort", "metadata": {"name": "org"}, "spec": {}},
    {"kind": "WorkloadPriorityClass", "metadata": {"name": "tau-high"}, "value": 1000},
]


@pytest.mark.parametrize("obj", KUEUE_OBJECTS, ids=[o["kind"] for o in KUEUE_OBJECTS])
def test_kueue_objects_validate_and_reject_unknown_spec_fields(obj: dict[str, Any]) -> None:
    manifest = {"apiVersion": "kueue.x-k8s.io/v1beta2", **copy.deepcopy(obj)}
    validate(manifest)
    manifest["bogusField"] = 1
    with pytest.raises(PermanentError, match="bogusField: unknown field"):
        validate(manifest)


def test_kueue_v1beta1_cohort_field_is_not_in_v1beta2() -> None:
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", **copy.deepcopy(KUEUE_OBJECTS[1])}
    cq["spec"]["cohort"] = cq["spec"].pop("cohortName")
    with pytest.raises(PermanentError, match="spec.cohort: unknown field"):
        validate(cq)


def test_workload_and_raycluster_crds_validate() -> None:
    validate(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "job-train-3f9a1c-a0-1a2b3", "namespace": "team-a"},
            "spec": {
                "queueName": "team-a-lq",
                "podSets": [
                    {
                        "name": "main",
                        "count": 2,
                        "template": {"spec": {"containers": [{"name": "main", "image": "python:3.11-slim"}]}},
                    }
                ],
            },
        }
    )
    cluster = copy.deepcopy(render(_ray(), attempt=0)[0]["spec"]["rayClusterSpec"])
    validate({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": cluster})


def test_crd_directory_can_be_overridden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(crds_dir() / "kueue.x-k8s.io_workloadpriorityclasses.yaml", tmp_path)
    monkeypatch.setenv(CRDS_ENV, str(tmp_path))
    validate(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "p"},
            "value": 1,
        }
    )
    with pytest.raises(PermanentError, match="no schema for kind LocalQueue"):
        validate({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "q"}})


def test_warm_validation_takes_under_50ms() -> None:
    manifests = render(build_run(launcher="torchrun", nodes=2), attempt=0) + render(_ray(), attempt=0)
    for manifest in manifests:
        validate(manifest)  # warm-up: schemas load once
    for manifest in manifests:
        best = min(_timed(manifest) for _ in range(5))
        assert best < 0.050, f"{manifest['kind']} took {best * 1000:.1f} ms"


def _timed(manifest: dict[str, Any]) -> float:
    start = time.perf_counter()
    validate(manifest)
    return time.perf_counter() - start


def test_a_first_attempt_gets_no_resume_point_even_with_a_checkpoint_path() -> None:
    run = build_run()
    run = msgspec.structs.replace(run, resilience=msgspec.structs.replace(run.resilience, checkpoint_path="/ckpt"))
    first = render(run, attempt=1)[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "TAU_RESUME_FROM" not in {e["name"] for e in first}
    retry = render(run, attempt=2, resume_from="/ckpt")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {e["name"]: e.get("value") for e in retry}["TAU_RESUME_FROM"] == "/ckpt"


# ---- schema verdicts remembered modulo the run id ----


def test_a_clean_verdict_is_reused_only_for_the_same_manifest_with_another_run_id_of_the_same_shape() -> None:
    remembered.clear()
    first, second = "sweep-3f9a1c0d2b4e6f80", "sweep-77e0aa11c2d3e4f5"  # same length and character kinds
    for run_id, submission in ((first, "0c1d2e3f4a5b"), (second, "9f8e7d6c5b4a")):
        for manifest in render(build_run(run_id=run_id, submission_id=submission), attempt=1):
            validate(manifest, varying=(run_id, submission))
    assert len(remembered) == 1  # the second run's Job was the first's, modulo its run and submission ids
    other = "sweep-77e0aa11c2d3e4f"  # one character shorter: a schema length rule could tell them apart
    for manifest in render(build_run(run_id=other, submission_id="0c1d2e3f4a5b"), attempt=1):
        validate(manifest, varying=(other, "0c1d2e3f4a5b"))
    for manifest in render(build_run(run_id=first, command=["python3", "eval.py"]), attempt=1):  # another manifest
        validate(manifest, varying=(first, "0c1d2e3f4a5b"))
    for manifest in render(build_run(run_id=first), attempt=1):  # a submission id not masked: another key
        validate(manifest, varying=(first,))
    assert len(remembered) == 4


def test_a_manifest_with_schema_problems_is_never_remembered_and_fails_every_time() -> None:
    remembered.clear()
    run_id = "bad-3f9a1c0d2b4e6f80"
    job = render(build_run(run_id=run_id), attempt=1)[0]
    job["spec"]["template"]["spec"]["containers"][0]["bogus"] = 1
    for _ in range(2):
        with pytest.raises(PermanentError, match=r"containers\[0\]\.bogus: unknown field"):
            validate(job, varying=(run_id,))
    assert not remembered


def test_name_rules_run_even_when_the_schema_verdict_is_remembered() -> None:
    run_id = "names-3f9a1c0d2b4e6f80"
    job = render(build_run(run_id=run_id), attempt=1)[0]
    validate(job, varying=(run_id,))
    bad = copy.deepcopy(job)
    bad["metadata"]["labels"]["team"] = "-not-a-label-value-"
    with pytest.raises(PermanentError, match="metadata.labels.team"):
        validate(bad, varying=(run_id,))
