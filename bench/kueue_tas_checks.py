"""What ``kueue_tas_scenario.py`` hears of each run on the bus, and the check of each run's placement.

``Heard`` listens to every run's admissions (with the topology assignment the event carries), preemptions and
ends, each at its ``ce-time`` (the cluster's clock: when the local cluster admitted, preempted or ended it; an
end's is when it found the run's pods ended and released its quota, before it reported the end), each admission
also at the moment this bench heard it (through the admission watcher, as Kueue's recorder times what it sees), and
to where each pod runs (node and completion index, per admission attempt): the gang its first rank's
``exec.running`` lists (the local cluster's simulated Job pods start as one, and only the first rank's pod is
published, issue 30), or each pod the local cluster publishes. ``check``
judges one admitted run by its last admission: the assignment must exist, hold every pod and keep the request
(one rack for a required class, whole slices per rack for a balanced class), and every pod must run on the node
its rank was assigned.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import msgspec
from kueue_tas_shape import HOSTNAME_LABEL, RACK_LABEL, TasClass  # bench/ is on sys.path
from nats.aio.msg import Msg

from taugrid.bus.envelope import from_message, run_of
from taugrid.core.contracts import AdmissionAdmitted, ExecRunning, PodSetTopology

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
_REQUEUED = re.compile(r"-r(\d+)$")  # a requeued workload's pods: <workload>-<index>-r<requeues>


def _run(msg: Msg) -> str:
    return run_of(msg)


def _happened(msg: Msg) -> float:
    return from_message(msg.subject, msg.headers, b"").happened or time.time()


@dataclass
class Heard:
    admissions: dict[str, list[tuple[float, PodSetTopology | None]]] = field(default_factory=dict)
    preemptions: dict[str, list[float]] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    pods: dict[str, dict[tuple[int, int], str]] = field(default_factory=dict)  # (requeues, index) → node
    heard: dict[str, float] = field(default_factory=dict)  # run → when its last admission event reached us

    async def on_admitted(self, msg: Msg) -> None:
        event = msgspec.json.decode(msg.data, type=AdmissionAdmitted)
        main = next((t for t in event.topology if t.pod_set == "main"), None)
        self.admissions.setdefault(_run(msg), []).append((_happened(msg), main))
        self.heard[_run(msg)] = time.time()

    async def on_preempted(self, msg: Msg) -> None:
        self.preemptions.setdefault(_run(msg), []).append(_happened(msg))

    async def on_terminal(self, msg: Msg) -> None:
        self.finished.setdefault(_run(msg), _happened(msg))

    async def on_pod(self, msg: Msg) -> None:
        obj = msgspec.json.decode(msg.data).get("object") or {}
        meta = obj.get("metadata") or {}
        index = int((meta.get("labels") or {}).get(INDEX_LABEL, "0"))
        self._placed(_run(msg), meta.get("name", ""), index, (obj.get("spec") or {}).get("nodeName", ""))

    async def on_running(self, msg: Msg) -> None:
        for pod in msgspec.json.decode(msg.data, type=ExecRunning).pods:
            self._placed(_run(msg), pod.name, pod.index, pod.node)

    def _placed(self, run: str, name: str, index: int, node: str) -> None:
        requeued = _REQUEUED.search(name)
        self.pods.setdefault(run, {})[(int(requeued.group(1)) if requeued else 0, index)] = node

    def admitted_at(self, run: str) -> float | None:
        """When the run was last admitted (Kueue's recorder times the Admitted condition's last transition)."""
        times = [t for t, _ in self.admissions.get(run, [])]
        return max(times) if times else None

    def held_s(self, run: str, end: float) -> float:
        """Seconds the run held its quota: each admission to the preemption after it, or to the run's end."""
        stops = sorted(self.preemptions.get(run, []))
        out = 0.0
        for at in sorted(t for t, _ in self.admissions.get(run, [])):
            stop = next((s for s in stops if s >= at), self.finished.get(run, end))
            out += max(0.0, stop - at)
        return out

    def topology(self, run: str) -> PodSetTopology | None:
        heard = sorted(self.admissions.get(run, []), key=lambda a: a[0])
        return heard[-1][1] if heard else None

    def last_pods(self, run: str) -> dict[int, str]:
        """Completion index → node, of the run's latest admission (a preempted run's pods come back renamed)."""
        pods = self.pods.get(run, {})
        latest = max((r for r, _ in pods), default=0)
        return {i: node for (r, i), node in pods.items() if r == latest}


@dataclass(frozen=True)
class Verdict:
    violation: str  # "" when the run kept its request
    spread: bool  # its pods in more than one rack
    split: bool  # a balanced run with a consecutive-index slice in two racks


def rank_nodes(topology: PodSetTopology, rack_of: dict[str, str]) -> list[tuple[str, str]] | str:
    """(node or "", rack) of each rank in order, from the assignment's domains; or what is wrong with it."""
    out: list[tuple[str, str]] = []
    for d in topology.domains:
        values = dict(zip(topology.levels, d.values, strict=False))
        host = values.get(HOSTNAME_LABEL, "")
        rack = values.get(RACK_LABEL) or rack_of.get(host, "")
        if not rack:
            return f"domain {d.values} of levels {topology.levels} names no rack of the pool"
        out += [(host, rack)] * d.count
    return out


def check(cls: TasClass, topology: PodSetTopology | None, placed: dict[int, str], rack_of: dict[str, str]
          ) -> Verdict:
    if topology is None:
        return Verdict("its admission carries no topology assignment", False, False)
    ranks = rank_nodes(topology, rack_of)
    if isinstance(ranks, str):
        return Verdict(ranks, False, False)
    if len(ranks) != cls.pods:
        return Verdict(f"assignment holds {len(ranks)} of {cls.pods} pods", False, False)
    racks = [rack for _, rack in ranks]
    per_rack: dict[str, int] = {}
    for r in racks:
        per_rack[r] = per_rack.get(r, 0) + 1
    spread = len(per_rack) > 1
    split = cls.constraint == "balanced" and any(
        len(set(racks[j:j + cls.slice_size])) > 1 for j in range(0, cls.pods, cls.slice_size))
    why = ""
    if cls.constraint == "required" and spread:
        why = f"required one rack, assigned {per_rack}"
    elif cls.constraint == "balanced" and any(n % cls.slice_size for n in per_rack.values()):
        why = f"slices of {cls.slice_size} split across racks: {per_rack}"
    elif set(placed) != set(range(cls.pods)):
        why = f"pods seen for indices {sorted(placed)} of {cls.pods}"
    else:
        off = [i for i, (host, rack) in enumerate(ranks)
               if (host and placed[i] != host) or rack_of.get(placed[i]) != rack]
        if off:
            why = f"pod {off[0]} on {placed[off[0]]}, assigned {ranks[off[0]][0] or ranks[off[0]][1]}"
    return Verdict(why, spread, split)
