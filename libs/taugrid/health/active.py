"""The active part of re-validation, and the GPU reset a repair performs: things done *to* a GPU, not read from it.

``burn_check`` is a short memory-pattern and matmul test per GPU through PyTorch's CUDA where it is importable
(a write/read-back of a pattern over ``memory_mb`` and repeated matmuls for ``seconds``, compared with the first
result: a GPU that corrupts memory or computes inconsistently fails). Where no CUDA library is importable it says
so, and validation is the passive NVML read alone. ``gpu_reset`` runs ``nvidia-smi --gpu-reset -i N`` where the
tool exists, and refuses while any process holds the GPU (a reset would kill it).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any


def burn_check(indices: list[int], *, seconds: float = 2.0, memory_mb: int = 256) -> tuple[bool | None, str]:
    """(ok, detail); ok is None when no active check can run here (no CUDA library)."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None, "no CUDA library (torch) for an active check"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    problems: list[str] = []
    for i in indices:
        try:
            problems += _burn_one(torch, i, seconds, memory_mb)
        except Exception as exc:  # a dying GPU raises CUDA errors: that is the finding
            problems.append(f"GPU {i}: {exc!r}")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(indices)} GPU(s) passed a {seconds:g}s matmul burn and a {memory_mb} MiB memory pattern check"


def _burn_one(torch: Any, index: int, seconds: float, memory_mb: int) -> list[str]:
    dev = torch.device(f"cuda:{index}")
    n = memory_mb * (1 << 20) // 4
    pattern = torch.arange(n, dtype=torch.int32, device=dev) ^ 0x5A5A5A5A
    if not bool((pattern ^ 0x5A5A5A5A).eq(torch.arange(n, dtype=torch.int32, device=dev)).all()):
        return [f"GPU {index}: memory pattern read back wrong"]
    del pattern
    gen = torch.Generator(device=dev).manual_seed(1234)
    a = torch.randn(2048, 2048, device=dev, generator=gen)
    first = a @ a
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline:
        again = a @ a
        rounds += 1
        if not torch.equal(again, first) or not bool(torch.isfinite(again).all()):
            return [f"GPU {index}: matmul result changed after {rounds} round(s)"]
    torch.cuda.synchronize(dev)
    return []


def gpu_reset(index: int, *, busy: bool) -> tuple[bool, str]:
    """Reset one GPU with nvidia-smi; (ok, outcome)."""
    if busy:
        return False, f"GPU {index} is in use by a process: not reset"
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return False, "nvidia-smi not found: GPU reset unavailable here"
    try:
        done = subprocess.run([tool, "--gpu-reset", "-i", str(index)], capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired:
        return False, f"nvidia-smi --gpu-reset -i {index} timed out"
    text = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, (text[-1] if text else f"exit {done.returncode}")
