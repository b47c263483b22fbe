"""The default platform for this one machine: what `tau up` applies when no platform exists yet, and what
`tau run validate` checks against when no stack answers. Its quotas come from this machine (CPUs, memory, GPUs
from ``TAU_DECLARED_GPUS``, NVML, or AMD's or Gaudi's tool, under their vendor's resource); run outputs go under
the data directory."""

from __future__ import annotations

import os
from pathlib import Path


def machine_platform_yaml(data_dir: Path) -> str:
    """The default policy for this one machine, with run outputs kept under the data directory."""
    import psutil
    import yaml

    from taugrid.config.machine import default_platform
    from taugrid.local.machine import machine_gpus

    count, _, resource = machine_gpus()
    platform = default_platform(os.cpu_count() or 1, psutil.virtual_memory().total,
                                [f"gpu{i}" for i in range(count)], output_root=str(data_dir / "outputs"),
                                gpu_resource=resource)
    data = platform.model_dump(mode="json", exclude_none=True)
    return "# derived from this machine by `tau up`; replace with `tau platform apply FILE`\n" + yaml.safe_dump(
        data, sort_keys=False)
