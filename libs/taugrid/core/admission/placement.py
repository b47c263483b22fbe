"""Node and GPU placement (KAI-like): gang all-or-nothing, binpack/spread, fractional GPU sharing.

Role: when the engine is given nodes, every admitted pod gets a concrete node and GPU indices. Pods of a gang
are placed inside one transaction: all fit, or the transaction is rolled back and nothing is placed.

Invariants:
- nothing new lands on a node marked unschedulable (cordoned) or named in a pod set's ``excluded_nodes``;
- per GPU, used share is an integer in [0, 1000] m-GPU: a whole-GPU pod takes an unused device (1000),
  sharing pods take ``ceil(fraction*1000)`` (``gpu_memory_mb`` converts to a fraction of that device's memory),
  so fractions on one GPU never sum above 1;
- free cpu/memory of a node never go negative;
- binpack picks the fullest node / most-used GPU that still fits, spread the emptiest (KAI's
  ``nodeplacement`` + ``gpupack``/``gpuspread``); ties go to the lower node order / GPU index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .model import (
    GPU,
    UNIT,
    Node,
    PlacementStrategy,
    PodSet,
    ResourceFlavor,
    Workload,
    fraction_units,
    to_units,
    untolerated,
)
from .results import PodPlacement

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


class Cluster:
    """Mutable free-capacity view of the nodes, with per-workload allocations for release/restore."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.nodes = [
            _NodeState(n, to_units(n.cpu), to_units(n.memory), to_units(n.cpu), to_units(n.memory),
                       [0] * len(n.gpus))
            for n in nodes
        ]
        self.allocs: dict[str, list[Alloc]] = {}
        # Cordoned nodes (``spec.unschedulable``): what runs there keeps its allocation, nothing new is placed.
        self.unschedulable: set[str] = set()

    @property
    def max_gpu_memory_mb(self) -> int:
        return max((g.memory_mb for ns in self.nodes for g in ns.node.gpus), default=0)

    # -- transactions ------------------------------------------------------------------------------------

    def _apply(self, alloc: Alloc, sign: int) -> None:
        ns = self.nodes[alloc[0]]
        ns.cpu_free -= sign * alloc[1]
        ns.mem_free -= sign * alloc[2]
        for gi, units in alloc[3]:
            ns.gpu_used[gi] += sign * units

    def release(self, name: str) -> list[Alloc]:
        allocs = self.allocs.pop(name, [])
        for a in allocs:
            self._apply(a, -1)
        return allocs

    def restore(self, name: str, allocs: list[Alloc]) -> None:
        for a in allocs:
            self._apply(a, +1)
        if allocs:
            self.allocs[name] = allocs

    # -- placement ---------------------------------------------------------------------------------------

    def place(self, workload: Workload, flavors_per_pod_set: list[dict[str, str]],
              flavor_specs: Mapping[str, ResourceFlavor], *, commit: bool) -> list[PodPlacement] | str:
        """Place every pod of the gang; returns placements, or a message saying which pod did not fit."""
        pods: list[_Pod] = []
        for i, ps in enumerate(workload.pod_sets):
            whole = int(round(ps.requests.get(GPU, 0)))
            for k in range(ps.count):
                pods.append(_Pod(i, k, to_units(ps.requests.get("cpu", 0)),
                                 to_units(ps.requests.get("memory", 0)), whole, ps.shares_gpu))
        # Hardest pods first, so a gang does not fail on its big pods after spending room on small ones.
        pods.sort(key=lambda p: (-p.whole, not p.shares, -p.cpu, p.pod_set, p.index))
        eligible = [self._eligible(workload, i, flavors_per_pod_set[i], flavor_specs)
                    for i in range(len(workload.pod_sets))]
        done: list[tuple[_Pod, Alloc]] = []
        failure = ""
        for pod in pods:
            alloc = self._place_one(workload, pod, eligible[pod.pod_set])
            if alloc is None:
                ps = workload.pod_sets[pod.pod_set]
                failure = (f"couldn't place pod set {ps.name}: none of {len(eligible[pod.pod_set])} eligible "
                           f"node(s) has room for pod {pod.index} ({self._describe(ps)}) "
                           f"with {len(done)} of {len(pods)} pods of the gang placed")
                break
            self._apply(alloc, +1)
            done.append((pod, alloc))
        if failure or not commit:
            for _, alloc in done:
                self._apply(alloc, -1)
            if failure:
                return failure
        if commit:
            self.allocs[workload.name] = [a for _, a in done]
        out = []
        for pod, (ni, _, _, gpus) in sorted(done, key=lambda d: (d[0].pod_set, d[0].index)):
            frac = gpus[0][1] / UNIT if pod.shares and gpus else 0.0
            out.append(PodPlacement(pod_set=workload.pod_sets[pod.pod_set].name, index=pod.index,
                                    node=self.nodes[ni].node.name,
                                    gpus=tuple(self.nodes[ni].node.gpus[g].index for g, _ in gpus),
                                    gpu_fraction=frac))
        return out

    def adopt(self, workload: Workload, gpus: Sequence[Sequence[int]],
              nodes: Sequence[str] | None = None) -> list[PodPlacement] | str:
        """Take over pods that already run with the given GPU indices (per pod, across pod sets in order).

        Used when restoring admitted workloads: the pods keep the devices they have. Each pod goes to its node
        (``nodes``, per pod, "" = any) or else the first node that has those device indices with room (and its
        cpu/memory); a message says which pod could not. A cordoned node still takes back what runs on it.
        """
        pods: list[tuple[int, int, PodSet]] = [(i, k, ps) for i, ps in enumerate(workload.pod_sets)
                                               for k in range(ps.count)]
        if len(gpus) != len(pods):
            return f"{len(gpus)} GPU lists for {len(pods)} pods; give one per pod"
        done: list[Alloc] = []
        out: list[PodPlacement] = []
        for (_i, k, ps), indices in zip(pods, gpus, strict=True):
            alloc = None
            for ni, ns in enumerate(self.nodes):
                pos = {g.index: j for j, g in enumerate(ns.node.gpus)}
                if any(x not in pos for x in indices):
                    continue
                units = [(pos[x], fraction_units(ps, ns.node.gpus[pos[x]].memory_mb) if ps.shares_gpu else UNIT)
                         for x in indices]
                cpu, mem = to_units(ps.requests.get("cpu", 0)), to_units(ps.requests.get("memory", 0))
                if ns.cpu_free < cpu or ns.mem_free < mem or any(ns.gpu_used[j] + u > UNIT for j, u in units):
                    continue
                alloc = (ni, cpu, mem, tuple(units))
                break
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
                  flavor_specs: Mapping[str, ResourceFlavor]) -> list[int]:
        ps = workload.pod_sets[ps_index]
        want: dict[str, str] = dict(ps.node_selector)
        for fname in set(flavors.values()):
            spec = flavor_specs.get(fname)
            if spec is not None:
                want.update(spec.node_labels)
        out = []
        for i, ns in enumerate(self.nodes):
            if ns.node.name in self.unschedulable or ns.node.name in ps.excluded_nodes:
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
