"""Node and GPU placement (KAI-like): gang all-or-nothing, binpack/spread, fractional GPU sharing.

Role: when the engine is given nodes, every admitted pod gets a concrete node and GPU indices. Pods of a gang
are placed inside one transaction: all fit, or the transaction is rolled back and nothing is placed.

Invariants:
- nothing new lands on a node marked unschedulable (cordoned), not ready, over its ``max_pods``, or named in a
  pod set's ``excluded_nodes``;
- a pod set on a TAS flavor (``ResourceFlavor.topology_name``) lands only in the domains ``tas`` chose for it,
  pod indices filling one lowest-level domain before the next (Kueue's rank order);
- per GPU, used share is an integer in [0, 1000] m-GPU: a whole-GPU pod takes an unused device (1000),
  sharing pods take ``ceil(fraction*1000)`` (``gpu_memory_mb`` converts to a fraction of that device's memory),
  so fractions on one GPU never sum above 1;
- free cpu/memory of a node never go negative through placement (a restore of pods already running on a named
  node may overcommit it, as Kueue's cache does; nothing new lands there until it is free again);
- binpack picks the fullest node / most-used GPU that still fits, spread the emptiest (KAI's
  ``nodeplacement`` + ``gpupack``/``gpuspread``); ties go to the lower node order / GPU index.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .model import (
    UNIT,
    Node,
    PlacementStrategy,
    PodSet,
    ResourceFlavor,
    Topology,
    Workload,
    fraction_units,
    gpu_request,
    to_units,
    untolerated,
)
from .results import PodPlacement, TopologyAssignment
from .tas import TasPodSet, find_assignments
from .tas_tree import HOSTNAME, PODS, NodeChanges, TasNode, TasTree

NO_POD_LIMIT = 1 << 30

# One pod's allocation: (node index, cpu, memory, ((gpu index, m-GPU), ...))
Alloc = tuple[int, int, int, tuple[tuple[int, int], ...]]


@dataclass(slots=True)
class _NodeState:
    node: Node
    cpu_total: int
    mem_total: int
    cpu_free: int
    mem_free: int
    gpu_used: list[int]  # m-GPU used per device, same order as node.gpus
    pods: int = 0  # pods placed here

    def gpu_free_units(self) -> int:
        return len(self.gpu_used) * UNIT - sum(self.gpu_used)


@dataclass(slots=True)
class _Pod:
    pod_set: int
    index: int
    cpu: int
    mem: int
    whole: int
    shares: bool


class TasFailure(NamedTuple):
    """The first TAS pod set whose topology does not hold it, on which flavor, and Kueue's reason; ``placed``:
    the assignments of the pod sets placed before it."""

    pod_set: str
    flavor: str
    reason: str
    placed: Mapping[str, TopologyAssignment] = {}


# Per TAS pod set index, per pod the node indices it may use; and Kueue's assignment per pod set name.
TasAnswer = tuple[dict[int, list[tuple[int, ...]]], dict[str, TopologyAssignment]] | TasFailure


class Placed(list[PodPlacement]):
    """A gang's placements, with the topology assignment of each TAS pod set (by pod set name)."""

    topology: dict[str, TopologyAssignment]

    def __init__(self, items: Iterable[PodPlacement] = (), topology: dict[str, TopologyAssignment] | None = None
                 ) -> None:
        super().__init__(items)
        self.topology = topology or {}


class Cluster:
    """Mutable free-capacity view of the nodes, with per-workload allocations for release/restore."""

    def __init__(self, nodes: Iterable[Node], topologies: Mapping[str, Topology] | None = None) -> None:
        self.topologies = dict(topologies or {})
        self._trees: dict[tuple[str, Topology, frozenset[tuple[str, str]], frozenset[str]], TasTree] = {}
        self.nodes = [
            _NodeState(n, to_units(n.cpu), to_units(n.memory), to_units(n.cpu), to_units(n.memory),
                       [0] * len(n.gpus))
            for n in nodes
        ]
        self.allocs: dict[str, list[Alloc]] = {}
        # Cordoned nodes (``spec.unschedulable``): what runs there keeps its allocation, nothing new is placed.
        self.unschedulable: set[str] = set()
        # Not-ready nodes (``Node.ready`` False, or later ``Engine.set_ready``): the same, and out of TAS.
        self.not_ready: set[str] = {ns.node.name for ns in self.nodes if not ns.node.ready}
        # Bumped by every change of what the nodes hold or take that is not a simulation (a trial placement,
        # a victim set aside): an unchanged epoch means every node is exactly as it was (the engine's memo of
        # inadmissible heads relies on it; whoever changes ``unschedulable``/``not_ready`` bumps it too).
        self.epoch = 0
        # Every change of a node's free capacity, simulations included, in order: the TAS trees keep their counts
        # per demand shape and recount only the nodes logged since (``_apply`` is the one place that changes it).
        self.changes = NodeChanges()
        # Placement questions answered from what the nodes hold now (``place``, ``tas_assign`` but with ``empty``):
        # the engine compares it around a head's nomination to know whether its verdict read the nodes.
        self.reads = 0
        self._totals = NodeChanges()  # what ``tas_free(empty=True)`` reports never changes
        # ``tas_assign(empty=True)`` answers, per usable node set and workload shape: a function of the nodes'
        # totals, which never change, so many TAS preemptors of one shape (every cycle) share one search.
        self._on_empty: dict[Hashable, TasAnswer] = {}
        # The answers on the nodes as they are, while they stay so: kept per workload shape for one position of
        # the change log (every change of free capacity, simulations included, moves it), so the heads of one
        # shape nominated between two changes, and a head placed right after its nomination, share one search.
        self._on_now: dict[Hashable, TasAnswer] = {}
        self._now_at: tuple[int, int, frozenset[str]] = (-1, -1, frozenset())

    @property
    def max_gpu_memory_mb(self) -> int:
        return max((g.memory_mb for ns in self.nodes for g in ns.node.gpus), default=0)

    # -- transactions ------------------------------------------------------------------------------------

    def _apply(self, alloc: Alloc, sign: int, quiet: bool = False) -> None:
        if not quiet:
            self.epoch += 1
        self.changes.touch(alloc[0])
        ns = self.nodes[alloc[0]]
        ns.cpu_free -= sign * alloc[1]
        ns.mem_free -= sign * alloc[2]
        ns.pods += sign
        for gi, units in alloc[3]:
            ns.gpu_used[gi] += sign * units

    def release(self, name: str, *, quiet: bool = False) -> list[Alloc]:
        """Free what ``name`` holds; ``quiet``: a simulation the caller undoes with ``restore(quiet=True)``."""
        allocs = self.allocs.pop(name, [])
        for a in allocs:
            self._apply(a, -1, quiet)
        return allocs

    def restore(self, name: str, allocs: list[Alloc], *, quiet: bool = False) -> None:
        for a in allocs:
            self._apply(a, +1, quiet)
        if allocs:
            self.allocs[name] = allocs

    # -- placement ---------------------------------------------------------------------------------------

    def place(self, workload: Workload, flavors_per_pod_set: list[dict[str, str]],
              flavor_specs: Mapping[str, ResourceFlavor], *, commit: bool) -> Placed | str:
        """Place every pod of the gang; returns placements, or a message saying which pod did not fit."""
        self.reads += 1
        tas = self.tas_assign(workload, flavors_per_pod_set, flavor_specs)
        if isinstance(tas, TasFailure):
            return f"couldn't assign flavors to pod set {tas.pod_set}: {tas.reason}"
        pins, topology = tas
        pods: list[_Pod] = []
        for i, ps in enumerate(workload.pod_sets):
            whole = gpu_request(ps)[1]
            for k in range(ps.count):
                pods.append(_Pod(i, k, to_units(ps.requests.get("cpu", 0)),
                                 to_units(ps.requests.get("memory", 0)), whole, ps.shares_gpu))
        # Hardest pods first, so a gang does not fail on its big pods after spending room on small ones.
        pods.sort(key=lambda p: (-p.whole, not p.shares, -p.cpu, p.pod_set, p.index))
        # A TAS pod set may use only its domains' nodes: check those alone rather than every node.
        eligible = [self._eligible(workload, i, flavors_per_pod_set[i], flavor_specs,
                                   sorted({ni for nodes in pins[i] for ni in nodes}) if i in pins else None)
                    for i in range(len(workload.pod_sets))]
        done: list[tuple[_Pod, Alloc]] = []
        failure = ""
        for pod in pods:
            where = eligible[pod.pod_set]
            if pod.pod_set in pins:  # TAS: only the nodes of the domain this pod index falls in
                allowed = set(pins[pod.pod_set][pod.index])
                where = [ni for ni in where if ni in allowed]
            alloc = self._place_one(workload, pod, where)
            if alloc is None:
                ps = workload.pod_sets[pod.pod_set]
                failure = (f"couldn't place pod set {ps.name}: none of {len(where)} eligible "
                           f"node(s) has room for pod {pod.index} ({self._describe(ps)}) "
                           f"with {len(done)} of {len(pods)} pods of the gang placed")
                break
            self._apply(alloc, +1, not commit)
            done.append((pod, alloc))
        if failure or not commit:
            for _, alloc in done:
                self._apply(alloc, -1, not commit)
            if failure:
                return failure
        if commit:
            self.allocs[workload.name] = [a for _, a in done]
        out = Placed(topology=topology)
        for pod, (ni, _, _, gpus) in sorted(done, key=lambda d: (d[0].pod_set, d[0].index)):
            frac = gpus[0][1] / UNIT if pod.shares and gpus else 0.0
            out.append(PodPlacement(pod_set=workload.pod_sets[pod.pod_set].name, index=pod.index,
                                    node=self.nodes[ni].node.name,
                                    gpus=tuple(self.nodes[ni].node.gpus[g].index for g, _ in gpus),
                                    gpu_fraction=frac))
        return out

    # -- topology aware scheduling -----------------------------------------------------------------------

    def tas_flavor(self, flavors: Mapping[str, str], flavor_specs: Mapping[str, ResourceFlavor]
                   ) -> ResourceFlavor | None:
        """The TAS flavor a pod set was assigned (Kueue ``onlyTASFlavor``), or None."""
        for fname in flavors.values():
            spec = flavor_specs.get(fname)
            if spec is not None and spec.topology_name is not None:
                return spec
        return None

    def tas_tree(self, flavor: ResourceFlavor, topology: Topology) -> TasTree:
        """The flavor's domain tree over its usable nodes: matching its labels, ready and not cordoned. Kept
        until the cordoned set changes (labels and readiness of a ``Node`` do not change)."""
        key = (flavor.name, topology, frozenset(flavor.node_labels.items()),
               frozenset(self.unschedulable | self.not_ready))
        tree = self._trees.get(key)
        if tree is None:
            nodes = [TasNode(i, ns.node.name, ns.node.labels, ns.node.taints) for i, ns in enumerate(self.nodes)
                     if ns.node.name not in self.not_ready and ns.node.name not in self.unschedulable
                     and all(ns.node.labels.get(k) == v for k, v in flavor.node_labels.items())]
            if len(self._trees) > 64:
                self._trees.clear()
            tree = self._trees[key] = TasTree(topology, nodes)
        return tree

    def tas_free(self, ni: int, *, empty: bool = False) -> dict[str, int]:
        """What node ``ni`` has free for TAS (everything, with ``empty``: Kueue's simulation of every TAS
        workload preempted)."""
        ns = self.nodes[ni]
        limit = NO_POD_LIMIT if ns.node.max_pods is None else ns.node.max_pods
        if empty:
            return {"cpu": ns.cpu_total, "memory": ns.mem_total, ns.node.gpu_resource: len(ns.gpu_used) * UNIT,
                    PODS: limit}
        return {"cpu": ns.cpu_free, "memory": ns.mem_free, ns.node.gpu_resource: UNIT * ns.gpu_used.count(0),
                PODS: limit - ns.pods}

    def tas_assign(self, workload: Workload, flavors_per_pod_set: Sequence[Mapping[str, str]],
                   flavor_specs: Mapping[str, ResourceFlavor], *, empty: bool = False) -> TasAnswer:
        """Topology assignments of the workload's TAS pod sets: per pod set index, per pod the node indices it
        may use, and Kueue's assignment per pod set name; or (pod set, flavor, reason) for the first that does
        not fit. Answers are kept per workload shape, on the nodes as they are while no free capacity changes and,
        with ``empty`` (every TAS workload gone), per usable node set: they may be shared, a caller must not change
        them."""
        by_flavor: dict[str, list[int]] = {}
        for i, flv in enumerate(flavors_per_pod_set):
            spec = self.tas_flavor(flv, flavor_specs)
            if spec is not None:
                by_flavor.setdefault(spec.name, []).append(i)
        unusable = frozenset(self.unschedulable | self.not_ready)
        shape = tuple((fname, frozenset(flavor_specs[fname].node_labels.items()), flavor_specs[fname].topology_name,
                       tuple((i, self._tas_shape(workload, workload.pod_sets[i])) for i in indices))
                      for fname, indices in by_flavor.items())
        if not empty:
            self.reads += 1
            at = (self.changes.generation, len(self.changes.log), unusable)
            if at != self._now_at:
                self._on_now.clear()
                self._now_at = at
            found = self._on_now.get(shape)
            if found is None:
                found = self._on_now[shape] = self._tas_assign(workload, by_flavor, flavor_specs, empty=False)
            return found
        key = (unusable, shape)
        found = self._on_empty.get(key)
        if found is None:
            if len(self._on_empty) >= 4096:
                self._on_empty.clear()
            found = self._on_empty[key] = self._tas_assign(workload, by_flavor, flavor_specs, empty=True)
        return found

    def _tas_assign(self, workload: Workload, by_flavor: Mapping[str, list[int]],
                    flavor_specs: Mapping[str, ResourceFlavor], *, empty: bool) -> TasAnswer:
        pins: dict[int, list[tuple[int, ...]]] = {}
        topology: dict[str, TopologyAssignment] = {}
        assumed: dict[int, dict[str, int]] = {}  # shared across flavors: two flavors may select the same nodes
        for fname, indices in by_flavor.items():
            spec = flavor_specs[fname]
            topo = self.topologies.get(spec.topology_name or "")
            if topo is None:
                return TasFailure(workload.pod_sets[indices[0]].name, fname,
                                  f"flavor {fname} names topology {spec.topology_name!r}, which is not defined")
            requests = [self._tas_pod_set(workload, workload.pod_sets[i]) for i in indices]
            found, failure = find_assignments(self.tas_tree(spec, topo), requests,
                                              lambda ni: self.tas_free(ni, empty=empty), assumed,
                                              changes=self._totals if empty else self.changes, source=empty)
            for i in indices:
                name = workload.pod_sets[i].name
                if name in found:
                    ta, chosen = found[name]
                    topology[name] = ta
                    pins[i] = [d.nodes for d in chosen for _ in range(d.count)]
            if failure is not None:
                return TasFailure(failure[0], fname, failure[1], topology)
        return pins, topology

    def reserve_tas(self, key: str, workload: Workload, flavors_per_pod_set: Sequence[Mapping[str, str]],
                    flavor_specs: Mapping[str, ResourceFlavor], *, empty: bool) -> bool:
        """Hold the nodes a preempting TAS workload would take, under ``key``, until ``release(key)`` (Kueue
        adds a preemptor's TAS usage to the cycle's snapshot, so a lower head cannot take those domains). The
        domains are found as things are now (the caller has set the victims aside) or, with ``empty``, as if
        every admitted workload were gone (a preemptor without victims). The hold may overcommit a node.
        Returns False when no domains hold the workload (nothing is reserved)."""
        found = self.tas_assign(workload, flavors_per_pod_set, flavor_specs, empty=empty)
        if isinstance(found, TasFailure):
            return False
        pins, _ = found
        allocs: list[Alloc] = []
        for i, per_pod in pins.items():
            ps = workload.pod_sets[i]
            whole = gpu_request(ps)[1]
            for nodes in per_pod:
                ns = self.nodes[nodes[0]]
                free = [g for g, used in enumerate(ns.gpu_used) if used == 0][:whole]
                allocs.append((nodes[0], to_units(ps.requests.get("cpu", 0)),
                               to_units(ps.requests.get("memory", 0)), tuple((g, UNIT) for g in free)))
        for a in allocs:
            self._apply(a, +1)
        self.allocs[key] = allocs
        return True

    def topology_of(self, workload: Workload, flavors_per_pod_set: Sequence[Mapping[str, str]],
                    flavor_specs: Mapping[str, ResourceFlavor], placements: Sequence[PodPlacement]
                    ) -> dict[str, TopologyAssignment]:
        """The topology assignment of pods that already run (a restore): per TAS pod set, its pods counted by
        the leaf domain of their node, in pod index order."""
        by_name = {ns.node.name: ns.node for ns in self.nodes}
        out: dict[str, TopologyAssignment] = {}
        for ps, flv in zip(workload.pod_sets, flavors_per_pod_set, strict=True):
            spec = self.tas_flavor(flv, flavor_specs)
            topo = self.topologies.get(spec.topology_name or "") if spec is not None else None
            if topo is None:
                continue
            start = len(topo.levels) - 1 if topo.levels[-1] == HOSTNAME else 0
            counts: dict[tuple[str, ...], int] = {}
            for p in sorted((p for p in placements if p.pod_set == ps.name), key=lambda p: p.index):
                node = by_name.get(p.node)
                if node is None:
                    continue
                values = tuple(node.labels.get(k, "") for k in topo.levels)
                counts[values[start:]] = counts.get(values[start:], 0) + 1
            out[ps.name] = TopologyAssignment(levels=topo.levels[start:], domains=tuple(counts.items()))
        return out

    @staticmethod
    def _tas_shape(workload: Workload, ps: PodSet) -> Hashable:
        """What of a pod set ``_tas_pod_set`` reads, hashable."""
        return (ps.name, ps.count, tuple(sorted(ps.requests.items())), ps.gpu_fraction, ps.gpu_memory_mb,
                ps.topology_request, tuple(sorted(ps.node_selector.items())), workload.tolerations + ps.tolerations,
                ps.excluded_nodes)

    @staticmethod
    def _tas_pod_set(workload: Workload, ps: PodSet) -> TasPodSet:
        resource, whole = gpu_request(ps)
        per_pod = {"cpu": to_units(ps.requests.get("cpu", 0)), "memory": to_units(ps.requests.get("memory", 0)),
                   resource: whole * UNIT}
        return TasPodSet(ps.name, ps.count, per_pod, ps.topology_request, ps.node_selector,
                         workload.tolerations + ps.tolerations, ps.excluded_nodes)

    def adopt(self, workload: Workload, gpus: Sequence[Sequence[int]],
              nodes: Sequence[str] | None = None) -> list[PodPlacement] | str:
        """Take over pods that already run with the given GPU indices (per pod, across pod sets in order).

        Used when restoring admitted workloads: the pods keep the devices they have. Each pod goes to its node
        (``nodes``, per pod, "" = any) or else the first node that has those device indices with room (and its
        cpu/memory); a message says which pod could not. A cordoned node still takes back what runs on it, and a
        named node takes its pods' cpu/memory even past what it has (what runs holds it, as Kueue's cache counts
        it; nothing new lands there until it is free again).
        """
        pods: list[tuple[int, int, PodSet]] = [(i, k, ps) for i, ps in enumerate(workload.pod_sets)
                                               for k in range(ps.count)]
        if len(gpus) != len(pods):
            return f"{len(gpus)} GPU lists for {len(pods)} pods; give one per pod"
        if nodes is not None and len(nodes) != len(pods):
            return f"{len(nodes)} node names for {len(pods)} pods; give one per pod"
        done: list[Alloc] = []
        out: list[PodPlacement] = []
        for p, ((_i, k, ps), indices) in enumerate(zip(pods, gpus, strict=True)):
            alloc = None
            named = nodes[p] if nodes is not None else ""
            for ni, ns in enumerate(self.nodes):
                if named and ns.node.name != named:
                    continue
                pos = {g.index: j for j, g in enumerate(ns.node.gpus)}
                if any(x not in pos for x in indices):
                    continue
                units = [(pos[x], fraction_units(ps, ns.node.gpus[pos[x]].memory_mb) if ps.shares_gpu else UNIT)
                         for x in indices]
                cpu, mem = to_units(ps.requests.get("cpu", 0)), to_units(ps.requests.get("memory", 0))
                if any(ns.gpu_used[j] + u > UNIT for j, u in units):
                    continue
                if not named and (ns.cpu_free < cpu or ns.mem_free < mem):
                    continue
                alloc = (ni, cpu, mem, tuple(units))
                break
            if alloc is None and named and all(ns.node.name != named for ns in self.nodes):
                # Its node is gone (deleted): the pod holds no node capacity, as in Kueue's cache.
                out.append(PodPlacement(pod_set=ps.name, index=k, node=named, gpus=tuple(indices)))
                continue
            if alloc is None:
                for a in done:
                    self._apply(a, -1)
                return f"pod {k} of pod set {ps.name}: no node has room on GPU(s) {list(indices)}"
            self._apply(alloc, +1)
            done.append(alloc)
            out.append(PodPlacement(pod_set=ps.name, index=k, node=self.nodes[alloc[0]].node.name,
                                    gpus=tuple(indices), gpu_fraction=alloc[3][0][1] / UNIT
                                    if ps.shares_gpu and alloc[3] else 0.0))
        self.allocs[workload.name] = done
        return out

    @staticmethod
    def _describe(ps: PodSet) -> str:
        parts = [f"{k} {v:g}" for k, v in ps.requests.items() if v]
        if ps.gpu_fraction:
            parts.append(f"gpu-fraction {ps.gpu_fraction:g}")
        if ps.gpu_memory_mb:
            parts.append(f"gpu-memory {ps.gpu_memory_mb}MiB")
        return ", ".join(parts) or "no requests"

    def _eligible(self, workload: Workload, ps_index: int, flavors: dict[str, str],
                  flavor_specs: Mapping[str, ResourceFlavor], among: Sequence[int] | None = None) -> list[int]:
        """The nodes (of ``among``, by default all, in index order) where a pod of the pod set may go."""
        ps = workload.pod_sets[ps_index]
        want: dict[str, str] = dict(ps.node_selector)
        for fname in set(flavors.values()):
            spec = flavor_specs.get(fname)
            if spec is not None:
                want.update(spec.node_labels)
        resource, whole = gpu_request(ps)
        vendor = resource if whole or ps.shares_gpu else ""  # a node of another vendor's GPUs has none for it
        out = []
        for i in range(len(self.nodes)) if among is None else among:
            ns = self.nodes[i]
            if (ns.node.name in self.unschedulable or ns.node.name in ps.excluded_nodes
                    or ns.node.name in self.not_ready or (vendor and ns.node.gpu_resource != vendor)):
                continue
            labels = ns.node.labels
            if all(labels.get(k) == v for k, v in want.items()) and untolerated(
                    ns.node.taints, workload.tolerations + ps.tolerations) is None:
                out.append(i)
        return out

    def _place_one(self, workload: Workload, pod: _Pod, eligible: list[int]) -> Alloc | None:
        binpack = workload.placement == PlacementStrategy.BINPACK
        ps = workload.pod_sets[pod.pod_set]
        best: tuple[float, int, Alloc] | None = None
        for ni in eligible:
            ns = self.nodes[ni]
            if ns.cpu_free < pod.cpu or ns.mem_free < pod.mem:
                continue
            if ns.node.max_pods is not None and ns.pods >= ns.node.max_pods:
                continue
            gpus: tuple[tuple[int, int], ...] = ()
            if pod.whole:
                free = [g for g, used in enumerate(ns.gpu_used) if used == 0]
                if len(free) < pod.whole:
                    continue
                gpus = tuple((g, UNIT) for g in free[:pod.whole])
            elif pod.shares:
                options = []
                for g, used in enumerate(ns.gpu_used):
                    need = fraction_units(ps, ns.node.gpus[g].memory_mb)
                    if used + need <= UNIT:
                        options.append((-used if binpack else used, g, need))
                if not options:
                    continue
                _, g, need = min(options)
                gpus = ((g, need),)
            if pod.whole or pod.shares:
                free_ratio = ns.gpu_free_units() / max(1, len(ns.gpu_used) * UNIT)
            else:
                free_ratio = ns.cpu_free / ns.cpu_total if ns.cpu_total else 0.0
            score = free_ratio if binpack else -free_ratio
            if best is None or score < best[0]:
                best = (score, ni, (ni, pod.cpu, pod.mem, gpus))
        return None if best is None else best[2]
