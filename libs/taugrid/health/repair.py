"""Repair as an action (pure): which step a drained node needs next, with a retry budget per node.

The ladder follows the fault catalogue (shared/reference/gpu-health.md §7), per fault class (``LADDERS``) and
otherwise by severity: a drain-grade GPU fault (severity 3: uncorrectable ECC, XID 48/74/119/140, NVLink …) is
repaired by a **GPU reset**, escalating to a **node reboot** when the reset did not clear it; a severity-4 or
node-wide fault (XID 79 "fallen off the bus", uncontained ECC, row-remap failure, a missing GPU, an IB port drop)
goes straight to a **node reboot**. Once ``budget`` steps were spent on the node without a passed
validation, the next step is **replace-node**: the node stays cordoned for a human.

One step at a time: a new one is asked only when none is outstanding, the node is drained and still faulty, and
``retry_s`` passed since the last one ended (time for clean samples to show). The node agent carries steps out
(``agent.NodeAgent.repair_if_asked``) and reports each as ``node.<n>.repair``; the monitor folds the report in.
"""

from __future__ import annotations

from taugrid.health.wire import NodeRepair, NodeState

STEPS = ("gpu-reset", "node-reboot", "replace-node")
RESET_SEVERITY, REBOOT_SEVERITY = 3, 4
GPU_LADDER: tuple[str, ...] = ("gpu-reset", "node-reboot")
NODE_LADDER: tuple[str, ...] = ("node-reboot",)

# Per fault class (condition type), the steps in order; a class not listed follows its severity (above). A
# deployment can plug its own: pass ``ladders`` to ``next_step`` (e.g. an IB port drop → a driver reload step its
# agents know, see ``agent.NodeAgent(repairs=...)``).
LADDERS: dict[str, tuple[str, ...]] = {
    "GpuEccUncorrectable": GPU_LADDER,  # F04/F15: drain → reset → validate
    "GpuFatalError": GPU_LADDER,  # AMD fatal RAS record, Gaudi critical event: reset first (health.vendorcodes)
    "GpuRmaRequired": ("replace-node",),  # AMD bad-page table past its threshold: no reset brings pages back
    "GpuNvlinkError": GPU_LADDER,  # F12: drain → reset → NVLink check
    "GpuNvlinkDown": GPU_LADDER,  # F13
    "GpuRemappedRowsFailure": NODE_LADDER,  # F06: reboot, replacement on recurrence
    "GpuMissing": NODE_LADDER,  # F11
    "NvmlUnavailable": NODE_LADDER,  # F25: driver unresponsive
    "IbPortDown": NODE_LADDER,
    "IbLinkErrors": NODE_LADDER,
}


def _faults(st: NodeState) -> list[tuple[int, int | None, str]]:
    return [(c.severity, c.gpu, c.type) for c in st.conditions.values()
            if c.status == "True" and c.severity >= RESET_SEVERITY]


def ladder_for(faults: list[tuple[int, int | None, str]], ladders: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The ladder of the worst fault (ties: the one whose ladder starts further up, the more drastic)."""
    def ladder(sev: int, gpu: int | None, ctype: str) -> tuple[str, ...]:
        if ctype in ladders:
            return ladders[ctype]
        return NODE_LADDER if sev >= REBOOT_SEVERITY or gpu is None else GPU_LADDER

    worst = max(faults, key=lambda f: (f[0], len(GPU_LADDER) - len(ladder(*f))))
    return ladder(*worst)


def next_step(st: NodeState, *, now: float, budget: int, retry_s: float,
              ladders: dict[str, tuple[str, ...]] | None = None) -> tuple[str, list[int]]:
    """The step to ask for now (and the GPUs it is about), or ("", [])."""
    faults = _faults(st)
    if not st.drained or not faults or st.repair_wanted or st.last_repair.startswith("replace-node"):
        return "", []
    if st.last_repair_time and now - st.last_repair_time < retry_s:
        return "", []
    gpus = sorted({g for _, g, _ in faults if g is not None})
    if st.repairs >= budget:
        return "replace-node", gpus
    ladder = ladder_for(faults, LADDERS if ladders is None else ladders)
    return ladder[min(st.repairs, len(ladder) - 1)], gpus


def ask(st: NodeState, step: str, gpus: list[int], now: float) -> None:
    st.repairs += 1
    st.repair_wanted, st.repair_wanted_since, st.repair_gpus = step, now, gpus


def fold(st: NodeState, result: NodeRepair | None) -> bool:
    """Record the agent's report of the outstanding step; True when it closed one."""
    if not st.repair_wanted or result is None or result.attempt != st.repairs or result.step != st.repair_wanted:
        return False
    st.repair_wanted, st.repair_wanted_since = "", 0.0
    st.last_repair, st.last_repair_time = f"{result.step}: {result.outcome}", result.time
    return True


def released(st: NodeState) -> None:
    """A passed validation: the node is whole again and its budget starts over."""
    st.repairs, st.repair_wanted, st.repair_wanted_since, st.repair_gpus = 0, "", 0.0, []
