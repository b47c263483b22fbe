"""The command a run's container (or host process) executes, by engine and launcher (``taugrid.md`` §1.4).

Invariants: the script's own ``args`` always come last, untouched; ``execution.configs`` become
``--key=value`` flags (script flags for ``python``/commands, torchrun flags for ``torchrun``); multi-node
torchrun reads ``$(MASTER_ADDR)``, ``$(MASTER_PORT)`` and ``$(JOB_COMPLETION_INDEX)``, which the renderer
provides; a Ray run's RayJob entrypoint is ``shlex.join(command)``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from typing import Any

from taugrid.config.elastic import elastic_bounds
from taugrid.config.taujob import TauConfig

Add = Callable[..., None]


def _flags(configs: dict[str, Any]) -> list[str]:
    out = []
    for key, value in configs.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out.append(f"--{key}={value if isinstance(value, (str, int, float)) else json.dumps(value)}")
    return out


# Restarts of the worker group torchrun allows: a node leaving (an elastic shrink) costs one, a node joining none.
ELASTIC_MAX_RESTARTS = 100


# The environment of an elastic torchrun run's pods. With torchrun's default shared TCPStore, an agent keeps the
# MASTER_ADDR/PORT it read in its first round, so rank 0 never writes them for a later round: a pod that joins in a
# growth waits for them until the store's 60 s timeout and the run fails (torch 2.13's
# DynamicRendezvousHandler.next_rendezvous). Without the sharing, every round publishes them afresh.
ELASTIC_TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def elastic_torchrun(low: int, high: int, nproc: int, endpoint: str) -> list[str]:
    """torchrun flags of an elastic run: ``--nnodes=MIN:MAX`` with a c10d rendezvous at ``endpoint`` (pod 0's,
    which an elastic shrink never removes); a membership change restarts every worker at the new world size,
    and the script resumes from its last checkpoint."""
    return [f"--nnodes={low}:{high}", f"--nproc_per_node={nproc}", f"--max-restarts={ELASTIC_MAX_RESTARTS}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}"]


def build_command(cfg: TauConfig, gpu: int, add: Add) -> tuple[str, list[str], int]:
    """``(launcher, command, processes_per_node)`` for one pod of the run; ``gpu`` is its whole-GPU count."""
    ep, args, ex = cfg.entrypoint or "", [str(a) for a in cfg.args], cfg.execution
    if cfg.engine == "ray":
        scaling = ex.configs.get("scaling_config")
        if isinstance(scaling, dict) and {"num_workers", "resources_per_worker"} & set(scaling):
            add(
                ("execution", "configs", "scaling_config"),
                "num_workers and resources_per_worker are set "
                "by taugrid from compute.workers and the worker resources",
                "remove them",
            )
        # the RayJob entrypoint is shlex.join(command); Ray Train/Tune configs travel separately
        return ex.launcher or "ray-train", ["python", ep, *args], 1
    launcher = ex.launcher or ("python" if ep.endswith(".py") else "command")
    if launcher == "torchrun":
        nproc = ex.processes_per_node or max(1, gpu)
        if ex.processes_per_node and gpu > 0 and nproc > gpu:
            add(
                ("execution", "processes_per_node"),
                f"{nproc} processes on {gpu} GPU(s) per node",
                f"set processes_per_node to {gpu} or fewer",
            )
        head = ["python3", "-m", "torch.distributed.run"]
        bounds = elastic_bounds(cfg)
        if bounds is not None:  # torchrun's elastic mode: ranks come from the c10d rendezvous, not the index
            head += elastic_torchrun(bounds[0], bounds[1], nproc, "$(MASTER_ADDR):$(MASTER_PORT)")
        elif ex.nodes == 1:
            head += ["--standalone", f"--nproc_per_node={nproc}"]
        else:  # the renderer sets MASTER_ADDR/MASTER_PORT and the Indexed Job's completion index
            head += [
                f"--nnodes={ex.nodes}",
                f"--nproc_per_node={nproc}",
                "--node_rank=$(JOB_COMPLETION_INDEX)",
                "--rdzv_backend=c10d",
                "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
            ]
        return launcher, [*head, *_flags(ex.configs), ep, *args], nproc
    if launcher == "python":
        return launcher, ["python3", ep, *_flags(ex.configs), *args], 1
    if any(ch.isspace() for ch in ep):
        return "command", ["sh", "-c", " ".join([ep, *map(shlex.quote, [*_flags(ex.configs), *args])])], 1
    return "command", [ep, *_flags(ex.configs), *args], 1
