"""The test platform, in one place: the ``lab`` platform most suites run on, built as ``platform.yaml`` text.

One flavor (``default``), one ClusterQueue ``lab`` (8 CPUs and 16Gi by default; ``cohort=True`` puts it in a
cohort ``lab``), one LocalQueue ``default`` onto it, the ``normal`` priority class and the ``cpu-small`` profile.
A test names only what its platform adds or changes (its workspaces, people, quota, priority classes), so a
reader sees what matters to it, and a change to the platform's schema is made here once.

``workspace`` gives a workspace on that queue (``default_priority: normal``, ``default_profile: cpu-small``);
a field given as None is left out. The e2e stacks' platform (GPUs, preemption) is ``tests/e2e/conftest.py``'s
``TEST_PLATFORM``; platforms that are themselves under test (``tests/config``, KAI departments) stay in their tests.
``people_platform`` is the smaller one the people and workspace commands are tried on (``cq``, ``q`` in ``ns``).
"""

from __future__ import annotations

from typing import Any

import yaml

CPU_MEMORY: dict[str, Any] = {"cpu": "8", "memory": "16Gi"}
NORMAL: list[dict[str, Any]] = [{"name": "normal", "value": 100}]
FOUR_PRIORITIES: list[dict[str, Any]] = [{"name": "low", "value": 50}, {"name": "normal", "value": 100},
                                         {"name": "high", "value": 200}, {"name": "urgent", "value": 300}]
CPU_SMALL: list[dict[str, Any]] = [{"name": "cpu-small", "cpu": "100m", "memory": "128Mi"}]


def workspace(name: str = "default", **fields: Any) -> dict[str, Any]:
    """A workspace on the lab's ``default`` queue; ``fields`` add to or override its defaults (None: leave out)."""
    found: dict[str, Any] = {"name": name, "namespace": "default", "local_queue": "default",
                             "default_priority": "normal", "default_profile": "cpu-small", **fields}
    return {key: value for key, value in found.items() if value is not None}


def lab_platform(*, workspaces: list[dict[str, Any]] | None = None, cohort: bool = False,
                 quota: dict[str, Any] | None = None, namespace: str = "default",
                 priority_classes: list[dict[str, Any]] | None = None,
                 compute_profiles: list[dict[str, Any]] | None = None,
                 users: list[dict[str, Any]] | None = None, **more: Any) -> str:
    """The lab platform's text. ``quota``: nominal quota by resource (its keys are the covered resources; default
    ``CPU_MEMORY``); ``namespace``: the LocalQueue's; ``priority_classes`` (default ``NORMAL``) and
    ``compute_profiles`` (default ``CPU_SMALL``; ``[]`` leaves the key out); ``users`` when given; ``more``: other
    top-level keys (``local``)."""
    quota = CPU_MEMORY if quota is None else quota
    queue: dict[str, Any] = {"name": "lab", **({"cohort": "lab"} if cohort else {}), "resource_groups": [{
        "covered_resources": list(quota),
        "flavors": [{"name": "default",
                     "resources": [{"name": r, "nominal_quota": q} for r, q in quota.items()]}]}]}
    platform: dict[str, Any] = {
        "resource_flavors": [{"name": "default"}],
        **({"cohorts": [{"name": "lab"}]} if cohort else {}),
        "cluster_queues": [queue],
        "local_queues": [{"name": "default", "namespace": namespace, "cluster_queue": "lab"}],
        "priority_classes": NORMAL if priority_classes is None else priority_classes,
    }
    profiles = CPU_SMALL if compute_profiles is None else compute_profiles
    if profiles:
        platform["compute_profiles"] = profiles
    if users is not None:
        platform["users"] = users
    if workspaces is not None:
        platform["workspaces"] = workspaces
    return yaml.safe_dump({**platform, **more}, sort_keys=False, default_flow_style=None, width=120)


def people_platform(*workspaces: str, cpu: int = 8) -> str:
    """A smaller platform for tests about people and workspaces: a ClusterQueue ``cq`` of ``cpu`` CPUs, a
    LocalQueue ``q`` in namespace ``ns``, and each named workspace on it (no priority classes, no profiles)."""
    return yaml.safe_dump({
        "resource_flavors": [{"name": "default"}],
        "cluster_queues": [{"name": "cq", "resource_groups": [{
            "covered_resources": ["cpu"],
            "flavors": [{"name": "default", "resources": [{"name": "cpu", "nominal_quota": cpu}]}]}]}],
        "local_queues": [{"name": "q", "namespace": "ns", "cluster_queue": "cq"}],
        "workspaces": [{"name": name, "namespace": "ns", "local_queue": "q"} for name in workspaces],
    }, sort_keys=False, default_flow_style=None, width=120)
