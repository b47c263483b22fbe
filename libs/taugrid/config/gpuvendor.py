"""Which vendor's GPUs a run gets: ``compute.gpu_vendor``, else its profile's ``gpu_model``, else what its queue
offers.

A pod asks for one extended resource, so "any GPU" (``gpu_vendor: any`` or nothing said) is decided here, at
submission: the first vendor, in the queue's resource-group order (its cohort's queues after it), whose GPU
resource has quota and whose stack can give what the run asks (a share of a GPU, a MIG slice, NVIDIA's resource
mode). A queue with no GPU quota at all leaves NVIDIA, as before vendors existed (the capacity check then says
the queue holds none). What cannot be met is refused naming the key and the fix; nothing is silently swapped.
"""

from __future__ import annotations

from collections.abc import Callable

from taugrid.config.platform import ClusterQueue, ComputeProfile, Platform, amount
from taugrid.config.taujob import TauConfig
from taugrid.core import devices

Add = Callable[..., None]


def offered_vendors(platform: Platform, cluster_queue: str) -> list[devices.Vendor]:
    """Vendors with GPU quota in ``cluster_queue`` or, after it, the other queues of its cohort tree."""
    cq = platform.cluster_queue(cluster_queue)
    if cq is None:
        return []
    root = platform.cohort_root(cq.cohort)
    pool = [cq, *(q for q in (platform.cohort_tree_queues(root) if root else []) if q is not cq)]
    out: list[devices.Vendor] = []
    for q in pool:
        for vendor in _queue_vendors(q):
            if vendor not in out:
                out.append(vendor)
    return out


def _queue_vendors(cq: ClusterQueue) -> list[devices.Vendor]:
    out: list[devices.Vendor] = []
    for group in cq.resource_groups:
        for flavor in group.flavors:
            for quota in flavor.resources:
                vendor = devices.vendor_of_resource(quota.name)
                if vendor is not None and vendor not in out and _positive(quota.name, quota.nominal_quota):
                    out.append(vendor)
    return out


def _positive(resource: str, value: str | int | float) -> bool:
    try:
        return amount(resource, value) > 0
    except ValueError:
        return False


def choose_vendor(cfg: TauConfig, platform: Platform, profile: ComputeProfile | None, cluster_queue: str, *,
                  wants_gpu: bool, shared: bool, add: Add) -> devices.Vendor:
    """The vendor whose resource the run's GPUs are asked as; problems go to ``add(path, message, fix)``."""
    asked = cfg.compute.gpu_vendor
    key = ("compute", "gpu_vendor")
    model = devices.model(profile.gpu_model) if profile is not None and profile.gpu_model else None
    if asked is not None and not wants_gpu:
        add(key, f"asks for {asked} GPUs but the run asks for no GPU",
            "remove compute.gpu_vendor, or ask for GPUs (compute.gpus / gpus_per_worker)")
        return devices.DEFAULT_VENDOR
    if asked not in (None, devices.ANY) and model is not None and model.vendor != asked:
        add(key, f"profile {profile.name!r} gives {model.name} GPUs ({model.vendor}), not {asked}",  # type: ignore[union-attr]
            f"remove compute.gpu_vendor, or pick a profile with {asked} GPUs")
    nvidia_key = (("compute", "mig_profile") if cfg.compute.mig_profile
                  else ("compute", "gpu_resource_mode") if cfg.compute.gpu_resource_mode in ("nvidia", "mig")
                  else None)
    name = asked if asked not in (None, devices.ANY) else model.vendor if model is not None else None
    if name is None:
        fit = [v for v in offered_vendors(platform, cluster_queue)
               if (v.fractions or not shared) and (v.name == "nvidia" or nvidia_key is None)]
        name = fit[0].name if fit else devices.DEFAULT_VENDOR.name
    vendor = devices.VENDORS[name]
    if nvidia_key is not None and vendor.name != "nvidia":
        add(nvidia_key, f"is NVIDIA's, but the run's GPUs are {vendor.name}'s",
            f"remove {'.'.join(nvidia_key)}, or ask for NVIDIA GPUs (compute.gpu_vendor: nvidia)")
    if shared and not vendor.fractions:
        share_key = next((("compute", k) for k in ("gpu_fraction", "gpu_memory") if cfg.written("compute", k)),
                         ("policy", "profile"))
        add(share_key, f"asks for part of a GPU, but the run's GPUs are {vendor.name}'s: {vendor.fractions_why}",
            "ask for whole GPUs (compute.gpus), or for an NVIDIA GPU (compute.gpu_vendor: nvidia)")
    if cfg.engine == "ray" and vendor.name != "nvidia" and wants_gpu and not (
            cfg.runtime.image or (profile is not None and profile.image)):
        add(("runtime", "image"), f"a Ray run on {vendor.name} GPUs needs an image of that vendor's stack (the "
            "default Ray GPU image is built for CUDA)",
            "set runtime.image to a Ray image for ROCm or Gaudi, or use a profile that names one")
    return vendor
