"""``platform.yaml`` checks for GPU vendors and models (``taugrid.core.devices``).

Invariants: a ``gpu_model`` names a known model; a flavor of one model holds quota only for its own vendor's GPU
resource (quota for another vendor's would count devices its nodes do not have); a profile of a vendor whose
stack cannot share a GPU asks for no fraction; a GPU quota of any vendor is a whole number of devices.
"""

from __future__ import annotations

from collections.abc import Callable

from taugrid.config.platform import Platform, amount
from taugrid.core import devices

Add = Callable[..., None]


def check_devices(platform: Platform, add: Add) -> None:
    known = ", ".join(devices.MODELS)
    flavor_vendor: dict[str, str] = {}
    for i, flavor in enumerate(platform.resource_flavors):
        if flavor.gpu_model is None:
            continue
        model = devices.model(flavor.gpu_model)
        if model is None:
            add(("resource_flavors", i, "gpu_model"), f"unknown GPU model {flavor.gpu_model!r}", f"use one of: {known}")
            continue
        flavor_vendor[flavor.name] = model.vendor
    for i, profile in enumerate(platform.compute_profiles):
        if profile.gpu_model is None:
            continue
        model = devices.model(profile.gpu_model)
        if model is None:
            add(("compute_profiles", i, "gpu_model"), f"unknown GPU model {profile.gpu_model!r}",
                f"use one of: {known}")
            continue
        vendor = devices.VENDORS[model.vendor]
        shared = "gpu_fraction" if profile.gpu_fraction is not None else "gpu_memory" if profile.gpu_memory else ""
        if shared and not vendor.fractions:
            add(("compute_profiles", i, shared), f"{model.name} is a {vendor.name} GPU: {vendor.fractions_why}",
                f"remove {shared} and set gpu to a whole number")
    for i, node in enumerate(platform.local.nodes):
        if node.gpu_model is not None and devices.model(node.gpu_model) is None:
            add(("local", "nodes", i, "gpu_model"), f"unknown GPU model {node.gpu_model!r}", f"use one of: {known}")
    for i, cq in enumerate(platform.cluster_queues):
        for g, group in enumerate(cq.resource_groups):
            for f, fq in enumerate(group.flavors):
                for r, quota in enumerate(fq.resources):
                    path = ("cluster_queues", i, "resource_groups", g, "flavors", f, "resources", r)
                    _gpu_quota(add, path, quota.name, quota.nominal_quota, flavor_vendor.get(fq.name), fq.name)


def _gpu_quota(add: Add, path: tuple[str | int, ...], resource: str, nominal: str | int | float,
               flavor_vendor: str | None, flavor: str) -> None:
    vendor = devices.vendor_of_resource(resource)
    if vendor is None or flavor_vendor is None or vendor.name == flavor_vendor:
        return
    try:
        some = amount(resource, nominal) > 0
    except ValueError:
        return  # the quantity itself is reported by platformcheck
    if some:
        own = devices.VENDORS[flavor_vendor].resource
        add((*path, "name"), f"flavor {flavor!r} is a {flavor_vendor} flavor; its nodes have no {resource}",
            f"give this flavor quota for {own}, or put {resource} quota on a {vendor.name} flavor")
