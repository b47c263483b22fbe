"""What this machine offers the local cluster: CPUs, memory and GPUs (NVML, or declared for tests)."""

from __future__ import annotations

import os
import socket

import psutil

from taugrid import settings
from taugrid.gpulib import nvml_library_missing
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


def inventory(given: LocalSettings | None = None) -> tuple[str, dict[str, float], int, int]:
    """(node name: ``TAU_NODE_NAME``, else the short host name; capacity; GPUs; GPU memory MiB)."""
    given = given or settings.current().local
    node = given.node_name or socket.gethostname().split(".")[0] or "local"
    gpus, gpu_mem = declared_gpus(given) or nvml_gpus()
    capacity = {"cpu": float(os.cpu_count() or 1), "memory": float(psutil.virtual_memory().total), GPU: float(gpus)}
    return node, capacity, gpus, gpu_mem
