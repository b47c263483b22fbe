"""A local container gets its vendor's devices (issue 26): AMD's by CDI (``amd.com/gpu=N``, the spec AMD's container
toolkit generates) with ROCR and HIP counting them from 0 inside, Gaudi's through the ``habana`` runtime with
``HABANA_VISIBLE_DEVICES`` naming host indices (its hook maps them), NVIDIA's as before; the pod's visibility
variables are never passed through as written."""

from __future__ import annotations

from taugrid.core import devices
from taugrid.local import containers

BASE = ["run", "--rm", "--init", "--name", "n", "--network", "host", "-w", "/w", "-v", "/w:/w"]


def argv(engine: str, env: dict[str, str]) -> list[str]:
    return containers.run_argv(["sh"], engine=engine, image="img:1", name="n", cwd="/w", env=env, mounts=[],
                               memory_limit=0)


def test_amd_gpus_are_cdi_devices_on_docker_and_podman() -> None:
    env = {**devices.visibility_env(devices.VENDORS["amd"], [2, 5]), "TAU_RUN_ID": "r"}
    for engine in ("docker", "/usr/bin/podman"):
        assert argv(engine, env) == [
            engine, *BASE, "-e", "TAU_RUN_ID", "-e", "NVIDIA_VISIBLE_DEVICES",
            "-e", "ROCR_VISIBLE_DEVICES=0,1", "-e", "HIP_VISIBLE_DEVICES=0,1",
            "--device", "amd.com/gpu=2", "--device", "amd.com/gpu=5", "img:1", "sh"]


def test_gaudi_devices_go_through_the_habana_runtime_by_host_index() -> None:
    env = devices.visibility_env(devices.VENDORS["intel-gaudi"], [0, 3])
    assert argv("docker", env) == ["docker", *BASE, "-e", "NVIDIA_VISIBLE_DEVICES", "--runtime", "habana",
                                   "-e", "HABANA_VISIBLE_DEVICES=0,3", "img:1", "sh"]


def test_nvidia_and_gpu_less_pods_map_as_before() -> None:
    nvidia = devices.visibility_env(devices.VENDORS["nvidia"], [1])
    assert argv("/usr/bin/podman", nvidia) == ["/usr/bin/podman", *BASE, "-e", "CUDA_VISIBLE_DEVICES=0",
                                               "--device", "nvidia.com/gpu=1", "img:1", "sh"]
    assert argv("docker", devices.visibility_env(None, [])) == ["docker", *BASE, "-e", "NVIDIA_VISIBLE_DEVICES",
                                                                "img:1", "sh"]
