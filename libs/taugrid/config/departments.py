"""KAI's queue model in ``platform.yaml``: departments of projects with deserved quota, limit and weight.

A department groups projects; both levels carry KAI's per-queue ``deserved`` quota (KAI's ``quota``), an
optional ``limit`` and an ``over_quota_weight``. Idle resources are divided first by deserved quota, then in
proportion to the weights (KAI's proportion plugin); a project below its share reclaims by preemption.

How it maps onto Kueue's shapes (so everything that reads cohorts and ClusterQueues works unchanged):
  * every department is a Cohort (``fair_weight`` = its weight) under one implicit root Cohort,
    ``departments`` (so departments can use each other's idle quota, as KAI's queues of one cluster do);
  * every project is a ClusterQueue in its department's Cohort, covering cpu, memory and nvidia.com/gpu in the
    department's flavor: nominal quota = deserved (0 when not written), borrowing limit = limit − deserved (none
    when no limit), preemption ``reclaimWithinCohort: Any`` and ``withinClusterQueue: LowerPriority`` (KAI's
    reclaim of over-quota use and its in-queue preempt by priority), fair-sharing weight = over_quota_weight.
Invariants: project and department names share the ClusterQueue/Cohort namespaces (``platformcheck`` refuses a
clash); only cpu, memory and nvidia.com/gpu may be written (KAI's queue resources); the derived objects are
rebuilt from the text on every read, never stored.
"""

from __future__ import annotations

from pydantic import Field

from taugrid.config.fields import Strict, Text

DEPARTMENTS_ROOT = "departments"
KAI_QUEUE_LABEL = "kai.scheduler/queue"  # on a project's runs: the KAI leaf queue they belong to
KAI_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


class KaiQueueFields(Strict):
    name: str
    deserved: dict[str, Text] = Field(
        default_factory=dict, description="KAI's quota per resource (cpu, memory, nvidia.com/gpu); absent = 0")
    limit: dict[str, Text] = Field(
        default_factory=dict, description="most this queue may ever use per resource; absent = no limit")
    over_quota_weight: float = Field(
        default=1.0, ge=0, description="share of idle resources beyond deserved quota, relative to its siblings")
    priority: int = Field(default=100, description="KAI queue priority: higher gets over-quota resources first")


class Project(KaiQueueFields):
    """A KAI leaf queue; workspaces reach it through a local queue whose ``cluster_queue`` names it."""


class Department(KaiQueueFields):
    flavor: str | None = Field(
        default=None, description="resource flavor its projects' quota is in; default: the only flavor declared")
    projects: list[Project] = Field(min_length=1)
