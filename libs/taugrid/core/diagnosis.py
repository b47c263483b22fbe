"""Why a run ended the way it did, and what to do next (``tau diagnose``); pure.

The inputs are what the bus already holds: the run record, the facts its events carry (rejections,
preemptions, health degradations, the give-up), the last lines of its output and its node's health verdict now.
The cause is decided in the order a person would look: rejected before it ran, cancelled, a platform fault (GPU
or node) before the script's own failure, memory, signals, deadlines, silence, then the script's exit code.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from taugrid.core.classify import CRASH_HINT, classify
from taugrid.core.contracts import Issue, RecoveryGaveUp
from taugrid.core.quantity import human_bytes
from taugrid.core.states import RunRecord


@dataclass(frozen=True)
class RunFacts:
    """What the run's events say, beyond its record."""

    rejected: list[Issue] = field(default_factory=list)
    preempted_by: list[str] = field(default_factory=list)  # preemptor (or reason) per preemption
    degraded: list[tuple[str, str, str]] = field(default_factory=list)  # (node, condition, message)
    gave_up: RecoveryGaveUp | None = None
    last_lines: list[str] = field(default_factory=list)
    node_verdict: str = ""  # the node's health now (healthy | degraded | unhealthy), "" when unknown


@dataclass(frozen=True)
class Diagnosis:
    run_id: str
    state: str
    classification: str  # classify()'s class of the failure; "" when the run did not fail
    cause: str
    next_step: str
    facts: dict[str, str]
    last_lines: list[str]


def signal_name(exit_code: int | None) -> str:
    """``SIGKILL`` for 137 (128 + 9), as shells report a process killed by a signal; "" otherwise."""
    if exit_code is None or exit_code <= 128:
        return ""
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return ""


def _facts(record: RunRecord, facts: RunFacts) -> dict[str, str]:
    out = {"state": record.state, "attempts": str(record.attempt)}
    if record.reason:
        out["reason"] = record.reason
    if record.exit_code is not None:
        out["exit code"] = str(record.exit_code)
        if signal_name(record.exit_code):
            out["signal"] = signal_name(record.exit_code)
    if record.node:
        out["node"] = record.node + (f" (now {facts.node_verdict})" if facts.node_verdict else "")
    if record.exclude_nodes:
        out["avoided nodes"] = ", ".join(record.exclude_nodes)
    if facts.preempted_by:
        out["preempted"] = f"{len(facts.preempted_by)}× ({', '.join(dict.fromkeys(facts.preempted_by))})"
    if facts.degraded:
        out["node faults"] = "; ".join(f"{n}: {c}" for n, c, _ in facts.degraded)
    return out


def diagnose(record: RunRecord, facts: RunFacts) -> Diagnosis:
    resolved = record.resolved
    limit = resolved.limits.memory if resolved and resolved.limits else 0

    def done(classification: str, cause: str, next_step: str) -> Diagnosis:
        return Diagnosis(record.run_id, record.state, classification, cause, next_step, _facts(record, facts),
                         facts.last_lines)

    if record.state == "succeeded":
        return done("", "it succeeded", f"its outputs: `tau outputs {record.run_id}`")
    if record.state == "rejected":
        reasons = "; ".join(f"{i.field}: {i.message}" for i in facts.rejected) or record.message
        fixes = "; ".join(i.fix for i in facts.rejected if i.fix)
        return done("config", f"rejected before it ran: {reasons}",
                    (fixes + "; then " if fixes else "fix the config, then ") + "`tau run validate` and submit again")
    if record.state == "cancelled":
        who = f" by {record.cancelled_by}" if record.cancelled_by else ""
        return done("cancelled", f"cancelled{who}", f"`tau run retry {record.run_id}` runs it again")
    if record.state not in ("failed",):
        where = f" ({record.message})" if record.message else ""
        return done("", f"it has not finished: {record.state}{where}",
                    f"`tau status {record.run_id}` shows each phase; `tau logs {record.run_id} -f` follows it")

    cls = facts.gave_up.classification if facts.gave_up else classify(record.reason, record.exit_code)
    retry = f"`tau run retry {record.run_id}`"  # the same config and code again: nothing of theirs to change
    edited = f"`tau run retry {record.run_id} --from .` in the project folder"  # what they edit is what runs
    if facts.degraded or cls in ("gpu_fault", "node_failure"):
        node, condition, message = facts.degraded[-1] if facts.degraded else (record.node, record.reason, "")
        detail = f": {message}" if message else ""
        return done(cls if cls in ("gpu_fault", "node_failure") else "gpu_fault",
                    f"a fault of node {node or '?'} ({condition}{detail}), not of the script",
                    f"the platform retries platform faults on another node while resilience.max_retries allows; "
                    f"raise it, or {retry} (the node is avoided)")
    if cls == "oom":
        bound = f" of {human_bytes(limit)}" if limit else ""
        return done(cls, f"killed for using more memory than its limit{bound} (OOMKilled)",
                    "raise compute.memory_limit in tau.yaml (or use less memory, e.g. a smaller batch); then "
                    f"{edited} (`tau run resume {record.run_id} --from .` to start from its last checkpoint)")
    if cls in ("preempted", "evicted"):
        by = f" by {facts.preempted_by[-1]}" if facts.preempted_by else ""
        return done(cls, f"{'preempted' if cls == 'preempted' else 'evicted'}{by} and not retried",
                    "add Preempted to resilience.retry_on (with max_retries) so it is requeued, or use a higher "
                    f"policy.workload_priority_class, then {edited}; {retry} runs it again as it was")
    if cls == "timeout":
        deadline = f" ({resolved.active_deadline_s:g} s)" if resolved and resolved.active_deadline_s else ""
        return done(cls, f"ran past its deadline{deadline}", f"raise run.active_deadline, then {edited}")
    if cls == "hang":
        return done(cls, "printed nothing for resilience.hang_timeout and was stopped as hung",
                    f"print progress more often, or raise resilience.hang_timeout; then {edited}")
    if cls == "config":
        return done(cls, f"could not start: {record.reason}{': ' + record.message if record.message else ''}",
                    f"fix what it names (image, environment, secrets), then {edited}")
    sig = signal_name(record.exit_code)
    if sig:
        outside = "SIGKILL without OOMKilled: something outside killed it (a limit, an operator); "
        return done(cls, f"the script was killed by {sig} (exit code {record.exit_code})",
                    f"{outside if sig == 'SIGKILL' else ''}see the last lines below and `tau logs {record.run_id}`; "
                    f"then {edited}")
    if record.exit_code not in (None, 0):
        # Recovery's give-up hint adds something only when it is the retry_on one; its generic fix is ours below.
        hint = CRASH_HINT if facts.gave_up and facts.gave_up.hint == CRASH_HINT else ""
        return done(cls, f"the script exited with code {record.exit_code}",
                    (f"{hint}; " if hint else "") + f"fix the error its last lines show, then {edited}")
    return done(cls, f"{record.reason or 'failed'}{': ' + record.message if record.message else ''}",
                (record.hint + "; " if record.hint else "") + f"`tau logs {record.run_id}`; then {edited}")
