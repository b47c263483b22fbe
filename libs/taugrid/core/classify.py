"""Failure diagnosis and the retry decision (pure).

Classes: app_error, oom, gpu_fault, node_failure, preempted, evicted, timeout, hang, cancelled, config, unknown.
``resilience.retry_on`` names Kubernetes-style reasons (Preempted, Evicted, OOMKilled, Error, DeadlineExceeded,
GpuFault, NodeFailure, Hang) or ``Any``. GPU and node faults are the platform's fault, not the user's: they are
retried whenever retries remain, on another node, even if ``retry_on`` does not list them.
"""

from __future__ import annotations

from dataclasses import dataclass

from taugrid.core.contracts import Resilience

_BY_REASON = {
    "oomkilled": "oom",
    "preempted": "preempted",
    "inclusterqueue": "preempted",
    "incohortreclamation": "preempted",
    "incohortfairsharing": "preempted",
    "incohortreclaimwhileborrowing": "preempted",
    "evicted": "evicted",
    "podsreadytimeout": "evicted",
    "deadlineexceeded": "timeout",
    "gpufault": "gpu_fault",
    "xid": "gpu_fault",
    "nodefailure": "node_failure",
    "nodelost": "node_failure",
    "hang": "hang",
    "error": "app_error",
    "backofflimitexceeded": "app_error",
    "imagepullbackoff": "config",
    "errimagepull": "config",
    "invalidimagename": "config",
    "createcontainerconfigerror": "config",
    "environmentfailed": "config",  # the run's Python environment could not be built: the requirements
    "deleted": "cancelled",
    "cancelled": "cancelled",
}

# retry_on vocabulary → classes it covers
_RETRY_NAMES = {
    "preempted": {"preempted"},
    "evicted": {"evicted"},
    "oomkilled": {"oom"},
    "error": {"app_error"},
    "deadlineexceeded": {"timeout"},
    "gpufault": {"gpu_fault"},
    "nodefailure": {"node_failure"},
    "hang": {"hang"},
    "any": {"app_error", "oom", "preempted", "evicted", "timeout", "hang", "unknown", "gpu_fault", "node_failure"},
}
RETRY_ON_VALUES = ("Preempted", "Evicted", "OOMKilled", "Error", "DeadlineExceeded", "GpuFault", "NodeFailure",
                   "Hang", "Any")
_PLATFORM_FAULTS = {"gpu_fault", "node_failure"}
_NEVER = {"cancelled", "config"}


def classify(reason: str, exit_code: int | None = None, *, event_type: str = "") -> str:
    if event_type == "health.degraded":
        return "gpu_fault"
    cls = _BY_REASON.get(reason.replace("_", "").replace("-", "").lower())
    if cls:
        return cls
    if exit_code == 137:
        return "oom" if "oom" in reason.lower() else "app_error"
    if exit_code not in (None, 0):
        return "app_error"
    return "unknown"


@dataclass(frozen=True)
class Decision:
    retry: bool
    classification: str
    delay_s: float
    reason: str
    exclude_node: bool = False


def decide(*, reason: str, exit_code: int | None, attempt: int, resilience: Resilience,
           event_type: str = "") -> Decision:
    """Retry ``attempt`` (1-based, the one that just failed) or give up, and why."""
    cls = classify(reason, exit_code, event_type=event_type)
    exclude = cls in _PLATFORM_FAULTS
    if cls in _NEVER:
        return Decision(False, cls, 0.0, f"{reason or cls}: not retryable", exclude)
    if attempt > resilience.max_retries:
        why = f"{reason or cls}: no retries left ({resilience.max_retries} allowed)"
        return Decision(False, cls, 0.0, why, exclude)
    covered = set().union(*(_RETRY_NAMES.get(n.lower(), set()) for n in resilience.retry_on)) | _PLATFORM_FAULTS
    if cls not in covered:
        listed = ", ".join(resilience.retry_on) or "nothing"
        return Decision(False, cls, 0.0, f"{reason or cls}: not in resilience.retry_on ({listed})", exclude)
    delay = min(resilience.backoff_max_s, resilience.backoff_initial_s * 2 ** (attempt - 1))
    return Decision(True, cls, delay, reason or cls, exclude)
