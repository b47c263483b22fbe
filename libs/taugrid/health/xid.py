"""The NVIDIA XID catalogue as data: code → mnemonic, NVIDIA resolution bucket, our severity and action.

Source: shared/reference/gpu-health.md §1.3 (NVIDIA's Ampere+ XID catalogue buckets, DCGM/EKS/device-plugin
guidance). Severity scale (ours, §7): 0 event only · 1 condition, alert · 2 condition + cordon (remediate at
idle) · 3 cordon + drain → GPU reset → validate · 4 cordon + drain → reboot/power-cycle → validate.

Invariant: application XIDs (13, 31, 43, 45, 68 …) are severity 0 — they never mark a node faulty. A code that
is not in the table is severity 1: surfaced as a condition for a human, but never drains a node on its own.
"""

from __future__ import annotations

from typing import NamedTuple


class XidInfo(NamedTuple):
    code: int
    mnemonic: str
    bucket: str  # NVIDIA's immediate resolution bucket
    severity: int  # 0..4, see module docstring
    action: str  # what an operator (or our ladder) does next


_ACTIONS = {
    0: "none: application error, the node is fine",
    1: "alert: watch for repeats",
    2: "cordon; reset the GPU when idle",
    3: "drain; reset the GPU, then validate",
    4: "drain; reboot or power-cycle the node, then validate; replace on recurrence",
}

# code: (mnemonic, bucket, severity)
_TABLE: dict[int, tuple[str, str, int]] = {
    8: ("FIFO idle timeout", "RESTART_APP", 0),
    13: ("graphics engine exception (application error)", "RESTART_APP", 0),
    31: ("GPU memory page fault (application error)", "RESTART_APP", 0),
    32: ("PBDMA error: corrupted push buffer", "RESTART_APP", 0),
    43: ("channel reset after an application fault", "IGNORE", 0),
    45: ("preemptive cleanup after previous errors", "WORKFLOW_XID_45", 0),
    46: ("GPU stopped processing (timeout)", "RESET_GPU", 3),
    48: ("double-bit (uncorrectable) ECC error", "WORKFLOW_XID_48", 3),
    54: ("auxiliary power not connected", "CHECK_MECHANICALS", 4),
    61: ("internal micro-controller breakpoint", "CONTACT_SUPPORT", 1),
    62: ("internal micro-controller halt", "RESET_GPU", 3),
    63: ("row remap / page retirement recorded (needs a reset)", "IGNORE", 2),
    64: ("row remap / page retirement failure", "RESET_GPU", 4),
    68: ("video decoder exception", "RESTART_APP", 0),
    69: ("graphics engine class error", "RESTART_APP", 0),
    74: ("NVLink error", "WORKFLOW_NVLINK_ERR", 3),
    79: ("GPU has fallen off the bus", "RESTART_BM", 4),
    92: ("excessive single-bit ECC interrupts", "IGNORE", 1),
    94: ("contained ECC error (reset pending)", "RESTART_APP", 2),
    95: ("uncontained ECC error", "RESET_GPU", 4),
    109: ("context switch timeout", "RESET_GPU", 1),
    110: ("security fault", "RESET_GPU", 3),
    119: ("GSP RPC timeout", "RESET_GPU", 3),
    120: ("GSP error", "RESET_GPU", 3),
    121: ("C2C corrected error", "IGNORE", 1),
    136: ("NVLink link training failed", "RESET_GPU", 3),
    140: ("unrecovered ECC error", "RESET_GPU", 3),
    143: ("GPU initialization error", "RESET_GPU", 3),
    154: ("GPU recovery action changed", "XID_154", 1),
    155: ("NVLink software-defined error", "RESET_GPU", 3),
    156: ("resource retirement event", "RESET_GPU", 2),
    158: ("GPU fatal timeout", "RESET_GPU", 3),
}
# NVLink5 unit errors: the sub-rule needs the decoded intrinfo; without it assume the fatal case.
for _code in range(144, 151):
    _TABLE[_code] = ("NVLink5 unit error", "WORKFLOW_NVLINK5_ERR", 3)

APP_XIDS = frozenset(code for code, (_, _, sev) in _TABLE.items() if sev == 0)


def classify(code: int) -> XidInfo:
    """What XID ``code`` means for the node; unknown codes are severity 1 (a human looks, nothing drains)."""
    mnemonic, bucket, severity = _TABLE.get(code, ("unknown XID", "UNKNOWN", 1))
    return XidInfo(code, mnemonic, bucket, severity, _ACTIONS[severity])


def describe(code: int) -> str:
    info = classify(code)
    return f"XID {code} ({info.mnemonic}; NVIDIA bucket {info.bucket}): {info.action}"
