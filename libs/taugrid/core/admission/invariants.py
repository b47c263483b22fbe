"""Invariant checkers for the admission engine, one function per invariant.

Role: each checker takes plain data (configs, usage, admissions, placements, victims) and returns a list of
violations (empty = holds). They are written apart from the engine's own arithmetic where that is possible,
so tests can run them after every cycle and also feed them hand-made broken states to show they fail.

Units: usage and quota values are the engine's integer milli-units (``model.to_units``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from .model import (
    BorrowWithinCohortPolicy,
    ClusterQueue,
    Cohort,
    PreemptionPolicy,
    ResourceGroup,
    Workload,
    to_units,
)
from .preemption import Candidate, order_key, reclaim_allows, within_allows
from .results import Admission, PodPlacement

FR = tuple[str, str]


def _quotas(groups: Iterable[ResourceGroup]) -> dict[FR, tuple[int, int | None, int | None]]:
    out: dict[FR, tuple[int, int | None, int | None]] = {}
    for g in groups:
        for fq in g.flavors:
            for r, q in fq.resources.items():
                out[(fq.name, r)] = (to_units(q.nominal_quota),
                                     None if q.borrowing_limit is None else to_units(q.borrowing_limit),
                                     None if q.lending_limit is None else to_units(q.lending_limit))
    return out


def check_quota(cluster_queues: Iterable[ClusterQueue], cohorts: Iterable[Cohort],
                usage: Mapping[str, Mapping[FR, int]]) -> list[str]:
    """Usage never exceeds nominal + borrowing limit, and borrowers never take more than lenders lend.

    Recomputes the tree bottom-up: a node passes up the usage beyond what it keeps for itself
    (``nominal - lending_limit``); every cohort must hold what reaches it within its subtree quota
    (plus its own borrowing limit when it has a parent; without a limit its parent checks it).
    """
    violations: list[str] = []
    cqs = list(cluster_queues)
    cohort_specs = {c.name: c for c in cohorts}
    children: dict[str, list[tuple[str, bool]]] = {}
    parent: dict[tuple[str, bool], str | None] = {}
    for cq in cqs:
        parent[(cq.name, True)] = cq.cohort
        if cq.cohort is not None:
            children.setdefault(cq.cohort, []).append((cq.name, True))
            cohort_specs.setdefault(cq.cohort, Cohort(cq.cohort))
    for c in cohort_specs.values():
        parent[(c.name, False)] = c.parent
        if c.parent is not None:
            children.setdefault(c.parent, []).append((c.name, False))
            cohort_specs.setdefault(c.parent, Cohort(c.parent))
    cq_specs = {cq.name: cq for cq in cqs}

    def visit(key: tuple[str, bool]) -> tuple[dict[FR, int], dict[FR, int]]:
        """Returns (subtree quota, usage that reaches this node) for the node ``key``."""
        name, is_cq = key
        spec_groups = cq_specs[name].resource_groups if is_cq else cohort_specs[name].resource_groups
        quotas = _quotas(spec_groups)
        subtree = {fr: q[0] for fr, q in quotas.items()}
        used: dict[FR, int] = dict(usage.get(name, {})) if is_cq else {}
        for child in children.get(name, []) if not is_cq else []:
            csub, cuse = visit(child)
            cquotas = _quotas(cq_specs[child[0]].resource_groups if child[1]
                              else cohort_specs[child[0]].resource_groups)
            for fr in set(csub) | set(cuse):
                lim = cquotas.get(fr, (0, None, None))[2]
                keep = 0 if lim is None else max(0, csub.get(fr, 0) - lim)
                subtree[fr] = subtree.get(fr, 0) + csub.get(fr, 0) - keep
                used[fr] = used.get(fr, 0) + max(0, cuse.get(fr, 0) - keep)
        has_parent = parent.get(key) is not None
        for fr, u in used.items():
            nominal, blimit, _ = quotas.get(fr, (0, None, None))
            kind = "ClusterQueue" if is_cq else "cohort"
            if is_cq and blimit is not None and u > nominal + blimit:
                violations.append(f"{kind} {name}: usage {u} of {fr} exceeds nominal {nominal} + borrowing "
                                  f"limit {blimit}")
            if not has_parent and u > subtree.get(fr, 0):
                violations.append(f"{kind} {name}: usage {u} of {fr} exceeds the quota its tree holds and lends "
                                  f"({subtree.get(fr, 0)})")
            if has_parent and not is_cq and blimit is not None and u > subtree.get(fr, 0) + blimit:
                violations.append(f"{kind} {name}: usage {u} of {fr} exceeds its subtree quota + borrowing limit")
        return subtree, used

    for cq in cqs:
        if cq.cohort is None:
            visit((cq.name, True))
    for c in list(cohort_specs.values()):
        if c.parent is None:
            visit((c.name, False))
    return violations


def check_gangs(workloads: Mapping[str, Workload], admissions: Iterable[Admission], *,
                with_nodes: bool) -> list[str]:
    """An admitted workload carries every pod set with its full count (and, with nodes, one placement per pod)."""
    violations = []
    for adm in admissions:
        w = workloads[adm.workload]
        got = {p.name: p.count for p in adm.pod_sets}
        want = {p.name: p.count for p in w.pod_sets}
        if got != want:
            violations.append(f"{adm.workload}: admitted pod sets {got} != requested {want}")
        if with_nodes:
            placed: dict[str, set[int]] = {}
            for pl in adm.placements:
                placed.setdefault(pl.pod_set, set()).add(pl.index)
            if {k: len(v) for k, v in placed.items()} != want:
                violations.append(f"{adm.workload}: placed pods { {k: len(v) for k, v in placed.items()} } "
                                  f"!= requested {want}")
    return violations


def check_gpu_fractions(placements: Iterable[PodPlacement]) -> list[str]:
    """Shares on one physical GPU never sum above one (a whole-GPU pod counts as 1)."""
    used: dict[tuple[str, int], float] = {}
    for pl in placements:
        for g in pl.gpus:
            used[(pl.node, g)] = used.get((pl.node, g), 0.0) + (pl.gpu_fraction or 1.0)
    return [f"GPU {g} on node {n} is {u:g} used (> 1)" for (n, g), u in sorted(used.items()) if u > 1 + 1e-9]


def check_strict_fifo(heads_before: Mapping[str, list[tuple[str, int, float]]], strict: Iterable[str],
                      admitted: Iterable[Admission]) -> list[str]:
    """In a StrictFIFO queue a cycle admits at most one workload, and only one ranked first before the cycle.

    ``heads_before[cq]`` lists (name, priority, queue timestamp) of the queue's pending workloads.
    """
    violations = []
    strict_set = set(strict)
    seen: dict[str, int] = {}
    for adm in admitted:
        cq = adm.cluster_queue
        if cq not in strict_set:
            continue
        seen[cq] = seen.get(cq, 0) + 1
        pending = heads_before.get(cq, [])
        if not pending:
            continue
        best = min((-p, ts) for _, p, ts in pending)
        mine = next(((-p, ts) for n, p, ts in pending if n == adm.workload), None)
        if mine is None or mine > best:
            violations.append(f"StrictFIFO {cq}: admitted {adm.workload} past a workload ranked ahead of it")
    violations += [f"StrictFIFO {cq}: {n} admissions in one cycle" for cq, n in seen.items() if n > 1]
    return violations


def check_no_starvation(pending: Iterable[str], would_fit: Callable[[str], bool]) -> list[str]:
    """After quiescence no pending workload fits the free capacity."""
    return [f"{name} is pending although it fits free capacity" for name in pending if would_fit(name)]


class FitOracle(Protocol):
    def remove(self, name: str) -> None: ...

    def restore(self, name: str) -> None: ...

    def fits(self) -> bool: ...


def check_preemption(*, policy: PreemptionPolicy, preemptor_priority: int, preemptor_ts: float,
                     victims: list[Candidate], sim: FitOracle) -> list[str]:
    """Victims are allowed by the policy, listed in Kueue's order, sufficient, and minimal."""
    violations = []
    bwc = policy.borrow_within_cohort
    for v in victims:
        if not v.preemptible:
            violations.append(f"victim {v.name} is not preemptible")
        if v.other_cq:
            ok = reclaim_allows(policy.reclaim_within_cohort, v.priority, preemptor_priority) or (
                bwc.policy == BorrowWithinCohortPolicy.LOWER_PRIORITY and v.priority < preemptor_priority
                and (bwc.max_priority_threshold is None or v.priority <= bwc.max_priority_threshold))
        else:
            ok = within_allows(policy.within_cluster_queue, v.priority, v.queue_ts, preemptor_priority,
                               preemptor_ts)
        if not ok:
            violations.append(f"victim {v.name} (priority {v.priority}) is not allowed by {policy}")
    if [order_key(v) for v in victims] != sorted(order_key(v) for v in victims):
        violations.append(f"victims {[v.name for v in victims]} are not in Kueue's order")
    names = [v.name for v in victims]
    for n in names:
        sim.remove(n)
    if not sim.fits():
        violations.append(f"victims {names} do not free enough for the preemptor")
    for n in names:
        sim.restore(n)
        if sim.fits():
            violations.append(f"victim {n} is not needed: the preemptor fits without preempting it")
        sim.remove(n)
    for n in names:
        sim.restore(n)
    return violations


def check_targets(*, policy: PreemptionPolicy, preemptor: Any, targets: list[Any], states: Mapping[str, Any],
                  sim: FitOracle) -> list[str]:
    """Preemption targets are preemptible, allowed by the policy, and free enough for the preemptor."""
    violations = []
    w = preemptor.workload
    bwc = policy.borrow_within_cohort
    for t in targets:
        v = states[t.name].workload
        if not v.preemptible:
            violations.append(f"victim {t.name} is not preemptible")
        if t.cluster_queue != preemptor.cq:
            ok = reclaim_allows(policy.reclaim_within_cohort, v.priority, w.priority) or (
                bwc.policy == BorrowWithinCohortPolicy.LOWER_PRIORITY and v.priority < w.priority)
        else:
            ok = within_allows(policy.within_cluster_queue, v.priority, states[t.name].queue_ts, w.priority,
                               preemptor.queue_ts)
        if not ok:
            violations.append(f"victim {t.name} (priority {v.priority}) is not allowed by {policy}")
    for t in targets:
        sim.remove(t.name)
    if not sim.fits():
        violations.append(f"victims {[t.name for t in targets]} do not free enough for the preemptor")
    for t in targets:
        sim.restore(t.name)
    return violations
