"""Researcher-facing explanation of one workload's admission state.

Role: turn the engine's view (queue position, flavor assignment shortfalls, the victims a preemption would
take) into a few plain sentences: which resource, which flavor, how many are ahead, what would be preempted,
and what to do about it. Read-only: the dry-run preemption plan leaves the ledger as it found it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .nominate import Mode, fmt
from .queues import ADMITTED
from .results import TOPOLOGY_PLACEMENT_FAILED

if TYPE_CHECKING:
    from .engine import Engine


def explain(engine: Engine, name: str) -> str:
    ws = engine._get(name)
    q = engine.queues[ws.cq]
    if ws.status == ADMITTED and ws.admission is not None:
        adm = ws.admission
        flavors = ", ".join(f"{r} in {f}" for r, f in sorted(adm.flavors.items())) or "no quota"
        lines = [f"{name} is admitted in ClusterQueue {ws.cq} since t={adm.admitted_at:g} ({flavors}"
                 f"{', borrowing from the cohort' if adm.borrowing else ''})."]
        for ps_name, ta in sorted(adm.topology_assignments.items()):
            domains = ", ".join(f"{'/'.join(values)} x{n}" for values, n in ta.domains)
            lines.append(f"  pod set {ps_name} in topology domains ({', '.join(ta.levels)}): {domains}")
        for pl in adm.placements:
            gpu = f" GPU {','.join(map(str, pl.gpus))}" if pl.gpus else ""
            share = f" ({pl.gpu_fraction:g} of it)" if pl.gpu_fraction else ""
            lines.append(f"  pod {pl.pod_set}-{pl.index} -> node {pl.node}{gpu}{share}")
        return "\n".join(lines)
    info = engine.pending_info(name)
    assert info is not None
    lines = [f"{name} is pending in ClusterQueue {ws.cq}: position {info.position}, "
             f"{info.ahead} workload(s) ahead of it.",
             f"Reason: {info.reason}: {info.message}"]
    if info.requeue_at is not None:
        lines.append(f"It was evicted {ws.requeue_count} time(s) and waits until t={info.requeue_at:g} "
                     f"before it is considered again.")
    if info.reason == TOPOLOGY_PLACEMENT_FAILED:
        lines.append("No topology domain holds its pods even with every admitted workload gone: ask for fewer "
                     "pods, a higher level, or preferred instead of required placement.")
    a = engine._nominate(ws, q)
    node = q.node
    seen = set()
    for s in a.shortfalls:
        if (s.flavor, s.resource) in seen:
            continue
        seen.add((s.flavor, s.resource))
        fr = (s.flavor, s.resource)
        lines.append(f"- {s.resource} in flavor {s.flavor}: needs {fmt(s.needed)}, {fmt(max(0, s.available))} "
                     f"free to it now (nominal {fmt(node.nominal.get(fr, 0))}, in use "
                     f"{fmt(node.usage.get(fr, 0))}, at most {fmt(s.potential)} with borrowing).")
        if s.needed > s.potential:
            lines.append(f"  It can never fit: ask for at most {fmt(s.potential)} {s.resource}, or ask an admin "
                         f"to raise the quota of {ws.cq} or its cohort.")
    if a.mode == Mode.FIT and ws.requeue_at is None:
        lines.append("It fits now and should be admitted at the next cycle." if not info.ahead else
                     f"There is room for it now, but the {info.ahead} workload(s) ahead of it go first.")
    elif a.mode != Mode.NO_FIT:
        targets = engine._targets(ws, q, a)
        pol = q.spec.preemption
        if not targets:
            lines.append(f"Nothing it may preempt frees enough (withinClusterQueue={pol.within_cluster_queue}, "
                         f"reclaimWithinCohort={pol.reclaim_within_cohort}); it waits for running work to end.")
        else:
            victims = ", ".join(f"{t.name} ({t.cluster_queue}, priority {engine.states[t.name].workload.priority})"
                                for t in targets)
            lines.append(f"It would preempt {len(targets)} workload(s): {victims}.")
    if ws.queue_ts is not None and info.waiting_for and info.reason != "WaitingForPreemptedWorkloads":
        lines.append(f"It waits behind {info.waiting_for[0]}, which blocks the StrictFIFO queue.")
    return "\n".join(lines)
