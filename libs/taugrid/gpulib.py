"""GPU vendor libraries, asked before they are imported: whether NVIDIA's management library (NVML) loads here;
and, where it does not, which GPUs AMD's or Intel Gaudi's tool lists (``vendor_tool_gpus``).

Both readers of NVML need it (the local cluster's inventory, ``local.machine``, and the node agent's probe,
``health.nvml``), so it lives below both, and the health monitor needs nothing of the local backend. Checked before
``import pynvml``, since that module alone is about 17 MB resident (its ctypes structures), which a machine without
the NVIDIA driver, and so every service on it that asks, would carry for nothing."""

from __future__ import annotations

import csv
import ctypes
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

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


# The same commands the node agent's probes run (health/smi.py), asked here only for a count and memory.
AMD_SMI_METRIC = ["amd-smi", "metric", "--json"]
HL_SMI_MEMORY = ["hl-smi", "-Q", "index,memory.total", "-f", "csv,noheader,nounits"]
Runner = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=20.0).stdout


def _amd_memory_mib(row: dict[str, Any]) -> int:
    usage = row.get("mem_usage")
    total = usage.get("total_vram") if isinstance(usage, dict) else None
    value: Any = total.get("value") if isinstance(total, dict) else total
    unit = str(total.get("unit", "MB")).upper() if isinstance(total, dict) else "MB"
    try:
        number = float(value)
    except (TypeError, ValueError):  # "N/A" or absent: no size known
        return 0
    return int(number * {"B": 1 / (1 << 20), "KB": 1 / 1024, "MB": 1, "GB": 1024}.get(unit, 1))


def vendor_tool_gpus(runner: Runner | None = None) -> tuple[str, int, int] | None:
    """(vendor, GPUs, the smallest one's memory in MiB) as AMD's ``amd-smi`` or Gaudi's ``hl-smi`` lists them,
    whichever is on this machine; None when neither is or neither lists a device (a tool that fails is no GPU)."""
    run = runner or _run
    if runner is not None or shutil.which("amd-smi"):
        try:
            doc = json.loads(run(list(AMD_SMI_METRIC)))
            rows = [r for r in (doc.get("gpu_data", []) if isinstance(doc, dict) else doc) if isinstance(r, dict)]
        except (OSError, subprocess.SubprocessError, ValueError):
            rows = []
        if rows:
            return "amd", len(rows), min(_amd_memory_mib(r) for r in rows)
    if runner is not None or shutil.which("hl-smi"):
        try:
            cells = [[c.strip() for c in row] for row in csv.reader(io.StringIO(run(list(HL_SMI_MEMORY))))]
        except (OSError, subprocess.SubprocessError, ValueError):
            cells = []
        sizes = [int(row[1]) for row in cells if len(row) >= 2 and row[0].isdigit() and row[1].isdigit()]
        if sizes:
            return "intel-gaudi", len(sizes), min(sizes)
    return None
