"""Small builders for admission-engine tests (quotas in user units)."""

from __future__ import annotations

from taugrid.core.admission import (
    GPU,
    ClusterQueue,
    FlavorQuotas,
    PodSet,
    PreemptionPolicy,
    QueueingStrategy,
    ResourceGroup,
    ResourceQuota,
    Workload,
)

Quota = float | tuple[float, float | None, float | None]


def rq(v: Quota) -> ResourceQuota:
    return ResourceQuota(*v) if isinstance(v, tuple) else ResourceQuota(v)


def cq(name: str, *, cohort: str | None = None, flavors: dict[str, dict[str, Quota]] | None = None,
       gpu: Quota | None = None, strict: bool = False, preemption: PreemptionPolicy | None = None,
       weight: float = 1.0) -> ClusterQueue:
    """One resource group; ``gpu=`` is shorthand for flavor ``default`` with only nvidia.com/gpu."""
    if flavors is None:
        flavors = {"default": {GPU: gpu if gpu is not None else 0}}
    covered = tuple(sorted({r for res in flavors.values() for r in res}))
    group = ResourceGroup(covered, tuple(FlavorQuotas(f, {r: rq(res.get(r, 0)) for r in covered})
                                         for f, res in flavors.items()))
    return ClusterQueue(name, (group,), cohort=cohort,
                        queueing_strategy=QueueingStrategy.STRICT_FIFO if strict else QueueingStrategy.BEST_EFFORT_FIFO,
                        preemption=preemption or PreemptionPolicy(), fair_weight=weight)


def wl(name: str, queue: str, *, gpu: float = 0, count: int = 1, prio: int = 0, t: float = 0.0,
       frac: float = 0.0, preemptible: bool = True, **kw: object) -> Workload:
    requests = {GPU: gpu} if gpu else {}
    return Workload(name, queue, (PodSet("main", count, requests, gpu_fraction=frac),), priority=prio,
                    created_at=t, preemptible=preemptible, **kw)  # type: ignore[arg-type]


def run_until_quiet(engine, now: float = 0.0, limit: int = 1000):  # type: ignore[no-untyped-def]
    """Cycle until nothing is left to consider; returns (admitted names, preemptions) over all cycles."""
    admitted, preempted = [], []
    for _ in range(limit):
        if engine.quiescent():
            break
        res = engine.cycle(now)
        admitted += [a.workload for a in res.admitted]
        preempted += res.preempted
        assert not res.violations, res.violations
    return admitted, preempted
