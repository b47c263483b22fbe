"""GPU vendor libraries, asked before they are imported: whether NVIDIA's management library (NVML) loads here.

Both readers of NVML need it (the local cluster's inventory, ``local.machine``, and the node agent's probe,
``health.nvml``), so it lives below both, and the health monitor needs nothing of the local backend. Checked before
``import pynvml``, since that module alone is about 17 MB resident (its ctypes structures), which a machine without
the NVIDIA driver, and so every service on it that asks, would carry for nothing."""

from __future__ import annotations

import ctypes
import sys

NVML_LIBRARY = "libnvidia-ml.so.1"  # the name pynvml itself loads on Linux


def nvml_library_missing() -> str:
    """Why NVML cannot work here ("" when its library loads)."""
    if not sys.platform.startswith("linux"):
        return ""  # pynvml looks elsewhere (nvml.dll); let it say
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        return f"NVML Shared Library Not Found ({exc})"
    return ""
