"""GPU vendors and models: the one table every other module reads a vendor's names from.

A vendor is what a device plugin, a container engine and a program each call its GPUs:

* the Kubernetes extended resource its device plugin advertises (``nvidia.com/gpu`` from NVIDIA's
  k8s-device-plugin, ``amd.com/gpu`` from ROCm's k8s-device-plugin, ``habana.ai/gaudi`` from Intel Gaudi's);
* the variables that choose devices (``CUDA_VISIBLE_DEVICES`` and the container toolkit's
  ``NVIDIA_VISIBLE_DEVICES``; ROCm's ``ROCR_VISIBLE_DEVICES``, host indices, then ``HIP_VISIBLE_DEVICES``, which
  indexes the devices ROCR left visible and so counts from 0; the Gaudi container runtime's
  ``HABANA_VISIBLE_DEVICES``);
* how a container engine is told which devices to map: a CDI name ``<kind>=<index>`` (NVIDIA's and AMD's container
  toolkits generate CDI specs whose kinds are ``nvidia.com/gpu`` and ``amd.com/gpu``) or, for Gaudi, whose toolkit
  ships no CDI spec, its OCI runtime ``habana`` reading ``HABANA_VISIBLE_DEVICES``;
* whether its stack shares one GPU between pods by fraction or memory (KAI's GPU sharing is NVIDIA only; ROCm
  and Gaudi partition devices into resources of their own, which a run asks for as ``runtime.devices``).

A model (``nvidia-h100``, ``amd-mi300x``, ``gaudi3``) is one vendor's GPU with its memory. The
table is data: adding a model is one line. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

VendorName = Literal["nvidia", "amd", "intel-gaudi"]
ANY = "any"  # a run that takes whichever vendor its queue offers


@dataclass(frozen=True)
class Vendor:
    name: VendorName
    resource: str  # the device plugin's extended resource
    device_env: tuple[str, ...]  # variables that name the devices a process sees by host index
    ordinal_env: tuple[str, ...]  # variables that count the visible devices from 0 (HIP within ROCR's)
    cdi_kind: str  # "" when the vendor's container toolkit generates no CDI spec
    oci_runtime: str  # the OCI runtime that maps devices when there is no CDI ("" with CDI)
    fractions: bool  # whether a pod may ask for part of one GPU (KAI gpu-fraction / gpu-memory)
    fractions_why: str  # why not, for the refusal

    def cdi_device(self, index: int | str) -> str:
        """The CDI name of one device, ``nvidia.com/gpu=0``; "" for a vendor without CDI."""
        return f"{self.cdi_kind}={index}" if self.cdi_kind else ""


VENDORS: dict[str, Vendor] = {
    "nvidia": Vendor("nvidia", "nvidia.com/gpu", ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"), (),
                     "nvidia.com/gpu", "", True, ""),
    "amd": Vendor("amd", "amd.com/gpu", ("ROCR_VISIBLE_DEVICES",), ("HIP_VISIBLE_DEVICES",), "amd.com/gpu", "",
                  False, "AMD's device plugin offers whole GPUs or compute partitions, not fractions; ask for a "
                  "partition resource in runtime.devices or a whole GPU"),
    "intel-gaudi": Vendor("intel-gaudi", "habana.ai/gaudi", ("HABANA_VISIBLE_DEVICES",), (), "", "habana",
                          False, "Intel Gaudi's device plugin offers whole accelerators only; ask for a whole one"),
}
DEFAULT_VENDOR = VENDORS["nvidia"]
GPU_RESOURCES: frozenset[str] = frozenset(v.resource for v in VENDORS.values())


@dataclass(frozen=True)
class GpuModel:
    name: str
    vendor: VendorName
    memory_gib: int  # each GPU's (a local node's default gpu_memory)


MODELS: dict[str, GpuModel] = {m.name: m for m in (
    GpuModel("nvidia-a100", "nvidia", 80),
    GpuModel("nvidia-h100", "nvidia", 80),
    GpuModel("nvidia-h200", "nvidia", 141),
    GpuModel("nvidia-b200", "nvidia", 192),
    GpuModel("amd-mi250x", "amd", 128),
    GpuModel("amd-mi300x", "amd", 192),
    GpuModel("amd-mi325x", "amd", 256),
    GpuModel("gaudi2", "intel-gaudi", 96),
    GpuModel("gaudi3", "intel-gaudi", 128),
)}


def model(name: str) -> GpuModel | None:
    return MODELS.get(name)


def vendor_of_resource(resource: str) -> Vendor | None:
    """The vendor whose device plugin advertises ``resource`` (MIG slices ``nvidia.com/mig-*`` are NVIDIA's)."""
    if resource.startswith("nvidia.com/mig-"):
        return DEFAULT_VENDOR
    return next((v for v in VENDORS.values() if v.resource == resource), None)


def is_gpu_resource(resource: str) -> bool:
    return vendor_of_resource(resource) is not None


def vendor_of_resources(names: Iterable[str]) -> Vendor | None:
    """The first vendor whose resource is among ``names`` (a container's requests), or None for a CPU pod."""
    for name in names:
        found = vendor_of_resource(name)
        if found is not None:
            return found
    return None


# Every variable any vendor reads to choose devices: a pod's own value of one of these never reaches it (the
# platform decides which devices a pod sees).
VISIBILITY_ENV: frozenset[str] = frozenset(k for v in VENDORS.values() for k in (*v.device_env, *v.ordinal_env))


def visibility_env(found: Vendor | None, gpus: Sequence[int]) -> dict[str, str]:
    """The variables a local pod gets for the devices it was given: its vendor's, from ``gpus`` (host indices),
    and NVIDIA's emptied (``NVIDIA_VISIBLE_DEVICES=void``) when it was given none of NVIDIA's, so a pod never sees
    a GPU of another vendor's on a machine that has several, nor any GPU when it asked for none."""
    env = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    if found is None:
        return env
    host = ",".join(str(g) for g in gpus)
    env.update({k: host for k in found.device_env})
    env.update({k: ",".join(str(i) for i in range(len(gpus))) for k in found.ordinal_env})
    if found.name == "nvidia" and not gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return env
