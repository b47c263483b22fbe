"""Admission for the local cluster, backed by the pure Kueue/KAI engine (``taugrid.core.admission``).

Translates the platform policy into engine objects (topologies, flavors with their topology names, cohorts,
ClusterQueues with quota per flavor, LocalQueues), the node pool into engine Nodes (the platform's
``local.nodes``, each with its own GPUs as devices and its labels, ``kubernetes.io/hostname`` included; without
them, this machine as one node whose CPU is time-shared by processes, so only quota bounds it), and each workload
into an engine Workload whose pod set carries the rendered pod template's Kueue TAS request (``job_topology``,
passed only when the platform declares topologies). ``cycle`` returns the admissions (with the node and GPU
devices each pod got) and records preemptions for the cluster to carry out.

Invariants: a cordoned node keeps what runs on it but gets nothing new; a workload's ``excluded_nodes`` (the
rendered ``kubernetes.io/hostname NotIn`` affinity of a retry after a GPU/node fault) never land there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from taugrid.config.platform import Platform
from taugrid.config.platformtopology import HOSTNAME_LABEL, node_labels
from taugrid.core import admission as adm
from taugrid.core import devices
from taugrid.core.admission import results as adm_results
from taugrid.core.contracts import PodSetTopology, TopologyDomain
from taugrid.core.errors import PermanentError
from taugrid.core.manifestkeys import (
    TOPOLOGY_PREFERRED,
    TOPOLOGY_REQUIRED,
    TOPOLOGY_SLICE,
    TOPOLOGY_SLICE_SIZE,
    TOPOLOGY_UNCONSTRAINED,
)
from taugrid.core.quantity import parse_cpu, parse_memory
from taugrid.local import raycluster
from taugrid.local.kaiqueues import kai_spec, with_department_quota

GPU = "nvidia.com/gpu"
_UNLIMITED_CPU = 1e6
# A pod set's excluded nodes when it has none (nearly always): one object for all, where ``frozenset(())`` is a new
# 216-byte set per waiting workload, kept while it waits (issue 27: a backlog's small objects stay resident)
_NONE_EXCLUDED: frozenset[str] = frozenset()


@dataclass(slots=True)
class Request:
    name: str
    cluster_queue: str  # resolved ClusterQueue ("" when the LocalQueue is unknown)
    priority: int
    created: float
    pods: int
    per_pod: dict[str, float]
    gpu_fraction: float = 0.0
    gpu_memory_mb: int = 0
    preemptible: bool = True
    placement: str = "binpack"
    excluded_nodes: tuple[str, ...] = ()
    topology: adm.TopologyRequest | None = None  # the pod set's Kueue TAS request (``topology_request``)
    # For a workload that is already running: the flavors it was admitted with and each pod's GPU indices.
    flavors: dict[str, str] = field(default_factory=dict)
    gpus: list[list[int]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # per pod: the pool node it runs on ("" = unknown)
    elastic: adm.Elastic | None = None  # an elastic run's range (``job_elastic``)
    preemption_gated: bool = False  # a site's reservation not (yet) let preempt by the dispatcher (§13d)
    # A Ray cluster's head pod's requests (``raycluster``): the workload is Kueue's two RayJob pod sets, ``head``
    # (one pod) and ``workers`` (``pods`` pods of ``per_pod``, the pod set that resizes); empty: one pod set.
    head: dict[str, float] = field(default_factory=dict)

    def pod_sets(self) -> list[tuple[str, int]]:
        """(pod set, pods) in the engine's order: per-pod lists (``gpus``, ``nodes``) follow it."""
        return [(raycluster.HEAD, 1), (raycluster.WORKERS, self.pods)] if self.head else [("main", self.pods)]


@dataclass
class Granted:
    name: str
    cluster_queue: str
    flavors: dict[str, str]
    gpus: list[list[int]]  # per pod: GPU indices
    nodes: list[str] = field(default_factory=list)  # per pod: the node it was placed on
    # the engine's topology assignment per TAS pod set (Kueue's, domains in rank order); empty without TAS
    topology: list[PodSetTopology] = field(default_factory=list)


@dataclass(frozen=True)
class PoolNode:
    """One node of the local pool as the engine sees it."""

    name: str
    gpus: int = 0
    gpu_memory_mb: int = 81920
    cpu: float | None = None  # None: time-shared (quota is the only bound)
    memory: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    gpu_resource: str = GPU  # its GPUs' vendor resource (local.nodes[].gpu_model)


def pool_nodes(p: Platform | None, machine: PoolNode) -> list[PoolNode]:
    """The platform's ``local.nodes``, or this machine alone when it declares none. A node's labels include
    ``kubernetes.io/hostname`` (its name unless written), as a kubelet labels its node: TAS reads it as a level."""
    if p is None or not p.local.nodes:
        return [replace(machine, labels=tuple(sorted({HOSTNAME_LABEL: machine.name, **dict(machine.labels)}.items())))]
    return [PoolNode(n.name, n.gpus, _gpu_memory_mb(n.gpu_memory, n.gpu_model),
                     parse_cpu(n.cpus) if n.cpus is not None else None,
                     float(parse_memory(n.memory)) if n.memory is not None else machine.memory,
                     tuple(sorted(node_labels(n).items())), _gpu_resource(n.gpu_model))
            for n in p.local.nodes]


def _gpu_memory_mb(gpu_memory: str | None, gpu_model: str | None) -> int:
    """Each GPU's memory: as written, else its model's (an H200's 141 GiB), else 80 GiB."""
    model = devices.model(gpu_model) if gpu_model else None
    if gpu_memory:
        return int(parse_memory(gpu_memory)) >> 20
    return model.memory_gib << 10 if model is not None else 81920


def _gpu_resource(gpu_model: str | None) -> str:
    model = devices.model(gpu_model) if gpu_model else None
    return devices.VENDORS[model.vendor].resource if model is not None else GPU


def topology_request(annotations: Mapping[str, str], *, slices: bool = True) -> adm.TopologyRequest | None:
    """A pod template's Kueue TAS annotations as the engine's request, read as Kueue's jobframework reads them
    (required, else preferred, else unconstrained; the slice pair with either or alone); None when it asks for
    none. ``slices=False`` (a RayJob, one pod on this backend) drops the slice pair: one pod is inside one domain
    of every level, so any slice is met."""
    required = annotations.get(TOPOLOGY_REQUIRED)
    preferred = annotations.get(TOPOLOGY_PREFERRED)
    unconstrained = annotations.get(TOPOLOGY_UNCONSTRAINED, "").lower() == "true"
    slice_level = annotations.get(TOPOLOGY_SLICE) if slices else None
    size = annotations.get(TOPOLOGY_SLICE_SIZE) if slices else None
    if not (required or preferred or unconstrained or (slice_level and size)):
        return None
    return adm.TopologyRequest(
        required=required or None, preferred=None if required else preferred or None,
        unconstrained=unconstrained and not (required or preferred),
        slice_required=slice_level if slice_level and size else None,
        slice_size=int(size) if slice_level and size else None)


def job_elastic(job: Mapping[str, Any]) -> adm.Elastic | None:
    """An elastic Job's or RayJob's range (``render``'s ``taugrid.io/elastic``: min:max:step:cooldown, with Kueue's
    opt-in); a Job's pods, or a RayJob's workers (a Ray cluster here, ``raycluster``), are the pod set that
    resizes. None for anything else."""
    ann = job.get("metadata", {}).get("annotations", {}) or {}
    text = ann.get("taugrid.io/elastic", "")
    if job.get("kind") not in ("Job", "RayJob") or ann.get("kueue.x-k8s.io/elastic-job") != "true" or not text:
        return None
    low, high, step, cooldown = text.split(":")
    return adm.Elastic(min_count=int(low), max_count=int(high), step=int(step), cooldown_s=float(cooldown))


def job_topology(job: Mapping[str, Any]) -> adm.TopologyRequest | None:
    """The TAS request of a rendered Job's pod template or a RayJob's workers (the pod set the local cluster
    admits: a Job's pods, or a RayJob as one pod)."""
    spec = job.get("spec") or {}
    if job.get("kind") == "RayJob":
        groups = (spec.get("rayClusterSpec") or {}).get("workerGroupSpecs") or [{}]
        template = groups[0].get("template") or {}
        return topology_request((template.get("metadata") or {}).get("annotations") or {}, slices=False)
    template = spec.get("template") or {}
    return topology_request((template.get("metadata") or {}).get("annotations") or {})


def wire_topology(assignments: Mapping[str, adm.TopologyAssignment]) -> list[PodSetTopology]:
    """The engine's topology assignments as the Workload's admission carries them (pod sets in name order)."""
    return [PodSetTopology(pod_set=name, levels=list(ta.levels),
                           domains=[TopologyDomain(values=list(values), count=count) for values, count in ta.domains])
            for name, ta in sorted(assignments.items())]


@dataclass
class Pending:
    reason: str
    message: str
    position: int  # runs ahead of it in its ClusterQueue (0: next), as `tau queue` numbers them

    @property
    def untried(self) -> bool:
        """The engine's words for a workload no cycle has considered yet (it has no reason of its own)."""
        return (self.reason, self.message) == (adm_results.PENDING, adm_results.MSG_QUEUED)


@dataclass
class Evicted:
    victim: str
    preemptor: str
    reason: str
    message: str


def amount(resource: str, value: object) -> float:
    """A Kubernetes quantity in the engine's units: cores, bytes, or a count."""
    if resource == "cpu":
        return parse_cpu(value)  # type: ignore[arg-type]
    if resource == "memory":
        return float(parse_memory(value))  # type: ignore[arg-type]
    return float(value)  # type: ignore[arg-type]


_FUNGIBLE = {"Borrow": "MayStopSearch", "Preempt": "MayStopSearch"}  # Kueue's deprecated names


def engine_topologies(p: Platform) -> list[adm.Topology]:
    """The platform's ``topologies`` as the engine's (levels highest first, as Kueue's Topology lists them)."""
    return [adm.Topology(t.name, tuple(t.levels)) for t in p.topologies]


def engine_objects(p: Platform) -> tuple[list[adm.ClusterQueue], list[adm.Cohort], list[adm.ResourceFlavor]]:
    flavors = [adm.ResourceFlavor(f.name, {k: str(v) for k, v in f.node_labels.items()},
                                  tuple(adm.Taint(t.key, t.value, t.effect) for t in f.taints),
                                  topology_name=f.topology_name)
               for f in p.resource_flavors]
    cohorts = [adm.Cohort(c.name, parent=c.parent, fair_weight=c.fair_weight) for c in p.all_cohorts()]
    cqs = []
    for cq in p.all_cluster_queues():
        groups = tuple(
            adm.ResourceGroup(tuple(g.covered_resources), tuple(
                adm.FlavorQuotas(fq.name, {r.name: adm.ResourceQuota(
                    amount(r.name, r.nominal_quota),
                    None if r.borrowing_limit is None else amount(r.name, r.borrowing_limit),
                    None if r.lending_limit is None else amount(r.name, r.lending_limit),
                ) for r in fq.resources}) for fq in g.flavors))
            for g in cq.resource_groups)
        pre, ff = cq.preemption, cq.flavor_fungibility
        policy = adm.PreemptionPolicy(
            adm.WithinClusterQueue(pre.within_cluster_queue), adm.ReclaimWithinCohort(pre.reclaim_within_cohort),
            adm.BorrowWithinCohort(adm.BorrowWithinCohortPolicy(pre.borrow_within_cohort.policy),
                                   pre.borrow_within_cohort.max_priority_threshold))
        cqs.append(adm.ClusterQueue(cq.name, groups, cohort=cq.cohort,
                                    queueing_strategy=adm.QueueingStrategy(cq.queueing_strategy),
                                    preemption=policy, fair_weight=cq.fair_sharing.weight,
                                    flavor_fungibility=adm.FlavorFungibility(
                                        adm.WhenCanBorrow(_FUNGIBLE.get(ff.when_can_borrow, ff.when_can_borrow)),
                                        adm.WhenCanPreempt(_FUNGIBLE.get(ff.when_can_preempt, ff.when_can_preempt)),
                                        None if ff.preference is None else adm.FungibilityPreference(ff.preference))))
    return cqs, cohorts, flavors


@dataclass
class LocalAdmitter:
    node: str
    capacity: dict[str, float]
    gpu_count: int = 0
    gpu_memory_mb: int = 81920
    gpu_resource: str = GPU  # whose GPUs this machine's are (machine.inventory), without local.nodes
    engine: adm.Engine | None = None
    requests: dict[str, Request] = field(default_factory=dict)
    preempted: list[Evicted] = field(default_factory=list)
    resized: list[adm.Resize] = field(default_factory=list)  # elastic workloads the last cycle grew or shrank
    quotas: dict[str, dict[str, float]] = field(default_factory=dict)
    cohort_of: dict[str, str] = field(default_factory=dict)
    cordoned: dict[str, str] = field(default_factory=dict)  # node → why; nothing new lands there until re-validated
    pool: list[PoolNode] = field(default_factory=list)
    # Whether the platform declares topologies: only then is a pod set's TAS request passed to the engine (without
    # them no flavor is a TAS flavor, and the local backend keeps its old answer: the request has no effect here).
    tas: bool = False

    def machine(self) -> PoolNode:
        return PoolNode(self.node, self.gpu_count, self.gpu_memory_mb or 81920, None, self.capacity.get("memory", 0.0),
                        gpu_resource=self.gpu_resource)

    def configure(self, p: Platform) -> None:
        """Build an empty engine for a platform revision; ``rebuild`` refills it."""
        cqs, cohorts, flavors = engine_objects(p)
        self.pool = pool_nodes(p, self.machine())
        self.tas = bool(p.topologies)
        nodes = [adm.Node(n.name, tuple(adm.GpuDevice(i, n.gpu_memory_mb) for i in range(n.gpus)),
                          cpu=_UNLIMITED_CPU if n.cpu is None else n.cpu, memory=n.memory, labels=dict(n.labels),
                          gpu_resource=n.gpu_resource)
                 for n in self.pool]
        # departments (KAI queues) divide the whole pool; their fair shares, not Kueue's fair sharing, apply to them
        pool = {"cpu": _UNLIMITED_CPU if any(n.cpu is None for n in self.pool) else sum(n.cpu or 0 for n in self.pool),
                "memory": sum(n.memory for n in self.pool) or _UNLIMITED_CPU * 2**30,
                GPU: float(sum(n.gpus for n in self.pool))}
        cohorts = with_department_quota(p, cohorts, pool)
        fair = p.fair_sharing.enable if p.fair_sharing.enable is not None else any(
            cq.fair_sharing.weight != 1.0 for cq in p.cluster_queues)
        self.engine = adm.Engine(cqs, cohorts, flavors, nodes, fair_sharing=fair,
                                 fair_sharing_strategies=tuple(p.fair_sharing.preemption_strategies),
                                 gpu_memory_mb=max((n.gpu_memory_mb for n in self.pool), default=81920),
                                 kai=kai_spec(p, pool), topologies=engine_topologies(p))
        for name in self.cordoned:
            self.engine.set_schedulable(name, False)
        self.quotas = {}
        self.cohort_of = {cq.name: cq.cohort or "" for cq in cqs}
        for cq in cqs:
            q = self.quotas.setdefault(cq.name, {})
            for g in cq.resource_groups:
                for fq in g.flavors:
                    for r, rq in fq.resources.items():
                        q[r] = q.get(r, 0.0) + rq.nominal_quota
        self.requests = {}

    def rebuild(self, running: list[Request], pending: list[Request]) -> None:
        """Refill a fresh engine: what runs now is restored first with the flavors and GPU devices it holds
        (a workload whose record lacks them, or no longer fits the new revision, is re-admitted by a cycle as
        before; the grants of that cycle are not news), then the waiting queue as it was."""
        readmit = []
        now = time.time()
        for req in running:
            if not self._restore(req, now):
                readmit.append(req)
        for req in readmit:
            self.submit(req)
        if self.engine is not None and readmit:
            self.engine.cycle(now)
        for req in pending:
            self.submit(req)

    def node_names(self) -> list[str]:
        return [n.name for n in self.pool] or [self.node]

    def gpu_memory_of(self, node: str) -> int:
        return next((n.gpu_memory_mb for n in self.pool if n.name == node), self.gpu_memory_mb or 81920)

    def cordon(self, node: str, reason: str) -> None:
        """Nothing new lands on ``node`` (what runs there stays until drained)."""
        self.cordoned[node] = reason or "unhealthy"
        if self.engine is not None:
            self.engine.set_schedulable(node, False)

    def uncordon(self, node: str) -> None:
        self.cordoned.pop(node, None)
        if self.engine is not None:
            self.engine.set_schedulable(node, True)

    def _all_cordoned(self) -> str:
        """Why nothing can be placed anywhere, when every node of the pool is cordoned; else ""."""
        names = self.node_names()
        if not names or any(n not in self.cordoned for n in names):
            return ""
        what = "; ".join(f"node {n} is cordoned ({self.cordoned[n]})" for n in names)
        return f"{what}; runs wait until {'it passes' if len(names) == 1 else 'one passes'} re-validation"

    def _restore(self, req: Request, now: float) -> bool:
        if self.engine is None or req.cluster_queue not in self.engine.queues or not req.flavors:
            return False
        if req.name in self.engine.states:
            return True
        wl = self._workload(req)
        gpus = req.gpus if len(req.gpus) == sum(n for _, n in req.pod_sets()) and any(req.gpus) else None
        try:
            self.engine.restore(wl, [dict(req.flavors) for _ in wl.pod_sets], now, gpus=gpus, nodes=req.nodes or None)
        except PermanentError:
            return False  # the revision changed under it: let a cycle re-admit it
        self.requests[req.name] = req
        return True

    def _workload(self, req: Request) -> adm.Workload:
        requests = {r: v for r, v in req.per_pod.items() if not (r == GPU and (req.gpu_fraction or req.gpu_memory_mb))}
        excluded = frozenset(req.excluded_nodes) if req.excluded_nodes else _NONE_EXCLUDED
        main = adm.PodSet(req.pod_sets()[-1][0], req.pods, requests, gpu_fraction=req.gpu_fraction,
                          gpu_memory_mb=req.gpu_memory_mb, excluded_nodes=excluded,
                          topology_request=req.topology if self.tas else None)
        # a Ray cluster's head: one pod, never resized, kept off the same nodes (its TAS request is the workers')
        head = (adm.PodSet(raycluster.HEAD, 1, dict(req.head), excluded_nodes=excluded),) if req.head else ()
        return adm.Workload(
            req.name, req.cluster_queue, (*head, main),
            priority=req.priority, preemptible=req.preemptible, created_at=req.created,
            placement=adm.PlacementStrategy(req.placement if req.placement in ("binpack", "spread") else "binpack"),
            elastic=req.elastic, preemption_gated=req.preemption_gated,
        )

    def submit(self, req: Request) -> None:
        self.requests[req.name] = req
        if self.engine is not None and req.cluster_queue in self.engine.queues and req.name not in self.engine.states:
            self.engine.submit(self._workload(req), req.created)

    def release(self, name: str) -> None:
        self.requests.pop(name, None)
        if self.engine is not None and name in self.engine.states:
            self.engine.finish(name, time.time())

    def shrink(self, name: str, count: int, now: float) -> adm.Resize:
        """Kueue's in-place scale-down of an admitted elastic workload (``Shrunk``); its removed pods' quota stays
        held until ``release_removed``."""
        assert self.engine is not None  # only engine-admitted workloads are elastic
        return self.engine.shrink(name, count, now)

    def release_removed(self, name: str) -> None:
        """The pods an elastic shrink removed are stopped: their quota and devices are free."""
        if self.engine is not None and self.engine.is_admitted(name):
            self.engine.release_removed(name)

    def cycle(self) -> list[Granted]:
        self.preempted, self.resized = [], []
        if self.engine is None:
            return []
        result = self.engine.cycle(time.time())
        self.resized = list(result.resized)
        granted = []
        for a in result.admitted:
            per_pod: dict[tuple[str, int], list[int]] = {}
            node_of: dict[tuple[str, int], str] = {}
            for pl in a.placements:
                per_pod.setdefault((pl.pod_set, pl.index), []).extend(pl.gpus)
                node_of[(pl.pod_set, pl.index)] = pl.node
            req = self.requests.get(a.workload)
            sets = req.pod_sets() if req else [("main", len(per_pod))]
            order = [(name, i) for name, n in sets for i in range(n)]  # pod sets in order, each from index 0
            granted.append(Granted(a.workload, a.cluster_queue, dict(a.flavors),
                                   [per_pod.get(k, []) for k in order],
                                   [node_of.get(k, self.node) for k in order],
                                   wire_topology(a.topology_assignments)))
        self.preempted = [Evicted(p.victim, p.preemptor, p.reason, p.message) for p in result.preempted]
        return granted

    def quiescent(self) -> bool:
        """True when another cycle would examine no head (each waiting run has been tried, or is parked)."""
        return self.engine is None or self.engine.quiescent()

    def settle_idle(self) -> int:
        """``Engine.settle_idle``: the queues with nothing waiting drop what their backlog left (0: no engine)."""
        return self.engine.settle_idle() if self.engine is not None else 0

    def next_requeue(self) -> float | None:
        """When a backed-off workload returns to its queue, so the admission loop can wake for it."""
        return self.engine.next_requeue() if self.engine is not None else None

    def pending_all(self) -> dict[str, Pending]:
        """Why every pending workload waits, with its position: one pass per queue (for the control loop)."""
        out: dict[str, Pending] = {}
        for name, req in self.requests.items():
            if self.engine is None or req.cluster_queue not in self.engine.queues:
                out[name] = Pending("Inadmissible", f"ClusterQueue {req.cluster_queue or '?'} doesn't exist", 0)
        if self.engine is None:
            return out
        stopped = self._all_cordoned()
        for name, p in self.engine.pending_all().items():
            out[name] = Pending("Unschedulable", stopped, p.ahead) if stopped else self._worded(p)
        return out

    def _worded(self, p: adm.Pending) -> Pending:
        """The engine's words, plus which nodes are cordoned when a pod found no node."""
        message = p.message
        if self.cordoned and "eligible node" in message:
            message += "; cordoned: " + ", ".join(f"{n} ({why})" for n, why in sorted(self.cordoned.items()))
        return Pending(p.reason, message, p.ahead)

    def info(self, name: str) -> Pending | None:
        req = self.requests.get(name)
        if req is not None and (self.engine is None or req.cluster_queue not in self.engine.queues):
            return Pending("Inadmissible", f"ClusterQueue {req.cluster_queue or '?'} doesn't exist", 0)
        if self.engine is None:
            return None
        p = self.engine.pending_info(name)
        stopped = self._all_cordoned()
        if stopped and name in self.requests and not self.engine.is_admitted(name):
            return Pending("Unschedulable", stopped, p.ahead if p else 0)
        if p is None:
            return None
        return self._worded(p)

    def explain(self, name: str) -> str:
        return self.engine.explain(name) if self.engine and name in self.engine.states else ""

    def snapshot(self, now: float) -> list[dict[str, object]]:
        """Per ClusterQueue: nominal, used, borrowed and lent quota, and the pending queue in admission order."""
        if self.engine is None:
            return []
        used_by: dict[str, dict[str, float]] = {}
        for cq in self.quotas:
            used: dict[str, float] = {}
            for (_flavor, res), v in self.engine.usage(cq).items():
                used[res] = used.get(res, 0.0) + v / 1000.0
            used_by[cq] = used
        borrowed = {cq: {r: max(0.0, u - self.quotas[cq].get(r, 0.0)) for r, u in used_by[cq].items()}
                    for cq in self.quotas}
        out = []
        for cq, nominal in self.quotas.items():
            cohort = self.cohort_of.get(cq, "")
            # What others in the cohort borrow comes out of members' unused nominal quota.
            borrowing_peers = {r: sum(borrowed[o].get(r, 0.0) for o in self.quotas
                                      if o != cq and cohort and self.cohort_of.get(o) == cohort) for r in nominal}
            lent = {r: min(max(0.0, nominal[r] - used_by[cq].get(r, 0.0)), borrowing_peers[r]) for r in nominal}
            order = sorted(self.engine.queue_order(cq, now), key=lambda t: (-t[1], t[2]))
            out.append({"cluster_queue": cq, "cohort": cohort, "nominal": nominal, "used": used_by[cq],
                        "borrowed": {r: v for r, v in borrowed[cq].items() if v},
                        "lent": {r: v for r, v in lent.items() if v},
                        "pending": [name for name, _, _ in order],
                        "admitted": sum(1 for n in self.engine.admitted_names()
                                        if self.engine.states[n].cq == cq)})
            kai = self.engine.kai
            if kai is not None and kai.owns(cq):  # a KAI project: its current fair share (only such queues)
                out[-1]["fair_share"] = {r: v / 1000.0 for r, v in kai.fair.get(cq, {}).items()}
        return out
