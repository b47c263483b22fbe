"""The engine side of ``platform.yaml``'s departments (KAI queues): quota-tree capacity and the ``KaiSpec``.

``platform.all_cohorts()``/``all_cluster_queues()`` already give departments and projects their Kueue shapes;
this adds what only a cluster that knows its size can: the implicit ``departments`` root cohort holds the
cluster's ``capacity`` in every department flavor (so idle resources of the whole cluster are reachable, as in
KAI), a department holds its deserved quota beyond its projects' (and its limit as a borrowing limit), and
``kai_spec`` carries deserved quota, limits, weights and priorities to ``core.admission.kai``.
"""

from __future__ import annotations

from collections.abc import Mapping

from taugrid.config.departments import DEPARTMENTS_ROOT, KAI_RESOURCES, KaiQueueFields
from taugrid.config.platform import Platform, amount
from taugrid.core import admission as adm


def kai_spec(p: Platform, capacity: Mapping[str, float]) -> adm.KaiSpec | None:
    if not p.departments:
        return None
    queues: list[adm.KaiQueue] = []
    for d in p.departments:
        queues.append(_queue(d, None))
        queues += [_queue(project, d.name) for project in d.projects]
    return adm.KaiSpec(tuple(queues), capacity={r: v for r, v in capacity.items() if r in KAI_RESOURCES})


def _queue(q: KaiQueueFields, parent: str | None) -> adm.KaiQueue:
    deserved = {r: amount(r, v) for r, v in q.deserved.items()}
    limit = {r: amount(r, v) for r, v in q.limit.items()}
    return adm.KaiQueue(q.name, parent, deserved, limit, q.over_quota_weight, q.priority)


def with_department_quota(p: Platform, cohorts: list[adm.Cohort], capacity: Mapping[str, float]) -> list[adm.Cohort]:
    """``cohorts`` with the departments' root and department cohorts given their quota."""
    if not p.departments:
        return cohorts
    own: dict[str, tuple[adm.ResourceGroup, ...]] = {}
    held: dict[tuple[str, str], float] = {}  # (flavor, resource) -> what the departments' subtrees hold
    for d in p.departments:
        quotas = {}
        flavor = p.department_flavor(d)
        for r in KAI_RESOURCES:
            projects = sum(amount(r, pr.deserved.get(r, 0)) for pr in d.projects)
            deserved = amount(r, d.deserved.get(r, 0))
            limit = d.limit.get(r)
            borrow = None if limit is None else max(0.0, amount(r, limit) - max(deserved, projects))
            quotas[r] = adm.ResourceQuota(max(0.0, deserved - projects), borrow)
            held[(flavor, r)] = held.get((flavor, r), 0.0) + max(deserved, projects)
        own[d.name] = (adm.ResourceGroup(KAI_RESOURCES, (adm.FlavorQuotas(flavor, quotas),)),)
    # the root holds the rest of the cluster, so a department's subtree plus the root never exceed the capacity
    flavors = sorted({p.department_flavor(d) for d in p.departments})
    root = tuple(adm.ResourceGroup(KAI_RESOURCES, (adm.FlavorQuotas(f, {r: adm.ResourceQuota(
        max(0.0, float(capacity.get(r, 0.0)) - held[(f, r)])) for r in KAI_RESOURCES}),)) for f in flavors)
    out = []
    for c in cohorts:
        if c.name == DEPARTMENTS_ROOT:
            out.append(adm.Cohort(c.name, c.parent, root, c.fair_weight))
        elif c.name in own:
            out.append(adm.Cohort(c.name, c.parent, own[c.name], c.fair_weight))
        else:
            out.append(c)
    return out
