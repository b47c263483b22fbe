"""Kueue's TestAssignFlavors table (``pkg/scheduler/flavorassigner/flavorassigner_test.go``), ported as data.

Each case builds the ClusterQueue (and the secondary one of its cohort) with Kueue's usage, and runs the
engine's flavor assigner with Kueue's test oracle (the preemption possibility and borrowing level the case
fixes per flavor/resource; ``Preempt, 0`` otherwise). It compares the representative mode, the flavor and
mode of every resource of every pod set, and the borrowing level with Kueue's expectation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kueue"))
import port  # noqa: E402

from taugrid.core.admission.nominate import Mode, PMode, nominate  # noqa: E402

CASES = port.load("flavors")["cases"]
REASONS = {
    "PodSet.RequiredDuringSchedulingIgnoredDuringExecution": "node affinity terms (the engine matches nodeSelector)",
    "case field featureGates": "feature gates the engine does not model",
    "PodSet.PodSetGroup": "pod set groups (TAS)",
    "case field wlReclaimablePods": "reclaimable pods",
    "case field preemptWorkloadSlice": "elastic jobs (workload slices)",
    "ResourceFlavor.Toleration": "tolerations declared on a ResourceFlavor",
    "PodSet.RequiredTopologyRequest": "topology-aware scheduling",
    "ResourceFlavor.TopologyName": "topology-aware scheduling",
    "case field topologies": "topology-aware scheduling",
}


def out_of_scope(case: dict[str, Any]) -> str:
    return "; ".join(sorted({REASONS.get(u, u) for u in case["unsupported"]}))


IN_SCOPE = [c for c in CASES if not out_of_scope(c)]
OUT = {c["case"]: out_of_scope(c) for c in CASES if out_of_scope(c)}
MODES = {"NoCandidates": PMode.NO_CANDIDATES, "Preempt": PMode.PREEMPT, "Reclaim": PMode.RECLAIM}


def _units(resource: str, amount: float) -> int:
    return int(amount) if resource == "cpu" else int(amount * 1000)  # Kueue keeps cpu in millis


def _id(case: dict[str, Any]) -> str:
    return f"{case['test']}/{case['case']}"


@pytest.mark.parametrize("case", IN_SCOPE, ids=_id)
def test_kueue_flavor_assignment_case(case: dict[str, Any]) -> None:
    cqs = case["cluster_queues"]
    engine = port.engine({"cluster_queues": cqs, "cohorts": [], "flavors": case["flavors"]},
                         fair_sharing=case["fair_sharing"])
    for cq, usage in zip(cqs, (case["usage"], case["secondary_usage"]), strict=False):
        engine.tree.charge(engine.queues[cq["name"]].node, {(f, r): _units(r, a) for f, r, a in usage})
    engine.submit(port.workload({"name": "wl", "priority": 0, "created": 0.0, "pod_sets": case["pod_sets"]},
                                cqs[0]["name"]), 0.0)
    ws = engine.states["wl"]
    q = engine.queues[ws.cq]
    sim = {(f, r): (MODES[m], b) for f, r, m, b in case["simulation"]}

    def oracle(fr: tuple[str, str], val: int) -> tuple[PMode, int]:
        return sim.get(fr, (PMode.PREEMPT, 0))

    a = nominate(engine.tree, q.node, q.spec, engine.flavors, ws.workload, ws.requests, oracle,
                 known_flavors_only=True, fair_sharing=case["fair_sharing"])
    assert a.mode == {"Fit": Mode.FIT, "Preempt": Mode.PREEMPT, "NoFit": Mode.NO_FIT}[case["want_mode"]]
    if a.mode == Mode.NO_FIT:
        return
    want = case["want"]
    got = [{"name": p.name, "flavors": {r: [f, "Preempt" if p.modes.get(r) == Mode.PREEMPT else "Fit"]
                                        for r, f in p.flavors.items()}} for p in a.pod_sets]
    assert got == [{"name": p["name"], "flavors": p["flavors"]} for p in want["pod_sets"]]
    assert a.borrowing == want["borrowing"]


def test_out_of_scope_cases_are_documented() -> None:
    doc = " ".join((Path(__file__).parents[2] / "docs" / "architecture.md").read_text().split())
    assert len(CASES) == 60
    assert [name for name in OUT if name not in doc] == []
