"""What this machine offers the local cluster: CPUs, memory and GPUs (declared for tests; else NVML's; else AMD's
or Intel Gaudi's, as ``amd-smi`` or ``hl-smi`` lists them), and whose GPUs they are (the vendor's resource)."""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

import psutil

from taugrid import settings
from taugrid.core import devices
from taugrid.gpulib import nvml_library_missing, vendor_tool_gpus
from taugrid.settings import LocalSettings

GPU = "nvidia.com/gpu"


def declared_gpus(given: LocalSettings | None = None) -> tuple[int, int] | None:
    """``TAU_DECLARED_GPUS=2`` or ``2x80000`` (count × memory MiB): simulate GPUs where none exist. ``given``:
    default this process's settings."""
    raw = (given or settings.current().local).declared_gpus
    if not raw:
        return None
    count, _, mem = raw.partition("x")
    return int(count), int(mem or 81920)


def nvml_gpus() -> tuple[int, int]:
    if nvml_library_missing():
        return 0, 0  # a CPU machine
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver / library: a CPU machine
        return 0, 0
    try:
        n = pynvml.nvmlDeviceGetCount()
        mem = min((pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total >> 20
                   for i in range(n)), default=0)
        return n, int(mem)
    finally:
        pynvml.nvmlShutdown()


def machine_gpus(given: LocalSettings | None = None) -> tuple[int, int, str]:
    """(GPUs, the smallest one's memory in MiB, their vendor's resource): declared GPUs and NVML's are NVIDIA's;
    where NVML finds none, AMD's or Gaudi's tool is asked."""
    found = declared_gpus(given) or nvml_gpus()
    if found[0]:
        return found[0], found[1], GPU
    listed = vendor_tool_gpus()
    if listed is None:
        return 0, 0, GPU
    vendor, count, memory_mb = listed
    return count, memory_mb, devices.VENDORS[vendor].resource


class Inventory(NamedTuple):
    node: str  # TAU_NODE_NAME, else the short host name
    capacity: dict[str, float]
    gpus: int
    gpu_memory_mb: int
    gpu_resource: str  # whose GPUs: nvidia.com/gpu, amd.com/gpu or habana.ai/gaudi


def inventory(given: LocalSettings | None = None) -> Inventory:
    given = given or settings.current().local
    node = given.node_name or socket.gethostname().split(".")[0] or "local"
    gpus, gpu_mem, resource = machine_gpus(given)
    capacity = {"cpu": float(os.cpu_count() or 1), "memory": float(psutil.virtual_memory().total),
                resource: float(gpus)}
    return Inventory(node, capacity, gpus, gpu_mem, resource)
