"""Kueue's TestScheduleForTAS, TestScheduleForTASPreemption and TestScheduleForTASCohorts tables
(``pkg/scheduler/scheduler_tas_test.go``), ported as data.

Each case builds the engine with the case's Topologies, TAS ResourceFlavors, ClusterQueues and cohorts, the
nodes (labels, allocatable, readiness, cordon, taints; non-TAS pods' requests taken off their nodes), restores
the admitted workloads on the nodes their topology assignment names, submits the rest and runs one cycle. It
compares with Kueue's expectation: the new admissions (flavor per resource and the topology assignment per pod
set), the victims and their reasons, what is left pending, and the pending message where Kueue's event names
one.

``NOT_PORTED`` names every case not run, with the reason; ``cases_tas_schedule.json`` is written by
``kueue/extract_tas.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kueue"))
import port  # noqa: E402
from test_kueue_tas_find import node_of  # noqa: E402

from taugrid.core.admission import (  # noqa: E402
    Engine,
    LocalQueue,
    PodSet,
    ResourceFlavor,
    Taint,
    Toleration,
    Topology,
    TopologyAssignment,
    TopologyRequest,
    Workload,
)
from taugrid.core.errors import PermanentError  # noqa: E402

CASES = port.load_cases("tas_schedule")
GPU_NAMES = port.GPU_NAMES

# Cases whose Kueue behaviour taugrid deliberately answers differently, with how.
NOT_PORTED_DIVERGENT = {
    "TestScheduleForTAS/workload with a PodSet of size zero":
        "taugrid refuses a pod set with count 0 (count must be >= 1)",
}
REFUSED_AT_SUBMIT = {
    # Kueue leaves it inadmissible ("Flavor ... does not contain the requested level"); taugrid refuses the
    # request when it is submitted, naming the field and the levels to use.
    "workload requests topology level which is not present in topology": "topology_request.required",
}


def _reason(case: dict[str, Any]) -> str:
    return "; ".join(case["unsupported"])


def _id(case: dict[str, Any]) -> str:
    return f"{case['test']}/{case['case']}"


# Keyed "<Kueue test>/<case>": a case name can appear in two of Kueue's test functions.
NOT_PORTED: dict[str, str] = {_id(c): _reason(c) for c in CASES if c["unsupported"]} | NOT_PORTED_DIVERGENT
IN_SCOPE = [c for c in CASES if _id(c) not in NOT_PORTED]


def _requests(spec: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r, v in spec.items():
        key = "nvidia.com/gpu" if r in GPU_NAMES else r
        out[key] = out.get(key, 0.0) + port.qty(v)
    return out


def workload_of(spec: dict[str, Any], queue: str) -> Workload:
    return Workload(spec["name"], queue, tuple(
        PodSet(ps["name"], ps["count"], _requests(ps["requests"]), node_selector=dict(ps["node_selector"]),
               tolerations=tuple(Toleration(**t) for t in ps["tolerations"]),
               topology_request=TopologyRequest(**ps["request"]) if ps["request"] is not None else None)
        for ps in spec["pod_sets"]), priority=spec["priority"], created_at=spec["created"] or 0.0)


def engine_of(case: dict[str, Any]) -> Engine:
    flavors = [ResourceFlavor(f["name"], dict(f["labels"]), tuple(Taint(**t) for t in f["taints"]),
                              topology_name=f["topology"]) for f in case["flavors"]]
    engine = Engine([port.cluster_queue(c) for c in case["cluster_queues"]],
                    [port.cohort(c) for c in case["cohorts"]], flavors,
                    [node_of(n, case["pods"]) for n in case["nodes"]],
                    local_queues=[LocalQueue(lq["name"], lq["cq"]) for lq in case["local_queues"]],
                    topologies=[Topology(t["name"], tuple(t["levels"])) for t in case["topologies"]])
    assert engine.cluster is not None
    engine.cluster.unschedulable.update(n["name"] for n in case["nodes"] if n["unschedulable"])
    return engine


def _node_for(case: dict[str, Any], levels: list[str], values: list[str]) -> str:
    """The node whose labels carry these values for the lowest levels (a hostname assignment: the hostname)."""
    for n in case["nodes"]:
        if all(n["labels"].get(k) == v for k, v in zip(levels, values, strict=True)):
            return str(n["name"])
    return values[-1]  # the node is gone (deleted): its pods hold no node capacity


def restore(engine: Engine, case: dict[str, Any], spec: dict[str, Any]) -> None:
    adm = spec["admission"]
    by_name = {p["name"]: p for p in adm["pod_sets"]}
    wl = workload_of(spec, adm["cq"])
    flavors, usage, nodes = [], [], []
    for ps in spec["pod_sets"]:
        a = by_name[ps["name"]]
        flavors.append(dict(a["flavors"]))
        usage.append(_requests(a["usage"]))
        placed = []
        if a["topology"] is not None:
            t = a["topology"]
            for values, count in t["domains"]:
                placed += [_node_for(case, t["levels"], values)] * count
        nodes += placed + [""] * (ps["count"] - len(placed))
    engine.restore(wl, flavors, 0.0, usage=usage, gpus=[[]] * len(nodes), nodes=nodes)


def run(case: dict[str, Any]) -> tuple[Engine, Any, set[str]]:
    engine = engine_of(case)
    refused: set[str] = set()
    for w in case["workloads"]:
        if w["admission"] is not None:
            restore(engine, case, w)
    for w in case["workloads"]:
        if w["admission"] is None:
            if case["case"] in REFUSED_AT_SUBMIT:
                with pytest.raises(PermanentError, match=REFUSED_AT_SUBMIT[case["case"]]):
                    engine.submit(workload_of(w, w["queue"]), 0.0)
                refused.add(w["name"])
                continue
            engine.submit(workload_of(w, w["queue"]), 0.0)
    return engine, engine.cycle(0.0), refused


@pytest.mark.parametrize("case", IN_SCOPE, ids=_id)
def test_kueue_schedule_for_tas_case(case: dict[str, Any]) -> None:
    engine, result, refused = run(case)
    got = {}
    for adm in result.admitted:
        got[adm.workload] = {p.name: (p.flavors, adm.topology_assignments.get(p.name)) for p in adm.pod_sets}
    want = {}
    for name, a in case["want_assignments"].items():
        want[name] = {p["name"]: (p["flavors"], TopologyAssignment(
            levels=tuple(p["topology"]["levels"]), domains=tuple((tuple(v), n) for v, n in p["topology"]["domains"]))
            if p["topology"] is not None else None) for p in a["pod_sets"]}
    assert got == want
    if case["want_victims"] is not None:
        assert {p.victim: p.reason for p in result.preempted} == case["want_victims"]
    pending = set(engine.pending_names()) - {p.victim for p in result.preempted}
    want_pending = {k.rpartition("/")[2] for d in (case["want_left"], case["want_inadmissible"])
                    for v in d.values() for k in v} - refused
    assert pending == want_pending
    for name, message in case["want_messages"].items():
        if name in refused:
            continue
        info = engine.pending_info(name)
        assert info is not None and info.message == message


def test_every_case_is_run_or_listed_with_a_reason() -> None:
    assert len(CASES) == 67 + 11 + 26  # TestScheduleForTAS, TestScheduleForTASPreemption, ...Cohorts
    assert len(IN_SCOPE) + len(NOT_PORTED) == len(CASES)
    assert all(NOT_PORTED.values())
