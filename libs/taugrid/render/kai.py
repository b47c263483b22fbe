"""Render ``platform.yaml``'s departments as KAI Scheduler ``Queue`` objects (``scheduling.run.ai/v2``).

One Queue per department (no parent) and one per project (``parentQueue`` = its department), in that order, so
a parent exists before its children. ``spec.resources.{cpu,memory,gpu}`` carry ``quota`` (deserved; 0 when not
written), ``limit`` (-1, KAI's "no limit", when not written) and ``overQuotaWeight``, in KAI's units: cpu in
millicpus, memory in megabytes (10^6 bytes), gpu in devices. ``spec.priority`` is the queue priority.

Invariants: pure and deterministic; every object passes ``taugrid.render.validate.validate`` against the CRD in
``deploy/crds/scheduling.run.ai_queues.yaml``; objects carry ``taugrid.io/managed-by: taugrid``.
"""

from __future__ import annotations

from typing import Any

from taugrid.config.departments import KaiQueueFields
from taugrid.config.platform import GPU_RESOURCE, Platform, amount

API_VERSION = "scheduling.run.ai/v2"
MANAGED = {"taugrid.io/managed-by": "taugrid"}
UNLIMITED = -1
# platform resource -> (KAI resource key, factor from our base unit to KAI's unit)
_KAI_UNITS = {"cpu": ("cpu", 1000.0), "memory": ("memory", 1e-6), GPU_RESOURCE: ("gpu", 1.0)}


def render_kai_queues(p: Platform) -> list[dict[str, Any]]:
    """Every KAI Queue ``p``'s departments describe, departments before their projects."""
    out = [queue(d) for d in p.departments]
    out += [queue(project, parent=d.name) for d in p.departments for project in d.projects]
    return out


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 6)


def queue(q: KaiQueueFields, *, parent: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for resource, (key, factor) in _KAI_UNITS.items():
        deserved = q.deserved.get(resource)
        limit = q.limit.get(resource)
        resources[key] = {
            "quota": _number(amount(resource, deserved) * factor) if deserved is not None else 0,
            "limit": _number(amount(resource, limit) * factor) if limit is not None else UNLIMITED,
            "overQuotaWeight": _number(q.over_quota_weight),
        }
    spec: dict[str, Any] = {"priority": q.priority, "resources": resources}
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": q.name, "labels": dict(MANAGED)},
            "spec": spec}
