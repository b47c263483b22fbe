"""What this machine offers the local cluster: CPUs, memory and GPUs (NVML, or declared for tests)."""

from __future__ import annotations

import os
import socket

import psutil

GPU = "nvidia.com/gpu"


def declared_gpus() -> tuple[int, int] | None:
    """``TAU_DECLARED_GPUS=2`` or ``2x80000`` (count × memory MiB): simulate GPUs where none exist."""
    raw = os.environ.get("TAU_DECLARED_GPUS", "").strip()
    if not raw:
        return None
    count, _, mem = raw.partition("x")
    return int(count), int(mem or 81920)


def nvml_gpus() -> tuple[int, int]:
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


def inventory() -> tuple[str, dict[str, float], int, int]:
    node = os.environ.get("TAU_NODE_NAME") or socket.gethostname().split(".")[0] or "local"
    gpus, gpu_mem = declared_gpus() or nvml_gpus()
    capacity = {"cpu": float(os.cpu_count() or 1), "memory": float(psutil.virtual_memory().total), GPU: float(gpus)}
    return node, capacity, gpus, gpu_mem
