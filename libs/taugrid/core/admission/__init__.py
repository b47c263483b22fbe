"""Pure admission engine: Kueue-compatible queueing and quota with KAI-style GPU fractions, gangs and placement.

Imports no I/O library and reads no clock; callers pass ``now``. See ``engine`` for the cycle, ``quota`` for
the cohort-tree arithmetic, ``model`` for how KAI's hierarchical queues map onto cohorts.
"""

from .engine import Engine
from .kai import KaiQueue, KaiSpec
from .model import (
    GPU,
    BorrowWithinCohort,
    BorrowWithinCohortPolicy,
    ClusterQueue,
    Cohort,
    Elastic,
    FlavorFungibility,
    FlavorQuotas,
    FungibilityPreference,
    GpuDevice,
    LocalQueue,
    Node,
    PlacementStrategy,
    PodSet,
    PreemptionPolicy,
    QueueingStrategy,
    ReclaimWithinCohort,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Taint,
    Toleration,
    Topology,
    TopologyRequest,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinClusterQueue,
    Workload,
)
from .results import (
    Admission,
    CycleResult,
    Pending,
    PodPlacement,
    PodSetAdmission,
    Preemption,
    Resize,
    TopologyAssignment,
)

__all__ = [
    "GPU", "Admission", "BorrowWithinCohort", "BorrowWithinCohortPolicy", "ClusterQueue", "Cohort",
    "CycleResult", "Elastic", "Engine", "FlavorFungibility", "FlavorQuotas", "FungibilityPreference",
    "GpuDevice", "KaiQueue", "KaiSpec", "LocalQueue", "Node", "Pending", "PlacementStrategy",
    "PodPlacement", "PodSet", "PodSetAdmission", "Preemption", "PreemptionPolicy", "QueueingStrategy",
    "ReclaimWithinCohort", "Resize", "ResourceFlavor", "ResourceGroup", "ResourceQuota", "Taint", "Toleration",
    "Topology", "TopologyAssignment", "TopologyRequest", "WhenCanBorrow", "WhenCanPreempt", "WithinClusterQueue",
    "Workload",
]
