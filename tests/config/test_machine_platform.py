"""default_platform: a one-machine platform that fits the machine and passes its own checks."""

from taugrid.config.machine import default_platform
from taugrid.config.platform import GPU_RESOURCE, Platform
from taugrid.config.platformcheck import check_platform


def test_cpu_machine_gets_cpu_flavor_and_profiles_only():
    platform = default_platform(8, 32 << 30, [], output_root="/srv/runs")
    cq = platform.cluster_queue("local")
    assert [f.name for f in platform.resource_flavors] == ["default"]
    assert cq.nominal("cpu") == 8 and 0.89 * (32 << 30) <= cq.nominal("memory") <= 0.9 * (32 << 30)
    assert cq.nominal(GPU_RESOURCE) == 0
    assert [p.name for p in platform.compute_profiles] == ["cpu-small", "cpu"]
    ws = platform.workspace("default")
    assert (ws.namespace, ws.local_queue, ws.default_priority, ws.output_root) == (
        "default",
        "default",
        "normal",
        "/srv/runs",
    )
    assert {p.name: p.value for p in platform.priority_classes} == {"low": 50, "normal": 100, "high": 200}


def test_gpu_machine_gets_a_profile_per_gpu_count_and_a_half_gpu():
    platform = default_platform(32, 256 << 30, ["NVIDIA H200"] * 4)
    assert [f.name for f in platform.resource_flavors] == ["gpu"]
    assert platform.cluster_queue("local").nominal(GPU_RESOURCE) == 4
    names = [p.name for p in platform.compute_profiles]
    assert names == ["cpu-small", "cpu", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-half"]
    assert platform.profile("gpu-4").gpu == 4 and platform.profile("gpu-half").gpu_fraction == 0.5
    assert platform.workspace("default").max_gpus_per_run == 4


def test_tiny_machine_profiles_still_fit_and_the_platform_round_trips():
    platform = default_platform(1, 2 << 30, [])
    assert platform.profile("cpu").cpu == "1"
    assert check_platform(platform) == []
    assert Platform.model_validate(platform.model_dump(mode="json")) == platform
