"""Every pod of every shape fetches the submitted project (init container + emptyDir as the working
directory), built from the cluster's render settings; source-image jobs and runs without a snapshot get no
fetch; Ray's runtime_env no longer points at a path on the submitter's machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from render_runs import build_run

from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render import RenderSettings, render, validate
from taugrid.render.source import FETCH_CONTAINER
from taugrid.settings import Settings

DIGEST = "sha256:" + "5e" * 32
OBJECT = "sources/" + "5e" * 32 + ".tar.gz"
SETTINGS = RenderSettings(
    fetch_image="registry.example/taugrid:1.2.3",
    nats_url="nats://nats.bus.svc:4222",
    nats_creds_secret="tau-source-fetch",
)


def _run(**overrides: Any) -> ResolvedRun:
    return build_run(source_digest=DIGEST, source_object=OBJECT, **overrides)


SHAPES = {
    "job": _run(),
    "torchrun_single": _run(launcher="torchrun", processes_per_node=2, command=[
        "python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]),
    "torchrun_multi_node": _run(launcher="torchrun", nodes=2, processes_per_node=1),
    "rayjob": _run(engine="ray", launcher="ray-train", command=[], workers=2, gpus_per_worker=1),
}


def _pods(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]["spec"]]
    if manifest["kind"] == "RayJob":
        cluster = manifest["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]["spec"]] + [
            g["template"]["spec"] for g in cluster["workerGroupSpecs"]
        ]
    return []


def _all_pods(run: ResolvedRun, settings: RenderSettings = SETTINGS) -> list[dict[str, Any]]:
    manifests = render(run, attempt=1, settings=settings)
    for manifest in manifests:
        validate(manifest)
    return [pod for m in manifests for pod in _pods(m)]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_pod_fetches_the_snapshot_into_its_working_directory(shape: str) -> None:
    pods = _all_pods(SHAPES[shape])
    assert len(pods) == (2 if shape == "rayjob" else 1)  # RayJob: head and the worker group
    for pod in pods:
        (fetch,) = pod["initContainers"]
        assert fetch == {
            "name": FETCH_CONTAINER,
            "image": "registry.example/taugrid:1.2.3",
            "command": ["python", "-m", "taugrid.sources.fetch"],
            "workingDir": "/tau/source",
            "env": [
                {"name": "TAU_NATS_URL", "value": "nats://nats.bus.svc:4222"},
                {"name": "TAU_SOURCE_OBJECT", "value": OBJECT},
                {"name": "TAU_SOURCE_DIGEST", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.annotations['taugrid.io/source-digest']"}}},
                {"name": "TAU_TERMINATION_MESSAGE_PATH", "value": "/dev/termination-log"},
                {"name": "TAU_NATS_CREDS", "value": "/etc/taugrid/nats/creds"},
            ],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "volumeMounts": [
                {"name": "tau-source", "mountPath": "/tau/source"},
                {"name": "tau-nats-creds", "mountPath": "/etc/taugrid/nats", "readOnly": True},
            ],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        assert pod["volumes"][:2] == [
            {"name": "tau-source", "emptyDir": {}},
            {"name": "tau-nats-creds", "secret": {"secretName": "tau-source-fetch",
                                                  "items": [{"key": "creds", "path": "creds"}],
                                                  "defaultMode": 0o440}},
        ]
        (main,) = pod["containers"]
        assert main["workingDir"] == "/tau/source"
        assert main["volumeMounts"][0] == {"name": "tau-source", "mountPath": "/tau/source"}


def test_the_digest_the_fetcher_checks_is_the_pod_annotation() -> None:
    (job,) = render(SHAPES["job"], attempt=1)
    assert job["spec"]["template"]["metadata"]["annotations"]["taugrid.io/source-digest"] == DIGEST


def test_without_credentials_nothing_is_mounted_for_them() -> None:
    (pod,) = _all_pods(SHAPES["job"], RenderSettings(fetch_image="img:1", nats_url="nats://n:4222"))
    (fetch,) = pod["initContainers"]
    assert [e["name"] for e in fetch["env"]] == [
        "TAU_NATS_URL", "TAU_SOURCE_OBJECT", "TAU_SOURCE_DIGEST", "TAU_TERMINATION_MESSAGE_PATH"]
    assert fetch["volumeMounts"] == [{"name": "tau-source", "mountPath": "/tau/source"}]
    assert pod["volumes"] == [{"name": "tau-source", "emptyDir": {}}]


def test_settings_come_from_the_renderer_environment() -> None:
    env = {"TAU_SOURCE_FETCH_IMAGE": "r/t:9", "TAU_SOURCE_FETCH_NATS_URL": "nats://x:4222",
           "TAU_SOURCE_FETCH_CREDS_SECRET": "s"}
    assert RenderSettings.from_env(env) == RenderSettings(fetch_image="r/t:9", nats_url="nats://x:4222",
                                                           nats_creds_secret="s")


def test_the_renderer_service_builds_them_from_its_settings_and_an_unreadable_ca_names_the_fix(
        tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    env = {"TAU_SOURCE_FETCH_NATS_CA": str(tmp_path / "ca.crt"), "TAU_SOURCE_FETCH_CREDS_SECRET": "fetch"}
    built = RenderSettings.from_settings(Settings.from_env(env).renderer)
    assert built == RenderSettings.from_env(env) == RenderSettings(
        nats_creds_secret="fetch", nats_ca_pem="-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    with pytest.raises(PermanentError) as refused:
        RenderSettings.from_env({"TAU_SOURCE_FETCH_NATS_CA": str(tmp_path / "gone.crt")})
    assert str(refused.value) == (f"TAU_SOURCE_FETCH_NATS_CA={tmp_path / 'gone.crt'}: cannot read the bus's CA "
                                  "certificate (No such file or directory); check the chart's nats.embedded.tls "
                                  "values")


def test_runtime_working_dir_keeps_its_meaning() -> None:
    (absolute,) = _all_pods(_run(working_dir="/workspace"))
    assert absolute["containers"][0]["workingDir"] == "/workspace"
    assert absolute["containers"][0]["volumeMounts"][0] == {"name": "tau-source", "mountPath": "/workspace"}
    assert absolute["initContainers"][0]["volumeMounts"][0] == {"name": "tau-source", "mountPath": "/tau/source"}
    (relative,) = _all_pods(_run(working_dir="src/app"))
    assert relative["containers"][0]["workingDir"] == "/tau/source/src/app"
    assert relative["containers"][0]["volumeMounts"][0] == {"name": "tau-source", "mountPath": "/tau/source"}


def test_a_rayjob_runs_its_entrypoint_from_the_fetched_project_not_a_submitter_path() -> None:
    run = _run(engine="ray", launcher="ray-train", command=[], workers=1, working_dir="src",
               entrypoint="train.py", args=["--x", "a b"])
    (rayjob,) = render(run, attempt=1, settings=SETTINGS)
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "cd \"${TAU_SOURCE_DIR:-.}\" && python train.py --x 'a b'"
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert "working_dir" not in runtime_env
    assert runtime_env["env_vars"]["TAU_SOURCE_DIR"] == "/tau/source/src"
    assert runtime_env["env_vars"]["PYTHONPATH"] == "/tau/source/src:${PYTHONPATH}"
    for pod in _pods(rayjob):
        assert pod["containers"][0]["workingDir"] == "/tau/source/src"


def test_a_source_image_job_runs_the_code_in_its_image_without_a_fetch() -> None:
    image = "registry.example/code@sha256:" + "1f" * 32
    (pod,) = _all_pods(_run(image=image, source_image=image, source_path="/opt/project"))
    assert "initContainers" not in pod
    assert "volumes" not in pod
    (main,) = pod["containers"]
    assert (main["image"], main["workingDir"]) == (image, "/opt/project")
    assert "volumeMounts" not in main


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_run_submitted_without_a_snapshot_gets_no_fetch(shape: str) -> None:
    run = msgspec.structs.replace(SHAPES[shape], source_digest="", source_object="")
    for pod in _all_pods(run):
        assert "initContainers" not in pod
