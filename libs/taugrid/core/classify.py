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
    "requeuinglimitexceeded": "evicted",  # waitForPodsReady evicted it backoff_limit_count times, then gave up
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
    "sourcemismatch": "config",  # the source snapshot is not what was submitted (sources/snapshots.py)
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
    hint: str = ""  # what the researcher can do about a give-up


_RETRY_NAME_OF = {"app_error": "Error", "oom": "OOMKilled", "preempted": "Preempted", "evicted": "Evicted",
                  "timeout": "DeadlineExceeded", "hang": "Hang"}
_FIX = {
    "app_error": "the script raised or exited non-zero: fix the error in its output (`tau logs RUN`)",
    "oom": "the run used more memory than its limit: raise compute.memory_limit (or use less memory)",
    "timeout": "the attempt ran past its deadline: raise run.active_deadline",
    "hang": "the run printed nothing for resilience.hang_timeout: print progress more often or raise it",
}
CRASH_HINT = "add Error to resilience.retry_on to retry crashes"


def covers(retry_on: list[str], classification: str) -> bool:
    """Whether ``resilience.retry_on`` names ``classification`` (platform faults are always covered)."""
    names = set().union(*(_RETRY_NAMES.get(n.lower(), set()) for n in retry_on))
    return classification in names | _PLATFORM_FAULTS


def give_up_hint(classification: str, resilience: Resilience, *, retries_left: bool) -> str:
    """What to do after a give-up: list the class in ``retry_on`` when retries were allowed but the class was
    not, otherwise fix the cause (or allow more retries)."""
    if retries_left and not covers(resilience.retry_on, classification):
        if classification == "app_error":
            return CRASH_HINT
        name = _RETRY_NAME_OF.get(classification)
        if name:
            return f"add {name} to resilience.retry_on to retry {classification.replace('_', ' ')} failures"
    fix = _FIX.get(classification, "")
    if not retries_left and classification in ("preempted", "evicted", "gpu_fault", "node_failure", "unknown"):
        fix = "raise resilience.max_retries to retry it"
    return fix


def decide(*, reason: str, exit_code: int | None, attempt: int, resilience: Resilience,
           event_type: str = "") -> Decision:
    """Retry ``attempt`` (1-based, the one that just failed) or give up, and why."""
    cls = classify(reason, exit_code, event_type=event_type)
    exclude = cls in _PLATFORM_FAULTS
    if cls in _NEVER:
        return Decision(False, cls, 0.0, f"{reason or cls}: not retryable", exclude)
    if attempt > resilience.max_retries:
        why = f"{reason or cls}: no retries left ({resilience.max_retries} allowed)"
        return Decision(False, cls, 0.0, why, exclude, give_up_hint(cls, resilience, retries_left=False))
    if not covers(resilience.retry_on, cls):
        listed = ", ".join(resilience.retry_on) or "nothing"
        return Decision(False, cls, 0.0, f"{reason or cls}: not in resilience.retry_on ({listed})", exclude,
                        give_up_hint(cls, resilience, retries_left=True))
    delay = min(resilience.backoff_max_s, resilience.backoff_initial_s * 2 ** (attempt - 1))
    return Decision(True, cls, delay, reason or cls, exclude)
