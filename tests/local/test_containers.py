"""Pods whose run names an image, run through a container engine: the exact command lines the kubelet builds
(pure, everywhere) and, where docker or podman can run a locally built image, real pods through it."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from taugrid.local import containers
from taugrid.local.containers import ENGINE_ANNOTATION
from taugrid.local.kubelet import Kubelet
from taugrid.local.podspec import plan
from tests.local.test_kubelet import log_text, pod, run, terminated


def test_docker_gets_the_devices_by_index_renumbered_inside_and_the_variables_by_name() -> None:
    argv = containers.run_argv(
        ["python", "train.py"], engine="docker", image="pytorch/pytorch:2.4", name="p-0-main",
        cwd="/d/pods/p-0/work", env={"PATH": "/usr/bin", "HOME": "/root", "TAU_RUN_ID": "r1",
                                     "CUDA_VISIBLE_DEVICES": "2,3", "NVIDIA_VISIBLE_DEVICES": "2,3"},
        mounts=[("/d/outputs/r1", "/d/outputs/r1"), ("/d/pods/p-0/work", "/d/pods/p-0/work")],
        memory_limit=1 << 30)
    assert argv == ["docker", "run", "--rm", "--init", "--name", "p-0-main", "--network", "host",
                    "-w", "/d/pods/p-0/work", "-v", "/d/pods/p-0/work:/d/pods/p-0/work",
                    "-v", "/d/outputs/r1:/d/outputs/r1", "-e", "TAU_RUN_ID", "-e", "CUDA_VISIBLE_DEVICES=0,1",
                    "--gpus", "device=2,3", "--memory", str(1 << 30), "pytorch/pytorch:2.4", "python", "train.py"]


def test_podman_gets_cdi_devices_and_a_gpu_less_pod_keeps_nvidia_void() -> None:
    with_gpus = containers.run_argv(["sh"], engine="/usr/bin/podman", image="img:1", name="n", cwd="/w",
                                    env={"CUDA_VISIBLE_DEVICES": "1"}, mounts=[], memory_limit=0)
    assert with_gpus == ["/usr/bin/podman", "run", "--rm", "--init", "--name", "n", "--network", "host", "-w", "/w",
                         "-v", "/w:/w", "-e", "CUDA_VISIBLE_DEVICES=0", "--device", "nvidia.com/gpu=1", "img:1", "sh"]
    none = containers.run_argv(["sh"], engine="podman", image="img:1", name="n", cwd="/w",
                               env={"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}, mounts=[],
                               memory_limit=0)
    assert none == ["podman", "run", "--rm", "--init", "--name", "n", "--network", "host", "-w", "/w", "-v", "/w:/w",
                    "-e", "NVIDIA_VISIBLE_DEVICES", "img:1", "sh"]


def test_stop_kill_and_remove_name_the_container_and_the_grace() -> None:
    assert containers.stop_argv("podman", "p-main", 7.9) == ["podman", "stop", "-t", "7", "p-main"]
    assert containers.kill_argv("docker", "p-main") == ["docker", "kill", "p-main"]
    assert containers.remove_argv("docker", "p-main") == ["docker", "rm", "-f", "p-main"]


def test_engine_exit_codes_mean_a_start_error_or_an_oom_kill_only_where_nothing_else_explains_them() -> None:
    assert containers.exit_reason(125, stopped=False, memory_limit=0) == (
        "StartError", "the container engine could not run the container (exit 125): see the container's log")
    assert containers.exit_reason(137, stopped=False, memory_limit=256 << 20) == (
        "OOMKilled", "killed by SIGKILL inside the container's memory limit (256 MiB)")
    assert containers.exit_reason(137, stopped=True, memory_limit=256 << 20) is None
    assert containers.exit_reason(137, stopped=False, memory_limit=0) is None
    assert containers.exit_reason(3, stopped=False, memory_limit=0) is None


def engine_pod(name: str, engine: str, image: str, script: str, **spec: Any) -> dict[str, Any]:
    manifest = pod(name, [{"name": "main", "image": image, "command": ["/bin/sh", "-c", script],
                           "env": [{"name": "GREETING", "value": "hello"},
                                   {"name": "OUT", "value": "/data/result.txt"}],
                           "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                   volumes=[{"name": "data", "emptyDir": {}}], **spec)
    manifest["metadata"]["annotations"][ENGINE_ANNOTATION] = engine
    return manifest


def test_the_kubelet_runs_an_annotated_pod_through_the_engine_with_its_volumes_and_outputs(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs" / "r1"
    outputs.mkdir(parents=True)
    manifest = engine_pod("p-0", "podman", "localhost/tau-test:1", 'echo "$GREETING" > $OUT')
    manifest["spec"]["containers"][0]["env"].append({"name": "TAU_OUTPUT_DIR", "value": str(outputs)})
    pod_dir = tmp_path / "pods" / "p-0"
    got = plan(manifest, pod_dir=pod_dir, claims_dir=tmp_path / "claims", base_env={"PATH": "/usr/bin"},
               resolve_secret=lambda *_: None, resolve_config_map=lambda *_: None)
    [main] = got.containers
    data = f"{pod_dir}/volumes/data"
    assert main.command == [
        "podman", "run", "--rm", "--init", "--name", "p-0-main", "--network", "host", "-w", f"{pod_dir}/work",
        "-v", f"{pod_dir}/work:{pod_dir}/work", "-v", f"{data}:{data}", "-v", f"{data}:/data",
        "-v", f"{pod_dir}/termination:{pod_dir}/termination", "-v", f"{outputs}:{outputs}",
        "-e", "GREETING", "-e", "OUT", "-e", "TAU_OUTPUT_DIR",
        "localhost/tau-test:1", "/bin/sh", "-c", 'echo "$GREETING" > $OUT']
    assert main.env["OUT"] == f"{data}/result.txt"  # the mount path rewritten, as for host processes
    assert (main.engine, main.engine_name) == ("podman", "p-0-main")


def test_only_the_runs_output_checkpoint_and_resume_directories_are_mounted(tmp_path: Path) -> None:
    keys = tmp_path / "stack" / "creds"  # the stack's data directory: a run's container must never see it
    outputs, checkpoints = tmp_path / "out" / "r1", tmp_path / "out" / "r1" / "checkpoints"
    for d in (keys, checkpoints):
        d.mkdir(parents=True)
    env = {"TAU_OUTPUT_DIR": str(outputs), "TAU_CHECKPOINT_DIR": str(checkpoints), "TAU_RESUME_FROM": str(outputs),
           # the config's own strings reach the run in these: none names a directory to mount
           "TAU_TUNE_METRIC": str(keys), "TAU_RETRY_REASON": str(keys), "TAU_CHECKPOINT_ARTIFACT": str(keys)}
    assert containers.mounts_for(volumes=[], env=env) == [(str(outputs), str(outputs))]
@pytest.fixture
def kubelet(tmp_path: Path) -> Kubelet:
    return Kubelet(tmp_path / "pods", claims_dir=tmp_path / "claims", poll_s=0.05)


async def test_a_real_engine_runs_the_pod_its_output_and_exit_code_come_back(engine_image: tuple[str, str],
                                                                            kubelet: Kubelet) -> None:
    engine, image = engine_image
    manifest = engine_pod("real-1", engine, image,
                          'echo "$GREETING from $(cat /proc/1/comm)"; echo "$GREETING" > $OUT; cat /data/result.txt; '
                          "echo to-stderr >&2; exit 3")
    final, _ = await run(kubelet, manifest, timeout=120)
    assert final["phase"] == "Failed"
    assert (terminated(final, "main")["exitCode"], terminated(final, "main")["reason"]) == (3, "Error")
    lines = log_text(kubelet, "real-1", "main")
    assert lines[0] == f"hello from {engine}-init"  # --init: the engine's init is PID 1
    assert lines[1:] == ["hello", "to-stderr"]
    assert (kubelet.pods.dir("real-1") / "volumes" / "data" / "result.txt").read_text() == "hello\n"
    gone = await asyncio.to_thread(subprocess.run, [engine, "inspect", "real-1-main"], capture_output=True,
                                   check=False)
    assert gone.returncode != 0  # --rm


async def test_a_real_engine_container_is_stopped_with_engine_stop_and_reports_the_stop(
        engine_image: tuple[str, str], kubelet: Kubelet) -> None:
    engine, image = engine_image
    manifest = engine_pod("real-2", engine, image,
                          "trap 'echo got TERM; exit 7' TERM; echo up; while true; do sleep 0.1; done",
                          terminationGracePeriodSeconds=20)
    handle = await kubelet.start(manifest, lambda _s: None)
    for _ in range(1200):
        if log_text(kubelet, "real-2", "main") == ["up"]:
            break
        await asyncio.sleep(0.05)
    await kubelet.stop("real-2", reason="Preempted")
    final = await asyncio.wait_for(handle.wait(), 60)
    assert final["phase"] == "Failed"
    assert (terminated(final, "main")["exitCode"], terminated(final, "main")["reason"]) == (7, "Preempted")
    assert log_text(kubelet, "real-2", "main") == ["up", "got TERM"]


async def test_a_missing_image_is_a_start_error(engine_image: tuple[str, str], kubelet: Kubelet) -> None:
    engine, _ = engine_image
    final, _ = await run(kubelet, engine_pod("real-3", engine, "localhost/taugrid-no-such-image:0", "true"),
                         timeout=120)
    assert final["phase"] == "Failed"
    assert (terminated(final, "main")["exitCode"], terminated(final, "main")["reason"]) == (125, "StartError")
