"""GPU vendors (issue 26): a run asking for a vendor gets that vendor's resource; "any" gets what its queue offers;
fractions only where the vendor's stack shares a GPU; the platform's models and quotas are checked."""

from pathlib import Path

import pytest

from taugrid.config.platform import load_platform
from taugrid.config.resolve import resolve_run
from taugrid.config.taujob import config_hash, load_tau_config
from taugrid.core import devices
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import ConfigError

TEXT = (Path(__file__).resolve().parent / "vendors" / "platform.yaml").read_text()
FLEET = load_platform(TEXT)
AMD_QUOTA = "cluster_queues[0].resource_groups[0].flavors[1].resources[3]"
RUN = "name: t\nentrypoint: train.py\npolicy: {workspace: fleet}\n"


def resolve(extra: str) -> ResolvedRun:
    cfg = load_tau_config(RUN + extra)
    return resolve_run(cfg, FLEET, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                       config_hash=config_hash(cfg))


def refused(extra: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        resolve(extra)
    return {str(i["field"]): f"{i['message']} | {i['fix']}" for i in info.value.issues}


def platform_refused(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_platform(text)
    return {str(i["field"]): str(i["message"]) for i in info.value.issues}


@pytest.mark.parametrize(("vendor", "resource"), [("nvidia", ""), ("amd", "amd.com/gpu"),
                                                   ("intel-gaudi", "habana.ai/gaudi")])
def test_a_run_asking_for_a_vendor_gets_its_resource(vendor: str, resource: str) -> None:
    run = resolve(f"compute: {{gpus: 2, gpu_vendor: {vendor}}}\n")
    assert (run.gpu_resource, run.resources.gpu) == (resource, 2)  # "" is nvidia.com/gpu, as before vendors


def test_any_gpu_takes_the_first_vendor_the_queue_has_quota_for() -> None:
    assert resolve("compute: {gpus: 1, gpu_vendor: any}\n").gpu_resource == "amd.com/gpu"
    assert resolve("compute: {gpus: 1}\n").gpu_resource == "amd.com/gpu"


def test_a_gpu_share_goes_to_a_vendor_that_can_share() -> None:
    run = resolve("compute: {gpu_fraction: 0.5}\n")  # AMD is first on the queue but cannot share: NVIDIA
    assert (run.gpu_resource, run.resources.gpu_fraction) == ("", 0.5)


@pytest.mark.parametrize("vendor", ["amd", "intel-gaudi"])
def test_a_share_of_a_vendor_that_cannot_share_is_refused_with_the_reason(vendor: str) -> None:
    issues = refused(f"compute: {{gpu_fraction: 0.5, gpu_vendor: {vendor}}}\n")
    assert list(issues) == ["compute.gpu_fraction"]
    assert issues["compute.gpu_fraction"] == (
        f"asks for part of a GPU, but the run's GPUs are {vendor}'s: {devices.VENDORS[vendor].fractions_why} | "
        "ask for whole GPUs (compute.gpus), or for an NVIDIA GPU (compute.gpu_vendor: nvidia)")


def test_a_profile_names_the_model_and_the_vendor_image() -> None:
    cfg = load_tau_config("name: t\nentrypoint: train.py\npolicy: {workspace: fleet, profile: gaudi3-8}\n")
    run = resolve_run(cfg, FLEET, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                      config_hash=config_hash(cfg))
    assert (run.gpu_resource, run.resources.gpu, run.image) == (
        "habana.ai/gaudi", 8,
        "vault.habana.ai/gaudi-docker/1.21.0/ubuntu24.04/habanalabs/pytorch-installer-2.6.0:latest")


def test_a_vendor_against_the_profile_or_with_nvidia_only_keys_is_refused() -> None:
    cfg = load_tau_config("name: t\nentrypoint: train.py\npolicy: {workspace: fleet, profile: mi300x-1}\n"
                          "compute: {gpu_vendor: nvidia}\n")
    with pytest.raises(ConfigError) as info:
        resolve_run(cfg, FLEET, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                    config_hash=config_hash(cfg))
    assert {str(i["field"]): i["message"] for i in info.value.issues} == {
        "compute.gpu_vendor": "profile 'mi300x-1' gives amd-mi300x GPUs (amd), not nvidia"}
    cfg = load_tau_config(RUN + "compute: {gpus: 1, gpu_vendor: amd, gpu_resource_mode: mig, mig_profile: 1g.18gb}\n")
    with pytest.raises(ConfigError) as info:
        resolve_run(cfg, FLEET, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                    config_hash=config_hash(cfg))
    assert [(i["field"], i["message"]) for i in info.value.issues] == [
        ("compute.mig_profile", "is NVIDIA's, but the run's GPUs are amd's"),
        # and the slice is a resource of its own that this queue has no quota for
        ("compute.mig_profile", "asks for 1 nvidia.com/mig-1g.18gb in total; cluster queue 'fleet' can never hold "
                                "more than 0, so the run would never start")]


def test_a_cpu_run_naming_a_vendor_is_refused() -> None:
    assert refused("compute: {gpus: 0, gpu_vendor: amd}\n") == {
        "compute.gpu_vendor": "asks for amd GPUs but the run asks for no GPU | remove compute.gpu_vendor, or ask for "
                              "GPUs (compute.gpus / gpus_per_worker)"}


def test_a_vendor_the_queue_has_no_quota_for_is_refused_naming_the_vendor() -> None:
    text = TEXT.replace("{name: habana.ai/gaudi, nominal_quota: 16}", "{name: habana.ai/gaudi, nominal_quota: 0}")
    platform = load_platform(text)
    cfg = load_tau_config(RUN + "compute: {gpus: 1, gpu_vendor: intel-gaudi}\n")
    with pytest.raises(ConfigError) as info:
        resolve_run(cfg, platform, run_id="t-1", submission_id="s", workspace=None, platform_revision=1,
                    config_hash=config_hash(cfg))
    assert [(i["field"], i["message"], i["fix"]) for i in info.value.issues] == [(
        "compute.gpu_vendor",
        "asks for 1 habana.ai/gaudi in total; cluster queue 'fleet' can never hold more than 0, so the run would "
        "never start",
        "ask for a GPU vendor the queue has quota for (compute.gpu_vendor: any takes whichever it has)")]


def test_the_platform_checks_models_and_each_vendors_quota() -> None:
    assert platform_refused(TEXT.replace("gpu_model: gaudi3\n", "gpu_model: gaudi9\n")) == {
        "resource_flavors[2].gpu_model": "unknown GPU model 'gaudi9'"}
    wrong = TEXT.replace("""          - name: h100
            resources:
              - {name: cpu, nominal_quota: 64}
              - {name: memory, nominal_quota: 512Gi}
              - {name: nvidia.com/gpu, nominal_quota: 8}
              - {name: amd.com/gpu, nominal_quota: 0}""", """          - name: h100
            resources:
              - {name: cpu, nominal_quota: 64}
              - {name: memory, nominal_quota: 512Gi}
              - {name: nvidia.com/gpu, nominal_quota: 8}
              - {name: amd.com/gpu, nominal_quota: 2.5}""")
    assert platform_refused(wrong) == {
        f"{AMD_QUOTA}.nominal_quota": "GPUs are whole devices, got '2.5'",
        f"{AMD_QUOTA}.name": "flavor 'h100' is a nvidia flavor; its nodes have no amd.com/gpu"}
    nodes = TEXT + ("local: {nodes: [{name: mi-0, gpus: 8, gpu_model: amd-mi300x}, "
                    "{name: x-0, gpus: 1, gpu_model: mi300}]}\n")
    assert platform_refused(nodes) == {"local.nodes[1].gpu_model": "unknown GPU model 'mi300'"}
    shared = TEXT.replace("{name: mi300x-1, gpu: 1, gpu_model: amd-mi300x,",
                          "{name: mi300x-1, gpu: 0, gpu_fraction: 0.5, gpu_model: amd-mi300x,")
    assert platform_refused(shared) == {
        "compute_profiles[0].gpu_fraction": f"amd-mi300x is a amd GPU: {devices.VENDORS['amd'].fractions_why}"}


def test_the_device_table_names_each_vendors_plugin_visibility_and_cdi() -> None:
    table = {v.name: (v.resource, v.cdi_device(0), v.oci_runtime) for v in devices.VENDORS.values()}
    assert table == {"nvidia": ("nvidia.com/gpu", "nvidia.com/gpu=0", ""), "amd": ("amd.com/gpu", "amd.com/gpu=0", ""),
                     "intel-gaudi": ("habana.ai/gaudi", "", "habana")}
    env = {name: devices.visibility_env(v, [2, 5]) for name, v in devices.VENDORS.items()}
    assert env == {
        "nvidia": {"CUDA_VISIBLE_DEVICES": "2,5", "NVIDIA_VISIBLE_DEVICES": "2,5"},
        # ROCR picks the host's devices; HIP then indexes what ROCR left, from 0
        "amd": {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void", "ROCR_VISIBLE_DEVICES": "2,5",
                "HIP_VISIBLE_DEVICES": "0,1"},
        "intel-gaudi": {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void", "HABANA_VISIBLE_DEVICES": "2,5"},
    }
    assert devices.visibility_env(None, []) == devices.visibility_env(devices.VENDORS["nvidia"], []) == {
        "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    assert devices.vendor_of_resource("nvidia.com/mig-1g.18gb") is devices.VENDORS["nvidia"]
    assert devices.vendor_of_resources(["cpu", "memory", "habana.ai/gaudi"]) is devices.VENDORS["intel-gaudi"]
    assert devices.vendor_of_resources(["cpu", "rdma/x"]) is None


def test_a_ray_run_on_another_vendor_names_its_image() -> None:
    ray = "engine: ray\ncompute: {gpus_per_worker: 1, gpu_vendor: amd}\n"
    assert refused(ray) == {"runtime.image": "a Ray run on amd GPUs needs an image of that vendor's stack (the default "
                            "Ray GPU image is built for CUDA) | set runtime.image to a Ray image for ROCm or Gaudi, or "
                            "use a profile that names one"}
    run = resolve(ray + "runtime: {image: 'rocm/ray:latest'}\n")
    assert (run.gpu_resource, run.gpus_per_worker, run.image) == ("amd.com/gpu", 1, "rocm/ray:latest")
