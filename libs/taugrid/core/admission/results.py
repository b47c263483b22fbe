"""What the admission engine answers: admissions, preemptions, pending reasons.

Role: frozen msgspec Structs (they may be put on the bus as they are) and the reason strings, which follow
Kueue's ``QuotaReserved``/``Preempted`` condition reasons and message wording so a researcher who knows
Kueue reads the same words locally.

Invariant: a ``CycleResult`` lists every decision of one cycle; an admission appears once, with all of its
pods (gang), and a preemption names both sides and one of the ``PREEMPTED_*`` reasons.
"""

from __future__ import annotations

import msgspec

# QuotaReserved=False reasons (Kueue wording, plus Unschedulable/Backoff for the local node layer).
PENDING = "Pending"
WAITING_FOR_QUOTA = "WaitingForQuota"
EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
NO_MATCHING_FLAVOR = "NoMatchingFlavor"
WAITING_FOR_PREEMPTED = "WaitingForPreemptedWorkloads"
UNSCHEDULABLE = "Unschedulable"
INADMISSIBLE = "Inadmissible"
BACKOFF = "Backoff"
PREEMPTION_GATED = "PreemptionGated"  # Kueue's QuotaReserved reason (KEP-8303): it could preempt, but is gated
TOPOLOGY_PLACEMENT_FAILED = "TopologyPlacementFailed"  # Kueue: no TAS domain holds the pods, even all freed

# Preempted reasons (Kueue).
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"

# How Kueue words each reason in the Preempted condition's message.
HUMAN_REASONS = {
    IN_CLUSTER_QUEUE: "prioritization in the ClusterQueue",
    IN_COHORT_RECLAMATION: "reclamation within the cohort",
    IN_COHORT_FAIR_SHARING: "Fair Sharing within the cohort",
    IN_COHORT_RECLAIM_WHILE_BORROWING: "reclamation within the cohort while borrowing",
}

# Messages (Kueue wording where Kueue has one).
MSG_NO_LONGER_FITS = "Workload no longer fits after processing another workload"
MSG_OVERLAPPING_TARGETS = "Workload has overlapping preemption targets with another workload"
MSG_DEFERRED_FIT = ("Workload has overlapping preemption targets with another workload, but will fit after these "
                    "preemptions complete")
MSG_QUEUED = "Waiting for the next scheduling cycle"
MSG_PREEMPTION_GATED = ("Workload could preempt to fit, but its preemption is gated: one cluster at a time may "
                        "preempt for it (MultiKueue's orchestrated preemption)")


def msg_pending_preemption(n: int, why: str = "") -> str:
    """Kueue appends this to the flavor assigner's message (why it needs preemption), when there is one."""
    return f"{why}. Pending the preemption of {n} workload(s)" if why else f"Pending the preemption of {n} workload(s)"


def msg_strict_fifo(head: str, cq: str) -> str:
    return f"Waiting for workload {head} at the head of StrictFIFO ClusterQueue {cq}"


def msg_couldnt_assign(pod_set: str, reasons: list[str]) -> str:
    return f"couldn't assign flavors to pod set {pod_set}: {', '.join(reasons)}"


class Struct(msgspec.Struct, frozen=True, kw_only=True):
    pass


class PodPlacement(Struct, frozen=True):
    """Where one pod of a gang goes: a node and GPU indices (``gpu_fraction`` set for a shared GPU)."""

    pod_set: str
    index: int
    node: str
    gpus: tuple[int, ...] = ()
    gpu_fraction: float = 0.0


class TopologyAssignment(Struct, frozen=True):
    """Kueue ``topologyAssignment``: the topology's level keys, and per domain its values (one per level, highest
    first, down to the lowest level) and how many of the pod set's pods it takes. Domains are listed in the order
    pods fill them: pod indices 0..n-1 of the first domain, then the next (Kueue's rank ordering)."""

    levels: tuple[str, ...]
    domains: tuple[tuple[tuple[str, ...], int], ...]


class PodSetAdmission(Struct, frozen=True):
    name: str
    count: int
    flavors: dict[str, str]  # resource -> flavor
    resource_usage: dict[str, float]  # resource -> total for the pod set


class Admission(Struct, frozen=True):
    workload: str
    cluster_queue: str
    flavors: dict[str, str]  # resource -> flavor, merged over pod sets (first pod set using it wins)
    borrowing: bool
    pod_sets: tuple[PodSetAdmission, ...] = ()
    placements: tuple[PodPlacement, ...] = ()  # empty when the engine runs without nodes
    admitted_at: float = 0.0
    topology_assignments: dict[str, TopologyAssignment] = msgspec.field(default_factory=dict)  # by pod set name
    replaced: str = ""  # a Kueue scale-up slice: the workload it replaced (finished with reason Replaced)


class Preemption(Struct, frozen=True):
    victim: str
    preemptor: str
    reason: str  # one of IN_CLUSTER_QUEUE, IN_COHORT_RECLAMATION, IN_COHORT_RECLAIM_WHILE_BORROWING
    victim_cluster_queue: str = ""
    preemptor_cluster_queue: str = ""
    message: str = ""


# Resize causes (elastic workloads).
GROWN = "Grown"  # quota freed: a slice of ``step`` pods was added
SHRUNK = "Shrunk"  # asked for (Kueue's in-place scale-down), e.g. a GPU fault on one worker
SHRUNK_FOR_PREEMPTOR = "ShrunkForPreemptor"  # given up to a preemptor instead of being evicted whole
WORKLOAD_SLICE_REPLACED = "WorkloadSliceReplaced"  # Kueue's Finished reason of a replaced slice


class Resize(Struct, frozen=True):
    """An elastic workload changed size in place. Grown: ``placements`` are the new pods (start them). Shrunk:
    ``placements`` are the pods to stop; their quota and node room stay held until ``Engine.release_removed``."""

    workload: str
    cluster_queue: str
    pod_set: str
    old_count: int
    new_count: int
    cause: str
    preemptor: str = ""
    placements: tuple[PodPlacement, ...] = ()
    at: float = 0.0


class Pending(Struct, frozen=True):
    workload: str
    cluster_queue: str
    reason: str
    message: str
    position: int  # 1-based rank among the pending workloads of its ClusterQueue
    ahead: int
    requeue_at: float | None = None
    waiting_for: tuple[str, ...] = ()  # victims being preempted, or the StrictFIFO head


class CycleResult(Struct, frozen=True):
    now: float
    admitted: list[Admission]
    preempted: list[Preemption]
    heads: int  # how many ClusterQueue heads this cycle considered
    violations: list[str] = msgspec.field(default_factory=list)  # audit mode only
    resized: list[Resize] = msgspec.field(default_factory=list)  # elastic workloads grown or shrunk

    @property
    def progressed(self) -> bool:
        return bool(self.heads)
