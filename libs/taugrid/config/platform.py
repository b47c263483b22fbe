"""``platform.yaml``: the administrator's policy — topologies, flavors, cohorts, queues, priorities, profiles,
workspaces, and the people allowed on the bus (users, groups, workspace members and admins).

Shapes follow Kueue (Topology, ResourceFlavor, Cohort, ClusterQueue, LocalQueue, WorkloadPriorityClass) in snake_case,
plus taugrid's compute profiles and workspaces. A platform with no ``users`` is single-user (embedded) mode: the
person who ran ``tau up`` is its platform admin. Invariants: every model forbids unknown keys;
``load_platform`` returns only a platform whose cross-references all resolve (see ``platformcheck``); the
platform carries no revision — the KV store assigns one when it is applied. Quantities are kept as written
(``"64Gi"``, ``16``) and parsed on use.
"""

from __future__ import annotations

import gc
import pickle
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pydantic
from pydantic import Field, PrivateAttr

from taugrid.config.clusters import Cluster, Dispatch
from taugrid.config.departments import DEPARTMENTS_ROOT, KAI_RESOURCES, Department
from taugrid.config.fields import CpuQuantity, Duration, MemoryQuantity, Strict, Text
from taugrid.config.podsready import WaitForPodsReady
from taugrid.config.retention import Retention
from taugrid.config.source import load_yaml, pydantic_issues, raise_issues
from taugrid.core import heap
from taugrid.core.quantity import parse_cpu, parse_memory

GPU_RESOURCE = "nvidia.com/gpu"
Role = Literal["researcher", "platform-admin"]
# A person's or group's name: one token, so it can name a credentials file and never splits a NATS subject.
PrincipalName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]


class Taint(Strict):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class Toleration(Strict):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] = ""


class Topology(Strict):
    """Kueue's ``Topology``: the node labels that group nodes into domains, highest level first (block → rack →
    host). Checked in ``platformtopology`` as Kueue's CRD and webhook check it (1-16 unique label keys;
    ``kubernetes.io/hostname`` only as the last level)."""

    name: str
    levels: list[str] = Field(default_factory=list,
                              description="node label keys, highest level first (Kueue spec.levels[].nodeLabel)")


class ResourceFlavor(Strict):
    name: str
    node_labels: dict[str, Text] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    tolerations: list[Toleration] = Field(default_factory=list)
    topology_name: str | None = Field(default=None, description="a topologies[].name: this flavor's nodes are "
                                      "placed by topology-aware scheduling (Kueue spec.topologyName)")
    gpu_model: str | None = Field(default=None, description="the GPU model of this flavor's nodes (taugrid.core."
                                  "devices: nvidia-h100, amd-mi300x, gaudi3, ...); its GPU quota is that vendor's")


class Cohort(Strict):
    name: str
    parent: str | None = None
    fair_weight: float = Field(default=1.0, ge=0)


class ResourceQuota(Strict):
    name: str = Field(description="cpu, memory, nvidia.com/gpu, ...")
    nominal_quota: Text
    borrowing_limit: Text | None = None
    lending_limit: Text | None = None


class FlavorQuotas(Strict):
    name: str
    resources: list[ResourceQuota]


class ResourceGroup(Strict):
    covered_resources: list[str] = Field(min_length=1)
    flavors: list[FlavorQuotas] = Field(min_length=1)


class BorrowWithinCohort(Strict):
    policy: Literal["Never", "LowerPriority"] = "Never"
    max_priority_threshold: int | None = None


class Preemption(Strict):
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "Never"
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = "Never"
    borrow_within_cohort: BorrowWithinCohort = Field(default_factory=BorrowWithinCohort)


class FairSharing(Strict):
    weight: float = Field(default=1.0, ge=0)


class FlavorFungibility(Strict):
    """Kueue ``flavorFungibility``: when the flavor search moves past a flavor that needs borrowing or
    preemption, and which to prefer when every flavor needs one (``preference`` only with both TryNextFlavor)."""

    when_can_borrow: Literal["MayStopSearch", "TryNextFlavor", "Borrow"] = Field(
        default="MayStopSearch", description="Borrow is Kueue's deprecated name for MayStopSearch")
    when_can_preempt: Literal["MayStopSearch", "TryNextFlavor", "Preempt"] = Field(
        default="TryNextFlavor", description="Preempt is Kueue's deprecated name for MayStopSearch")
    preference: Literal["BorrowingOverPreemption", "PreemptionOverBorrowing"] | None = None

    @pydantic.model_validator(mode="after")
    def _preference_needs_try_next(self) -> FlavorFungibility:
        if self.preference is not None and not (self.when_can_borrow == "TryNextFlavor"
                                                and self.when_can_preempt == "TryNextFlavor"):
            raise ValueError("flavor_fungibility.preference can only be set when when_can_borrow and "
                             "when_can_preempt are both TryNextFlavor (Kueue's rule); set both or drop preference")
        return self


FairStrategy = Literal["LessThanOrEqualToFinalShare", "LessThanInitialShare"]


def _default_strategies() -> list[FairStrategy]:
    return ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]


class FairSharingPolicy(Strict):
    """Kueue's fair sharing (its Configuration ``fairSharing``): orders heads by dominant resource share and
    preempts by it (``InCohortFairSharing``)."""

    enable: bool | None = Field(default=None, description="unset: on when some fair_sharing.weight is not 1")
    preemption_strategies: list[FairStrategy] = Field(
        default_factory=_default_strategies, min_length=1,
        max_length=2, description="tried in order; Kueue's default is both")


class ClusterQueue(Strict):
    name: str
    cohort: str | None = None
    namespace_selector: dict[str, Text] | None = Field(
        default=None, description="matchLabels; absent or {} admits every namespace"
    )
    queueing_strategy: Literal["StrictFIFO", "BestEffortFIFO"] = "BestEffortFIFO"
    resource_groups: list[ResourceGroup] = Field(default_factory=list)
    preemption: Preemption = Field(default_factory=Preemption)
    fair_sharing: FairSharing = Field(default_factory=FairSharing)
    flavor_fungibility: FlavorFungibility = Field(default_factory=FlavorFungibility)

    def nominal(self, resource: str) -> float:
        """Sum of a resource's nominal quota over all flavors (cores, bytes or a count)."""
        return sum(
            amount(q.name, q.nominal_quota)
            for g in self.resource_groups
            for f in g.flavors
            for q in f.resources
            if q.name == resource
        )


class LocalQueue(Strict):
    name: str
    namespace: str
    cluster_queue: str


class PriorityClass(Strict):
    name: str
    value: int
    description: str = ""
    preemptible: bool = True


class ComputeProfile(Strict):
    name: str = Field(description="e.g. a100-1")
    description: str = ""
    gpu: int = Field(default=0, ge=0)
    cpu: CpuQuantity = "1"
    memory: MemoryQuantity = "1Gi"
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1)
    gpu_memory: MemoryQuantity | None = None
    gpu_model: str | None = Field(default=None, description="the GPU model runs on this profile get (taugrid.core."
                                  "devices), so its vendor's resource: nvidia-h100, amd-mi300x, gaudi3, ...")
    image: str | None = Field(default=None, description="the image of a run on this profile that names none "
                              "(the vendor's stack: a ROCm or Gaudi image on those profiles)")
    node_selector: dict[str, Text] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    gpu_hour_price: float = Field(default=0.0, ge=0, description="estimated price of one GPU-hour on this profile, "
                                  "for `tau usage` (any currency; 0: not priced)")


class User(Strict):
    name: PrincipalName
    nkey: str = Field(description="the user's public NATS nkey (U…, 56 characters), from `tau admin user add`")
    groups: list[str] = Field(default_factory=list, description="names of groups this user belongs to")
    role: Role = Field(default="researcher", description="platform-admin may apply the platform and manage users")
    description: str = ""


class Group(Strict):
    name: PrincipalName
    description: str = ""


class Workspace(Strict):
    name: str
    namespace: str
    local_queue: str
    description: str = ""
    allowed_images: list[str] = Field(
        default_factory=list, description="glob patterns; empty allows any image"
    )
    allow_local_process: bool = Field(
        default=False,
        description="allow runs without an image (a host process on the local backend) even when "
        "allowed_images is set; with allowed_images empty they are always allowed",
    )
    max_gpus_per_run: int | None = Field(default=None, ge=0)
    default_priority: str | None = Field(default=None, description="a priority class name")
    default_profile: str | None = None
    allowed_profiles: list[str] = Field(default_factory=list, description="empty allows every profile")
    output_root: str = "/data/runs"
    max_retries: int | None = Field(default=None, ge=0, description="cap on resilience.max_retries")
    active_deadline: Duration | None = Field(
        default=None, gt=0, description="cap on run.active_deadline; also the default when a run sets none"
    )
    ttl_seconds_after_finished: int | None = Field(default=None, ge=600)
    members: list[str] = Field(
        default_factory=list, description="users or groups who may submit here and read this workspace's runs"
    )
    admins: list[str] = Field(
        default_factory=list, description="users or groups who may also cancel anyone's run here (implies member)"
    )
    allowed_priority_classes: list[str] = Field(
        default_factory=list, description="priority class names runs here may use; empty allows every class"
    )
    submissions_per_minute: int | None = Field(
        default=None, ge=0,
        description="new submissions admitted at once and then per minute in this workspace; more wait their "
                    "turn, in order (default 2000; 0 = unlimited)",
    )


NodeName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$",
                                description="a node name (a DNS label: lowercase letters, digits, '-', '.')")]


class LocalNode(Strict):
    """One node of the local backend's pool: its own GPUs, capacity and node-agent identity."""

    name: NodeName
    gpus: int = Field(default=0, ge=0, le=64, description="GPUs this node offers (declared, simulated)")
    gpu_memory: MemoryQuantity | None = Field(default=None, description="memory of each GPU (default: its "
                                              "gpu_model's, else 80Gi)")
    gpu_model: str | None = Field(default=None, description="the model of its GPUs (taugrid.core.devices; absent: "
                                  "NVIDIA's), whose vendor's resource they are given for")
    cpus: CpuQuantity | None = Field(default=None, description="CPU cores; absent: time-shared, bounded by quota")
    memory: MemoryQuantity | None = Field(default=None, description="memory; absent: this machine's memory")
    labels: dict[str, Text] = Field(default_factory=dict, description="node labels that flavors can select")


class LocalPool(Strict):
    """The local backend's nodes. Empty: one node, this machine (its name, GPUs and memory), as before."""

    nodes: list[LocalNode] = Field(default_factory=list)

    @pydantic.model_validator(mode="after")
    def _unique(self) -> LocalPool:
        seen: set[str] = set()
        for n in self.nodes:
            if n.name in seen:
                raise ValueError(f"local.nodes: node name {n.name!r} appears twice; give every node its own name")
            seen.add(n.name)
        return self


@dataclass
class _Lookups:
    """A platform's name lookups, built once per platform object rather than walked per call (issue 30: Kueue's
    large-scale shape has 1,000 ClusterQueues and workspaces, and resolving one run walked them ~2,000 times, 9 ms
    of the policy's CPU a run). ``key`` is the identity and length of every list they derive from: a copy made with
    other lists (``model_copy(update=...)``, a deep copy) builds its own. A platform is not changed in place once
    read (``siteplatform.for_cluster`` changes its deep copy's quotas before any lookup on it)."""

    key: tuple[int, ...]
    workspaces: dict[str, Workspace]
    cluster_queues: dict[str, ClusterQueue]
    parents: dict[str, str | None]
    roots: dict[str | None, str | None] = field(default_factory=dict)
    pools: dict[str, list[ClusterQueue]] = field(default_factory=dict)
    nominal: dict[tuple[str, str], float] = field(default_factory=dict)


class Platform(Strict):
    topologies: list[Topology] = Field(default_factory=list)
    _lookups: _Lookups | None = PrivateAttr(default=None)
    resource_flavors: list[ResourceFlavor] = Field(default_factory=list)
    cohorts: list[Cohort] = Field(default_factory=list)
    cluster_queues: list[ClusterQueue] = Field(default_factory=list)
    local_queues: list[LocalQueue] = Field(default_factory=list)
    priority_classes: list[PriorityClass] = Field(default_factory=list)
    compute_profiles: list[ComputeProfile] = Field(default_factory=list)
    workspaces: list[Workspace] = Field(default_factory=list)
    users: list[User] = Field(default_factory=list, description="people on the bus; none = single-user mode")
    groups: list[Group] = Field(default_factory=list)
    local: LocalPool = Field(default_factory=LocalPool,
                             description="the local backend's node pool (the Kubernetes backend has real nodes)")
    departments: list[Department] = Field(
        default_factory=list, description="KAI's department → project queues (see taugrid.config.departments)")
    fair_sharing: FairSharingPolicy = Field(default_factory=FairSharingPolicy)
    wait_for_pods_ready: WaitForPodsReady = Field(default_factory=WaitForPodsReady,
                                                  description="Kueue's waitForPodsReady (taugrid.config.podsready)")
    retention: Retention = Field(default_factory=Retention, description="what the bus keeps and where sealed "
                                 "evidence is archived (taugrid.config.retention)")
    clusters: list[Cluster] = Field(default_factory=list,
                                    description="the sites runs are dispatched to (taugrid.config.clusters); none: "
                                    "the stack's own backend is the one cluster")
    dispatch: Dispatch = Field(default_factory=Dispatch, description="how runs are nominated to the clusters")

    def all_cohorts(self) -> list[Cohort]:
        """The cohorts written plus those the departments imply (the implicit root, then one per department)."""
        if not self.departments:
            return list(self.cohorts)
        return [*self.cohorts, Cohort(name=DEPARTMENTS_ROOT),
                *(Cohort(name=d.name, parent=DEPARTMENTS_ROOT, fair_weight=d.over_quota_weight)
                  for d in self.departments)]

    def all_cluster_queues(self) -> list[ClusterQueue]:
        """The ClusterQueues written plus one per department project (see ``departments`` for the mapping)."""
        return [*self.cluster_queues, *(self._project_queue(d, i) for d in self.departments
                                        for i in range(len(d.projects)))]

    def project_limits(self, name: str) -> dict[str, float] | None:
        """For a department's project: the least of its own and its department's limits, per resource (a
        resource with no limit is absent); ``None`` when ``name`` is no project."""
        for d in self.departments:
            for project in d.projects:
                if project.name == name:
                    out: dict[str, float] = {}
                    for limits in (d.limit, project.limit):
                        for r, v in limits.items():
                            out[r] = min(out.get(r, float("inf")), amount(r, v))
                    return out
        return None

    def department_flavor(self, department: Department) -> str:
        if department.flavor is not None:
            return department.flavor
        return self.resource_flavors[0].name if len(self.resource_flavors) == 1 else "default"

    def _project_queue(self, department: Department, index: int) -> ClusterQueue:
        project = department.projects[index]
        resources = []
        for r in KAI_RESOURCES:
            deserved = project.deserved.get(r, "0")
            limit = project.limit.get(r)
            borrowing = None
            if limit is not None:
                spare = amount(r, limit) - amount(r, deserved)
                borrowing = _quantity_text(r, max(0.0, spare))
            resources.append(ResourceQuota(name=r, nominal_quota=deserved, borrowing_limit=borrowing))
        return ClusterQueue(
            name=project.name, cohort=department.name,
            resource_groups=[ResourceGroup(covered_resources=list(KAI_RESOURCES), flavors=[
                FlavorQuotas(name=self.department_flavor(department), resources=resources)])],
            preemption=Preemption(within_cluster_queue="LowerPriority", reclaim_within_cohort="Any"),
            fair_sharing=FairSharing(weight=project.over_quota_weight),
        )

    @property
    def single_user(self) -> bool:
        """No users declared: the embedded stack's own person is the only (platform-admin) user."""
        return not self.users

    def user(self, name: str) -> User | None:
        return next((u for u in self.users if u.name == name), None)

    def user_by_nkey(self, public_key: str) -> User | None:
        return next((u for u in self.users if u.nkey == public_key), None)

    def principals(self, names: list[str]) -> set[str]:
        """User names behind a list of user and group names."""
        out: set[str] = set()
        for name in names:
            out |= {u.name for u in self.users if u.name == name or name in u.groups}
        return out

    def workspace_members(self, workspace: str) -> set[str]:
        """Users who belong to ``workspace`` (members and admins; platform admins belong everywhere)."""
        ws = self.workspace(workspace)
        admins = {u.name for u in self.users if u.role == "platform-admin"}
        return admins | (self.principals([*ws.members, *ws.admins]) if ws else set())

    def workspace_admins(self, workspace: str) -> set[str]:
        ws = self.workspace(workspace)
        admins = {u.name for u in self.users if u.role == "platform-admin"}
        return admins | (self.principals(ws.admins) if ws else set())

    def workspaces_of(self, user: str) -> list[str]:
        """Workspaces ``user`` may submit to and read, in platform order."""
        return [w.name for w in self.workspaces if user in self.workspace_members(w.name)]

    def allows_priority(self, workspace: str, priority_class: str) -> bool:
        ws = self.workspace(workspace)
        return ws is None or not ws.allowed_priority_classes or priority_class in ws.allowed_priority_classes

    def high_lane(self, workspace: str, priority_class: str) -> bool:
        """Whether a run of ``priority_class`` in ``workspace`` travels in the high lane before admission: the
        class is one the workspace may use and ranks above the workspace's default class (above the lowest class
        when the workspace names no default), so the usual run, and every run of a sweep at the default or a
        lower priority, shares the default lane and only what outranks it passes ahead."""
        ws, pc = self.workspace(workspace), self.priority_class(priority_class)
        if ws is None or pc is None or not self.allows_priority(workspace, priority_class):
            return False
        default = self.priority_class(ws.default_priority or "")
        floor = default.value if default is not None else min(p.value for p in self.priority_classes)
        return pc.value > floor

    def _index(self) -> _Lookups:
        lists = (self.workspaces, self.cluster_queues, self.cohorts, self.departments)
        key = tuple(n for lst in lists for n in (id(lst), len(lst)))
        found = self._lookups
        if found is None or found.key != key:
            workspaces: dict[str, Workspace] = {}
            for w in self.workspaces:
                workspaces.setdefault(w.name, w)  # the first of a name, as a walk finds it
            queues: dict[str, ClusterQueue] = {}
            for q in self.all_cluster_queues():
                queues.setdefault(q.name, q)
            found = self._lookups = _Lookups(key, workspaces, queues,
                                             {c.name: c.parent for c in self.all_cohorts()})
        return found

    def workspace(self, name: str) -> Workspace | None:
        return self._index().workspaces.get(name)

    def local_queue(self, name: str, namespace: str) -> LocalQueue | None:
        return next((q for q in self.local_queues if q.name == name and q.namespace == namespace), None)

    def cluster_queue(self, name: str) -> ClusterQueue | None:
        return self._index().cluster_queues.get(name)

    def priority_class(self, name: str) -> PriorityClass | None:
        return next((p for p in self.priority_classes if p.name == name), None)

    def profile(self, name: str) -> ComputeProfile | None:
        return next((p for p in self.compute_profiles if p.name == name), None)

    def flavor(self, name: str) -> ResourceFlavor | None:
        return next((f for f in self.resource_flavors if f.name == name), None)

    def topology(self, name: str) -> Topology | None:
        return next((t for t in self.topologies if t.name == name), None)

    def cohort_root(self, cohort: str | None) -> str | None:
        """The top of a cohort's tree (the cohort itself when it has no parent); ``None`` for no cohort."""
        index = self._index()
        if cohort in index.roots:
            return index.roots[cohort]
        parents, start = index.parents, cohort
        seen: set[str] = set()
        while cohort is not None and parents.get(cohort) and cohort not in seen:
            seen.add(cohort)
            cohort = parents[cohort]
        index.roots[start] = cohort
        return cohort

    def cohort_tree_queues(self, root: str) -> list[ClusterQueue]:
        """The written ClusterQueues whose cohort tree's top is ``root``, in the order written."""
        index = self._index()
        if not index.pools:
            for q in self.cluster_queues:
                top = self.cohort_root(q.cohort)
                if top:
                    index.pools.setdefault(top, []).append(q)
        return index.pools.get(root, [])

    def cohort_tree_nominal(self, root: str, resource: str) -> float:
        """``resource``'s nominal quota summed over ``cohort_tree_queues(root)``."""
        index = self._index()
        got = index.nominal.get((root, resource))
        if got is None:
            got = index.nominal[(root, resource)] = sum(q.nominal(resource) for q in self.cohort_tree_queues(root))
        return got


def amount(resource: str, value: str | int | float) -> float:
    """A quota value in base units: cores for ``cpu``, bytes for ``memory``, a count for anything else."""
    if resource == "cpu":
        return parse_cpu(value)
    if resource == "memory" or resource.endswith("memory") or resource == "ephemeral-storage":
        return float(parse_memory(value))
    return parse_cpu(value)  # plain counts ("8", 8); suffixes like 1k still read as Kubernetes does


def _quantity_text(resource: str, value: float) -> str:
    """A base-unit amount back as a quantity string (memory in bytes, cpu in cores, counts as counts)."""
    if resource == "cpu":
        return f"{round(value * 1000)}m" if not float(value).is_integer() else str(int(value))
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def load_platform(text: str, *, path: str = "platform.yaml") -> Platform:
    """Parse, validate and cross-check a ``platform.yaml``. Raises ``ConfigError`` listing every problem."""
    from taugrid.config.platformcheck import check_platform

    data, lines = load_yaml(text, path=path, what="platform.yaml")
    try:
        platform = Platform.model_validate(data)
    except pydantic.ValidationError as exc:
        raise_issues(pydantic_issues(exc, Platform, file=path, lines=lines))
        raise
    raise_issues(check_platform(platform, file=path, lines=lines))
    return platform


def load_platform_kept(text: str, *, path: str = "platform.yaml") -> Platform:
    """``load_platform`` for a process that holds the result for long (the services' ``PlatformReader``): the same
    platform, rebuilt in fresh memory once the parse's garbage is freed.

    Why: CPython's allocator returns a 1 MiB arena to the system only when every object in it is free, and a
    parse leaves the kept models and strings scattered over the arenas its transient YAML nodes, dicts and
    pydantic temporaries filled. For a platform of 1,000 ClusterQueues that pinned ~30 MB of garbage for ~10 MB
    of models (a fresh process 55 → 85 MB; rebuilt, 65 MB). The copy goes through ``pickle`` because it holds
    the whole graph in one bytes object outside those arenas, so they empty before the copy is made; the bytes
    are made here from the validated model and read back here, never stored or taken from anyone. The copy is
    equal to the parse and its lookups are built again on first use.

    Equal strings and equal sets of fields written are one object in the copy (``_share_equal``; ``pickle`` keeps
    the sharing it is given): a parse makes its own of each, and for 1,000 ClusterQueues and workspaces the
    11,000 models' ``model_fields_set`` (a set each, 2.8 MB) and their 18,000 strings (0.9 MB, most of them the
    same few: ``cpu``, ``default``, ``Never``, ``BestEffortFIFO``...) were half of the 7.5 MB kept (shared, a
    fresh process holds 5.6 MB more once it is read where it held 9.4, and the idle local cluster 62.6 MB where
    it held 66.9). A set of fields is shared only among a platform's own models, which nothing changes in place
    once read (a copy, ``model_copy`` or ``siteplatform.for_cluster``'s deep one, copies each model's set)."""
    platform = load_platform(text, path=path)
    platform._lookups = None  # keyed by the lists' ids, which the copy does not keep
    _share_equal(platform)
    frozen = pickle.dumps(platform, protocol=pickle.HIGHEST_PROTOCOL)
    del platform
    gc.collect()  # whatever of the parse is held only by reference cycles, so its arenas empty too
    kept = pickle.loads(frozen)
    assert isinstance(kept, Platform)
    del frozen
    heap.trim()  # the parse's C-level temporaries (libyaml's, the text's copies) freed below what is kept
    return kept


def _share_equal(platform: Platform) -> None:
    """Make equal strings, and the equal ``__pydantic_fields_set__`` of models, the same object throughout
    ``platform`` (values of fields, list items, dict keys and values, tuples rebuilt; only these exact types are
    walked), before it is copied."""
    strings: dict[str, str] = {}
    fields: dict[frozenset[str], set[str]] = {}

    def walk(value: object) -> object:
        if isinstance(value, str):
            return strings.setdefault(value, value)
        if isinstance(value, pydantic.BaseModel):
            written = value.__pydantic_fields_set__
            shared = fields.setdefault(frozenset(written), written)
            if shared is not written:
                object.__setattr__(value, "__pydantic_fields_set__", shared)
            values = value.__dict__
            for key, item in values.items():  # values replaced in place: the keys (field names) stay
                values[key] = walk(item)
            return value
        if type(value) is list:
            value[:] = [walk(item) for item in value]
            return value
        if type(value) is dict:
            return {walk(key): walk(item) for key, item in value.items()}
        if type(value) is tuple:
            return tuple(walk(item) for item in value)
        return value  # numbers, None, anything else: kept as it is

    walk(platform)
