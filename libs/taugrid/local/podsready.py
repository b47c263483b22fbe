"""Kueue's waitForPodsReady on the local cluster, as pure decisions: is an admitted workload ready, has it run
out of time, how long its requeue waits, whether admission is blocked. No I/O and no clock: ``now`` and the
jitter's random draw are arguments (the controller passes ``time.time()`` and ``random.random()``).

Ported from Kueue v0.19.2 (read, not copied): ``WorkloadReconciler.reconcileNotReadyTimeout`` (evict with
``PodsReadyTimeout``, "Exceeded the PodsReady timeout <ns>/<name>", or deactivate once the requeue count would
pass ``backoffLimitCount``), ``workload.UpdateRequeueState`` (the n-th requeue waits ``base * 2^(n-1)``, capped at
``backoffMaxSeconds``, plus Kueue's jitter of up to 0.0001 of that wait), ``Job.PodsReady`` (ready + succeeded
pods reach the count) and ``Scheduler.waitForPodsReadyIfNeeded`` (blockAdmission).

Invariants: a workload that reached PodsReady is never timed out again (locally a failed pod fails its Job, so
no workload waits for a replacement and the recovery timeout has nothing to time); the requeue count is the
workload's own (Kueue's ``status.requeueState.count``), apart from preemptions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from taugrid.config.podsready import WaitForPodsReady

JITTER = 0.0001  # Kueue: wait.NewBackoff(base, max, 2, 0.0001)
# Kueue's cap when backoffMaxSeconds is 0: math.MaxInt64 / ceil(factor) nanoseconds.
UNCAPPED_S = ((2**63 - 1) // 2) / 1e9
READY_PHASES = ("Running", "Succeeded")

# Kueue's condition words.
TIMEOUT_REASON = "PodsReadyTimeout"
DEACTIVATED_REASON = "DeactivatedDueToRequeuingLimitExceeded"  # Evicted; underlying cause RequeuingLimitExceeded
LIMIT_REASON = "RequeuingLimitExceeded"
DEACTIVATED_MESSAGE = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
WAITING_REASON = "WaitingForPodsReady"
WAITING_MESSAGE = "waiting for all admitted workloads to be in PodsReady condition"
WAIT_FOR_START = "WaitForStart"
NOT_READY_MESSAGE = "Not all pods are ready or succeeded"
STARTED = "Started"
READY_MESSAGE = "All pods reached readiness and the workload is running"
BACKOFF_FINISHED = "BackoffFinished"
BACKOFF_FINISHED_MESSAGE = "The workload backoff was finished"


def timeout_message(namespace: str, name: str) -> str:
    """Kueue names the Workload as its reconcile request prints it: ``<namespace>/<name>``."""
    return f"Exceeded the PodsReady timeout {namespace}/{name}"


def backoff_s(count: int, *, base_s: float, max_s: float, draw: float = 0.0) -> float:
    """The wait before a workload's ``count``-th requeue (1-based), as Kueue's ``Backoff.WaitTime(count)``: the
    first wait is the base even above the cap, each next one doubles up to the cap (0: none); ``draw`` in [0, 1)
    adds Kueue's jitter (``draw * 0.0001`` of the wait)."""
    if count <= 0:
        return 0.0
    cap = max_s if max_s > 0 else UNCAPPED_S
    wait = float(base_s)
    for _ in range(count - 1):
        wait = min(wait * 2, cap)
        if wait in (0.0, cap):  # every later wait is the same
            break
    return wait * (1 + draw * JITTER)


def pods_ready(phases: Iterable[str], wanted: int) -> bool:
    """Kueue's ``Job.PodsReady``: ready (running) plus succeeded pods reach the workload's pod count."""
    return sum(1 for p in phases if p in READY_PHASES) >= wanted


@dataclass(frozen=True)
class Waiting:
    """Not ready yet, within its timeout; look again at ``due``."""

    due: float


@dataclass(frozen=True)
class Evict:
    """Timed out: evict it, requeue it at ``requeue_at`` as its ``count``-th requeue."""

    count: int
    requeue_at: float
    message: str


@dataclass(frozen=True)
class Deactivate:
    """Timed out with no requeue left: deactivate it (locally: its run fails)."""

    count: int
    message: str


def verdict(rule: WaitForPodsReady, *, admitted_at: float, count: int, now: float, namespace: str, name: str,
            draw: float = 0.0) -> Waiting | Evict | Deactivate | None:
    """For an admitted workload that is not ready: wait, evict or deactivate (``None`` when the check is off).
    ``count`` is how many times it was requeued for this before (Kueue's ``requeueState.count``)."""
    if not rule.enable:
        return None
    due = admitted_at + rule.timeout
    if now < due:
        return Waiting(due)
    strategy = rule.requeuing_strategy
    limit = strategy.backoff_limit_count
    if limit is not None and count + 1 > limit:  # Kueue's triggerDeactivation
        return Deactivate(count, f"{DEACTIVATED_MESSAGE} ({count} requeue(s) after "
                                 f"{TIMEOUT_REASON}, backoff_limit_count {limit})")
    wait = backoff_s(count + 1, base_s=strategy.backoff_base_seconds, max_s=strategy.backoff_max_seconds,
                     draw=draw)
    return Evict(count + 1, now + wait, timeout_message(namespace, name))


def queued_at(rule: WaitForPodsReady, *, created: float, evicted_at: float) -> float:
    """The requeued workload's place in its queue: Kueue's ``requeuingStrategy.timestamp``."""
    return created if rule.requeuing_strategy.timestamp == "Creation" else evicted_at


def blocks_admission(rule: WaitForPodsReady, not_ready: int) -> bool:
    """Kueue's blockAdmission: nothing is admitted while some admitted workload is not ready."""
    return rule.enable and rule.block_admission and not_ready > 0
