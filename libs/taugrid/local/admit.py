"""Admission for the local cluster: ClusterQueue quota and priority, FIFO within a priority, whole and
fractional GPUs accounted per device. The full Kueue/KAI engine (cohorts, borrowing, preemption) plugs in
behind the same three calls: ``submit``, ``release``, ``cycle``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taugrid.core.quantity import format_memory

GPU = "nvidia.com/gpu"


@dataclass
class Request:
    name: str
    cluster_queue: str
    priority: int
    created: float
    pods: int
    per_pod: dict[str, float]
    gpu_fraction: float = 0.0  # >0: each pod takes this share of one GPU instead of whole GPUs
    preemptible: bool = True


@dataclass
class Granted:
    name: str
    cluster_queue: str
    flavors: dict[str, str]
    gpus: list[list[int]]  # per pod: GPU indices


@dataclass
class Pending:
    reason: str
    message: str
    position: int


@dataclass
class LocalAdmitter:
    quotas: dict[str, dict[str, float]]  # cluster queue → resource → nominal quota
    capacity: dict[str, float]  # the machine: cpu, memory, nvidia.com/gpu
    gpu_count: int = 0
    flavor: str = "default"
    pending: dict[str, Request] = field(default_factory=dict)
    admitted: dict[str, tuple[Request, Granted]] = field(default_factory=dict)
    gpu_used: dict[int, float] = field(default_factory=dict)  # device → fraction in use
    why: dict[str, Pending] = field(default_factory=dict)

    def submit(self, req: Request) -> None:
        if req.name not in self.admitted:
            self.pending[req.name] = req

    def release(self, name: str) -> None:
        self.pending.pop(name, None)
        self.why.pop(name, None)
        got = self.admitted.pop(name, None)
        if got is None:
            return
        req, grant = got
        for devices in grant.gpus:
            for d in devices:
                left = self.gpu_used.get(d, 0.0) - (req.gpu_fraction or 1.0)
                self.gpu_used[d] = max(0.0, left)

    def _used(self, cq: str | None) -> dict[str, float]:
        used: dict[str, float] = {}
        for req, _ in self.admitted.values():
            if cq is None or req.cluster_queue == cq:
                for r, v in req.per_pod.items():
                    used[r] = used.get(r, 0.0) + v * req.pods
        return used

    def _assign_gpus(self, req: Request) -> list[list[int]] | None:
        whole = int(req.per_pod.get(GPU, 0))
        free = dict(self.gpu_used)
        out: list[list[int]] = []
        for _ in range(req.pods):
            if req.gpu_fraction:
                fits = [d for d in range(self.gpu_count) if free.get(d, 0.0) + req.gpu_fraction <= 1.0 + 1e-9]
                if not fits:
                    return None
                d = max(fits, key=lambda i: free.get(i, 0.0))  # binpack: the fullest GPU that fits
                free[d] = free.get(d, 0.0) + req.gpu_fraction
                out.append([d])
            elif whole:
                idle = [d for d in range(self.gpu_count) if free.get(d, 0.0) == 0.0][:whole]
                if len(idle) < whole:
                    return None
                for d in idle:
                    free[d] = 1.0
                out.append(idle)
            else:
                out.append([])
        return out

    def cycle(self) -> list[Granted]:
        granted: list[Granted] = []
        self.why.clear()
        order = sorted(self.pending.values(), key=lambda r: (-r.priority, r.created))
        blocked: set[str] = set()
        positions: dict[str, int] = {}
        for req in order:
            pos = positions.get(req.cluster_queue, 0)
            positions[req.cluster_queue] = pos + 1
            if req.cluster_queue in blocked:
                self.why[req.name] = Pending("Pending", "waiting behind earlier workloads in the queue", pos)
                continue
            problem = self._fits(req)
            gpus = self._assign_gpus(req) if problem is None else None
            if problem is None and gpus is None:
                problem = ("Pending", "no GPU has room for this request on the node")
            if problem is not None:
                blocked.add(req.cluster_queue)  # FIFO within priority: nobody overtakes the head
                self.why[req.name] = Pending(problem[0], problem[1], pos)
                continue
            assert gpus is not None
            grant = Granted(req.name, req.cluster_queue, {r: self.flavor for r in req.per_pod}, gpus)
            for devices in gpus:
                for d in devices:
                    self.gpu_used[d] = self.gpu_used.get(d, 0.0) + (req.gpu_fraction or 1.0)
            self.admitted[req.name] = (req, grant)
            del self.pending[req.name]
            positions[req.cluster_queue] = pos
            granted.append(grant)
        return granted

    def _fits(self, req: Request) -> tuple[str, str] | None:
        quota = self.quotas.get(req.cluster_queue)
        if quota is None:
            return "Inadmissible", f"ClusterQueue {req.cluster_queue} doesn't exist"
        used, node_used = self._used(req.cluster_queue), self._used(None)
        for r, v in req.per_pod.items():
            need = v * req.pods
            if r == GPU and req.gpu_fraction:
                continue
            if r not in quota and need > 0:
                return "Inadmissible", f"resource {r} is not covered by ClusterQueue {req.cluster_queue}"
            if used.get(r, 0.0) + need > quota.get(r, 0.0) + 1e-9:
                more = used.get(r, 0.0) + need - quota.get(r, 0.0)
                shown = format_memory(int(more)) if r == "memory" else f"{more:g}"
                return ("Pending", f"couldn't assign flavors to pod set main: insufficient unused quota for {r} "
                        f"in flavor {self.flavor}, {shown} more needed")
            # CPU is time-shared by processes, so only quota bounds it; memory and GPUs are physical.
            if r != "cpu" and node_used.get(r, 0.0) + need > self.capacity.get(r, 0.0) + 1e-9:
                return "Pending", f"insufficient {r} on the node"
        return None

    def info(self, name: str) -> Pending | None:
        return self.why.get(name)
