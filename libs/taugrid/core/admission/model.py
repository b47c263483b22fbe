"""Input model of the admission engine: flavors, queues, cohorts, workloads, nodes.

Role: plain, frozen descriptions of what an operator configured (Kueue ClusterQueue/Cohort/ResourceFlavor/
LocalQueue) and what a researcher asked for (a Workload with gang pod sets, KAI-style GPU fractions).

Invariants:
- Quantities are plain numbers: ``cpu`` in cores (float), ``memory`` in bytes, ``nvidia.com/gpu`` in devices.
  The engine converts them to integer milli-units once (``to_units``) so no float drift enters the ledger.
- ``borrowing_limit``/``lending_limit`` ``None`` means unlimited, as in Kueue.
- A pod set asks for whole GPUs (``requests["nvidia.com/gpu"]``) or for a share of one GPU
  (``gpu_fraction`` in (0, 1) or ``gpu_memory_mb``), never both (KAI's validation rule).

KAI's hierarchical queues map onto the cohort tree: a department is a ``Cohort`` (its ``resource_groups``
hold department-level quota, ``parent`` points at the org cohort), a project is a ``ClusterQueue`` whose
``nominal_quota`` is KAI's *deserved* quota, whose ``borrowing_limit`` is KAI's ``limit - quota`` and whose
``fair_weight`` is KAI's ``overQuotaWeight``. KAI's ``priority >= 100`` non-preemptible class maps to
``Workload.preemptible=False`` (priority and preemptibility are kept apart).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from taugrid.core.devices import GPU_RESOURCES
from taugrid.core.errors import PermanentError

GPU = "nvidia.com/gpu"
UNIT = 1000  # milli-units: cpu millicores, milli-GPU (fractions are charged in m-GPU), memory in milli-bytes


def to_units(value: float) -> int:
    """Convert a user quantity to integer milli-units (rounding away float noise like 0.1+0.2)."""
    return int(round(value * UNIT))


def from_units(units: int) -> float | int:
    """Back to the user's unit; whole numbers print without a trailing ``.0``."""
    if units % UNIT == 0:
        return units // UNIT
    return units / UNIT


class QueueingStrategy(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"


class WithinClusterQueue(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"


class ReclaimWithinCohort(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class BorrowWithinCohortPolicy(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class WhenCanBorrow(StrEnum):
    MAY_STOP_SEARCH = "MayStopSearch"  # Kueue's default; "Borrow" is its deprecated name
    TRY_NEXT_FLAVOR = "TryNextFlavor"


class WhenCanPreempt(StrEnum):
    MAY_STOP_SEARCH = "MayStopSearch"  # "Preempt" is its deprecated name
    TRY_NEXT_FLAVOR = "TryNextFlavor"  # Kueue's default


class FungibilityPreference(StrEnum):
    BORROWING_OVER_PREEMPTION = "BorrowingOverPreemption"  # Kueue's default
    PREEMPTION_OVER_BORROWING = "PreemptionOverBorrowing"


_FUNGIBILITY_ALIASES = {"Borrow": "MayStopSearch", "Preempt": "MayStopSearch"}


@dataclass(frozen=True, slots=True)
class FlavorFungibility:
    """Kueue ``flavorFungibility``: whether the flavor search goes on past a flavor that needs borrowing or
    preemption, and which of the two to prefer when every flavor needs one of them."""

    when_can_borrow: WhenCanBorrow = WhenCanBorrow.MAY_STOP_SEARCH
    when_can_preempt: WhenCanPreempt = WhenCanPreempt.TRY_NEXT_FLAVOR
    preference: FungibilityPreference | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "when_can_borrow",
                           WhenCanBorrow(_FUNGIBILITY_ALIASES.get(self.when_can_borrow, self.when_can_borrow)))
        object.__setattr__(self, "when_can_preempt",
                           WhenCanPreempt(_FUNGIBILITY_ALIASES.get(self.when_can_preempt, self.when_can_preempt)))
        if self.preference is not None:
            object.__setattr__(self, "preference", FungibilityPreference(self.preference))


class PlacementStrategy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty = all effects

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Taint | None:
    """First NoSchedule/NoExecute taint none of the tolerations accepts (Kueue ignores PreferNoSchedule)."""
    for taint in taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


@dataclass(frozen=True, slots=True)
class Topology:
    """Kueue ``Topology``: node label keys naming the levels of the data centre, highest level first
    (e.g. block, rack, ``kubernetes.io/hostname``)."""

    name: str
    levels: tuple[str, ...]

    def validate(self) -> None:
        if not self.levels:
            raise PermanentError(f"topology {self.name}: levels is empty; list node label keys, highest first")
        if len(set(self.levels)) != len(self.levels):
            raise PermanentError(f"topology {self.name}: levels {list(self.levels)} repeat a key; list each once")


@dataclass(frozen=True, slots=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    topology_name: str | None = None  # Kueue ``spec.topologyName``: a TAS flavor


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """A pod set's Kueue TAS annotations: ``podset-required-topology`` (all pods in one domain of that level),
    ``podset-preferred-topology`` (one domain if possible, else as few as possible),
    ``podset-unconstrained-topology`` (anywhere, counted per node), ``podset-slice-required-topology`` with
    ``podset-slice-size`` (pods in groups of ``slice_size``, each group inside one domain of that level),
    ``podset-group-name`` (a leader pod set and its workers placed as one)."""

    required: str | None = None
    preferred: str | None = None
    unconstrained: bool = False
    slice_required: str | None = None
    slice_size: int | None = None
    # Kueue ``podset-group-name``: two pod sets (a one-pod leader and its workers) placed together.
    pod_set_group: str | None = None


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    nominal_quota: float
    borrowing_limit: float | None = None
    lending_limit: float | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    name: str  # a ResourceFlavor name
    resources: Mapping[str, ResourceQuota]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]  # order = preference


@dataclass(frozen=True, slots=True)
class BorrowWithinCohort:
    policy: BorrowWithinCohortPolicy = BorrowWithinCohortPolicy.NEVER
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_cluster_queue: WithinClusterQueue = WithinClusterQueue.NEVER
    reclaim_within_cohort: ReclaimWithinCohort = ReclaimWithinCohort.NEVER
    borrow_within_cohort: BorrowWithinCohort = field(default_factory=BorrowWithinCohort)


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    cohort: str | None = None
    queueing_strategy: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    fair_weight: float = 1.0
    flavor_fungibility: FlavorFungibility = field(default_factory=FlavorFungibility)


@dataclass(frozen=True, slots=True)
class Cohort:
    """A node of the cohort tree; ``resource_groups`` is extra shared quota on top of its children's."""

    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    fair_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class LocalQueue:
    name: str
    cluster_queue: str


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str = "main"
    count: int = 1
    requests: Mapping[str, float] = field(default_factory=dict)
    gpu_fraction: float = 0.0
    gpu_memory_mb: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # Required node affinity ``kubernetes.io/hostname NotIn``: a retry after a GPU/node fault stays off these.
    excluded_nodes: frozenset[str] = frozenset()
    tolerations: tuple[Toleration, ...] = ()  # this pod set's own, on top of the workload's
    topology_request: TopologyRequest | None = None  # Kueue TAS; None: no topology constraint

    @property
    def shares_gpu(self) -> bool:
        return self.gpu_fraction > 0 or self.gpu_memory_mb > 0


@dataclass(frozen=True, slots=True)
class Elastic:
    """Kueue's ``kueue.x-k8s.io/elastic-job`` opt-in (ElasticJobsViaWorkloadSlices) with taugrid's size range for
    one pod set: it may be shrunk in place down to ``min_count`` (for a preemptor, before any whole workload is
    evicted) and grows by ``step`` pods up to ``max_count`` when quota frees, at most once per ``cooldown_s``."""

    pod_set: str | None = None  # the pod set that resizes; None: the last one (the workers)
    min_count: int = 1
    max_count: int | None = None  # None: the pod set's count as submitted
    step: int = 1
    cooldown_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    queue: str  # a LocalQueue name, or a ClusterQueue name
    pod_sets: tuple[PodSet, ...] = (PodSet(),)
    priority: int = 0
    preemptible: bool = True
    created_at: float = 0.0
    tolerations: tuple[Toleration, ...] = ()
    placement: PlacementStrategy = PlacementStrategy.BINPACK
    elastic: Elastic | None = None
    # Kueue ``kueue.x-k8s.io/workload-slice-replacement-for``: this workload is a scale-up slice of the admitted
    # workload named; it is charged only the pods it adds, on the flavors the old slice has, and replaces it.
    replaces: str | None = None
    # MultiKueue's preemption gate (KEP-8303, OrchestratedPreemption): a copy reserved at one of several clusters
    # may be admitted where it fits but preempts nothing until the dispatcher lets it (it waits PreemptionGated)
    preemption_gated: bool = False

    def elastic_index(self) -> int | None:
        """Index of the pod set that resizes, None for a fixed-size workload."""
        if self.elastic is None:
            return None
        if self.elastic.pod_set is None:
            return len(self.pod_sets) - 1
        return next((i for i, ps in enumerate(self.pod_sets) if ps.name == self.elastic.pod_set), None)

    def validate(self) -> None:
        """Reject requests KAI/Kueue would reject; the message names the field and the fix."""
        if not self.pod_sets:
            raise PermanentError(f"workload {self.name}: pod_sets is empty; give at least one pod set")
        for ps in self.pod_sets:
            where = f"workload {self.name} pod set {ps.name}"
            if ps.count < 1:
                raise PermanentError(f"{where}: count={ps.count}; count must be >= 1")
            if not 0 <= ps.gpu_fraction < 1:
                raise PermanentError(f"{where}: gpu_fraction={ps.gpu_fraction}; use 0 < f < 1 or whole GPUs")
            if ps.gpu_fraction and ps.gpu_memory_mb:
                raise PermanentError(f"{where}: gpu_fraction and gpu_memory_mb both set; choose one")
            if ps.shares_gpu and ps.requests.get(GPU, 0):
                raise PermanentError(f"{where}: a shared GPU cannot be combined with {GPU}; drop one")
            if any(v < 0 for v in ps.requests.values()):
                raise PermanentError(f"{where}: negative request; requests must be >= 0")
            if ps.topology_request is not None:
                _validate_topology_request(where, ps.count, ps.topology_request)
        _validate_groups(self)
        if self.elastic is not None:
            _validate_elastic(self)


# Kueue's flavorassigner errors for TAS requests on elastic workloads (ElasticJobsViaWorkloadSlicesWithTAS).
ERR_ELASTIC_REQUIRED = "required topology is not supported with ElasticJobsViaWorkloadSlices"
ERR_ELASTIC_PREFERRED = "preferred topology is not supported with ElasticJobsViaWorkloadSlices"


def _validate_elastic(w: Workload) -> None:
    e = w.elastic
    assert e is not None
    where = f"workload {w.name} elastic"
    i = w.elastic_index()
    if i is None:
        raise PermanentError(f"{where}: pod_set {e.pod_set!r} is not a pod set of the workload; use one of "
                             f"{[ps.name for ps in w.pod_sets]}")
    count = w.pod_sets[i].count
    high = e.max_count if e.max_count is not None else count
    if not 1 <= e.min_count <= count <= high:
        raise PermanentError(f"{where}: min_count={e.min_count}, count={count}, max_count={high}; use "
                             f"1 <= min_count <= count <= max_count")
    if e.step < 1 or e.cooldown_s < 0:
        raise PermanentError(f"{where}: step={e.step}, cooldown_s={e.cooldown_s:g}; use step >= 1 and "
                             f"cooldown_s >= 0")
    for ps in w.pod_sets:
        tr = ps.topology_request
        if tr is not None and tr.required is not None:
            raise PermanentError(f"workload {w.name} pod set {ps.name}: {ERR_ELASTIC_REQUIRED}; use an "
                                 f"unconstrained topology request or drop elastic")
        if tr is not None and tr.preferred is not None:
            raise PermanentError(f"workload {w.name} pod set {ps.name}: {ERR_ELASTIC_PREFERRED}; use an "
                                 f"unconstrained topology request or drop elastic")


def _validate_groups(w: Workload) -> None:
    """Kueue's ``ValidatePodSetGroupingTopology``: a group is exactly two pod sets, one of them a single pod,
    asking for the same required or preferred level."""
    groups: dict[str, list[PodSet]] = {}
    for ps in w.pod_sets:
        if ps.topology_request is not None and ps.topology_request.pod_set_group is not None:
            groups.setdefault(ps.topology_request.pod_set_group, []).append(ps)
    for name, members in groups.items():
        where = f"workload {w.name} topology_request.pod_set_group {name!r}"
        if len(members) != 2:
            raise PermanentError(f"{where}: {len(members)} pod set(s); a group is exactly 2 pod sets (a leader "
                                 f"and its workers)")
        a, b = (m.topology_request for m in members)
        if a is None or b is None or (a.required, a.preferred) != (b.required, b.preferred):
            raise PermanentError(f"{where}: its pod sets ask for different levels; give both the same required "
                                 f"or preferred level")
        if members[0].count != 1 and members[1].count != 1:
            raise PermanentError(f"{where}: pod sets of {members[0].count} and {members[1].count} pods; one of "
                                 f"them (the leader) must have 1 pod")


def _validate_topology_request(where: str, count: int, tr: TopologyRequest) -> None:
    """Kueue's webhook rules for the TAS podset annotations."""
    if sum((tr.required is not None, tr.preferred is not None, tr.unconstrained)) > 1:
        raise PermanentError(f"{where}: topology_request sets more than one of required, preferred and "
                             f"unconstrained; choose one")
    if tr.slice_required is not None and tr.slice_size is None:
        raise PermanentError(f"{where}: topology_request slice_size must be set when slice_required is; give "
                             f"the number of pods per slice")
    if tr.slice_required is None and tr.slice_size is not None:
        raise PermanentError(f"{where}: topology_request slice_size may not be set without slice_required; name "
                             f"the level each slice must fit in")
    if tr.slice_size is not None and not 1 <= tr.slice_size <= count:
        raise PermanentError(f"{where}: topology_request slice_size={tr.slice_size}; use 1 <= slice_size <= the "
                             f"pod set count {count}")
    if tr.pod_set_group is not None:
        if tr.required is None and tr.preferred is None:
            raise PermanentError(f"{where}: topology_request pod_set_group needs required or preferred; name the "
                                 f"level the group must share")
        if tr.slice_required is not None:
            raise PermanentError(f"{where}: topology_request pod_set_group may not be set with slice_required; "
                                 f"drop one")
    if tr.slice_size is not None and count % tr.slice_size:
        # Kueue places count // slice_size whole slices and leaves the rest unplaced; refuse instead.
        raise PermanentError(f"{where}: topology_request slice_size={tr.slice_size} does not divide the pod set "
                             f"count {count}; use a divisor of it")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    memory_mb: int = 81920


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: tuple[GpuDevice, ...] = ()
    cpu: float = 0.0
    memory: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True  # a NotReady node takes nothing new (Kueue's TAS drops it from the topology)
    max_pods: int | None = None  # allocatable ``pods``; None: no limit
    # The vendor resource its GPUs are (``nvidia.com/gpu``, ``amd.com/gpu``, ``habana.ai/gaudi``): a node has
    # one vendor's GPUs, and only pods asking for that resource (a GPU share: NVIDIA's) get them.
    gpu_resource: str = GPU


def gpu_request(pod_set: PodSet) -> tuple[str, int]:
    """The whole-GPU resource a pod set asks for and how many per pod; a share of a GPU is NVIDIA's
    (``(GPU, 0)`` for a pod set asking for no GPU)."""
    for resource, amount in pod_set.requests.items():
        if resource in GPU_RESOURCES and amount > 0:
            return resource, int(round(amount))
    return GPU, 0


def fraction_units(pod_set: PodSet, gpu_memory_mb: int) -> int:
    """m-GPU one pod of a sharing pod set takes on a GPU with ``gpu_memory_mb`` of memory (rounded up)."""
    if pod_set.gpu_fraction:
        return math.ceil(pod_set.gpu_fraction * UNIT - 1e-9)
    if pod_set.gpu_memory_mb:
        return min(UNIT, math.ceil(pod_set.gpu_memory_mb * UNIT / gpu_memory_mb - 1e-9))
    return 0
