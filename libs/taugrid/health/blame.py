"""Whose fault was a failed attempt: the node's (a GPU/node fault the health monitor saw) or the run's?

An XID 79 kills the process before the node agent's next sample reaches the health monitor, so the attempt's
``exec.failed`` (exit 1, ``BackoffLimitExceeded``) often reaches recovery before ``health.degraded``, or a drain's
stop reaches it as an eviction. Recovery asks this pure function, with the node's ``node_state`` record, before
it calls such a failure the application's: whatever order the events arrive in, a failure on a node that
turned unhealthy around that time is a platform fault (retried, the node excluded).

Rules: a drain-grade fault (severity ≥ 3, the grade that drains) active on the node and raised no later than
``settle_s`` after the failure blames the node. With no such fault yet, if no sample of the node has reached
the monitor since the failure and the failure is younger than ``settle_s``, the answer is "wait" (recovery asks
again shortly); a node no agent watches (no record) or a clean sample after the failure leaves it to the run.
An agent publishes a fault at its next sample but a quiet node only heartbeats (``health.change``), so on a
healthy node the wait is the whole ``settle_s``: a sample that says nothing changed is never published.

Only a failure a node fault can cause unseen waits (``may_wait``): a sudden death (a crash or an unexplained end)
of a run that used the node's GPUs or spanned nodes (an InfiniBand fault kills multi-node work). A run without
GPUs on one node, a memory kill, a deadline, a hang (the fault, if any, came first and is already on record)
are judged at once on what the node's record already holds, so their decision never waits for a sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from taugrid.core.contracts import ResolvedRun
from taugrid.health.wire import NodeState

DRAIN_SEVERITY = 3
# Classes (core.classify) a node fault may hide behind until the node's next sample: the process just died.
SUDDEN_DEATHS = frozenset({"app_error", "unknown"})


@dataclass(frozen=True)
class Blame:
    verdict: Literal["node", "run", "wait"]
    condition: str = ""
    message: str = ""


def blame(state: NodeState | None, *, failed_at: float, now: float, settle_s: float) -> Blame:
    if state is None:
        return Blame("run")
    faults = sorted((c for c in state.conditions.values()
                     if c.status == "True" and c.severity >= DRAIN_SEVERITY and c.since <= failed_at + settle_s),
                    key=lambda c: (-c.severity, c.since))
    if faults:
        worst = faults[0]
        return Blame("node", worst.type, worst.message)
    if state.last_sample < failed_at and now - failed_at < settle_s:
        return Blame("wait", message=f"node {state.node} has not been sampled since the failure")
    return Blame("run")


def may_wait(run: ResolvedRun, classification: str) -> bool:
    """Whether a failure of ``run`` classed ``classification`` may be a node fault not yet sampled: a sudden
    death of a run on the node's GPUs or across nodes. Otherwise ``blame`` is asked with ``settle_s=0``."""
    if classification not in SUDDEN_DEATHS:
        return False
    res = run.resources
    gpus = res.gpu > 0 or res.gpu_fraction > 0 or run.gpus_per_worker > 0 or bool(run.devices)
    return gpus or run.nodes > 1 or run.workers > 0
