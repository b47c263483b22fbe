"""Kueue's TestFindTopologyAssignments table (``pkg/cache/scheduler/tas_cache_test.go``), ported as data.

Each case builds the nodes (labels, allocatable cpu/memory/GPUs/pods, readiness, cordon, taints), takes the
non-TAS pods' requests off their nodes, and asks the engine's TAS (``placement.Cluster.tas_assign`` over
``tas``) for the topology assignment of the case's pod sets on a TAS flavor whose topology has the case's
levels. It compares, per pod set, Kueue's expected levels and (values, count) per domain, or the reason the
pod set does not fit.

``NOT_PORTED`` names every case not run, with the reason (a Kueue feature gate or field taugrid does not
model); ``cases_tas_find.json`` is written by ``kueue/extract_tas.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kueue"))
import port  # noqa: E402

from taugrid.core.admission import (  # noqa: E402
    GpuDevice,
    Node,
    PodSet,
    ResourceFlavor,
    Taint,
    Toleration,
    Topology,
    TopologyAssignment,
    TopologyRequest,
    Workload,
)
from taugrid.core.admission.placement import Cluster, TasFailure  # noqa: E402
from taugrid.core.errors import PermanentError  # noqa: E402

CASES = port.load_cases("tas_find")
GPU_NAMES = port.GPU_NAMES


def _reason(case: dict[str, Any]) -> str:
    return "; ".join(case["unsupported"])


NOT_PORTED: dict[str, str] = {c["case"]: _reason(c) for c in CASES if c["unsupported"]}
# Kueue answers these from the snapshot; taugrid refuses the request when the workload is validated (the rule of
# Kueue's webhook), so the case checks that refusal instead.
REFUSED_AT_VALIDATION = {"slice size is required when slice topology is requested": "slice_size must be set"}
IN_SCOPE = [c for c in CASES if not c["unsupported"]]


def node_of(spec: dict[str, Any], pods: list[dict[str, Any]]) -> Node:
    """A Kueue test node with the requests of its running non-TAS pods taken off (Kueue's non-TAS usage)."""
    alloc = {k: port.qty(v) for k, v in spec["alloc"].items()}
    cpu, memory, max_pods = alloc.get("cpu", 0.0), alloc.get("memory", 0.0), int(alloc.get("pods", 0))
    gpus = int(sum(alloc.get(g, 0) for g in GPU_NAMES))
    for p in pods:
        if p["node"] != spec["name"] or p["phase"] in ("Succeeded", "Failed"):
            continue
        req = {k: port.qty(v) for k, v in p["requests"].items()}
        cpu -= req.get("cpu", 0.0)
        memory -= req.get("memory", 0.0)
        gpus -= int(sum(req.get(g, 0) for g in GPU_NAMES))
        max_pods -= 1
    return Node(spec["name"], gpus=tuple(GpuDevice(i) for i in range(gpus)), cpu=cpu, memory=memory,
                labels=spec["labels"], taints=tuple(Taint(**t) for t in spec["taints"]), ready=spec["ready"],
                max_pods=max_pods)


def pod_set_of(spec: dict[str, Any]) -> PodSet:
    requests: dict[str, float] = {}
    for r, v in spec["requests"].items():  # Kueue's int64 requests: cpu in millis, the rest in base units
        if r == "cpu":
            requests["cpu"] = v / 1000
        elif r in GPU_NAMES:
            requests["nvidia.com/gpu"] = requests.get("nvidia.com/gpu", 0) + v
        else:
            requests[r] = v
    tr = spec["request"]
    if tr is not None and spec["group"] is not None:  # the test's podSetGroupName, as Kueue's harness passes it
        tr = {**tr, "pod_set_group": spec["group"]}
    return PodSet(spec["name"], count=spec["count"], requests=requests, node_selector=spec["node_selector"],
                  tolerations=tuple(Toleration(**t) for t in spec["tolerations"]),
                  topology_request=TopologyRequest(**tr) if tr is not None else None)


def _id(case: dict[str, Any]) -> str:
    return f"{case['test']}/{case['case']}"


@pytest.mark.parametrize("case", IN_SCOPE, ids=_id)
def test_kueue_find_topology_assignments_case(case: dict[str, Any]) -> None:
    topology = Topology("default", tuple(case["levels"]))
    flavor = ResourceFlavor("tas", node_labels=case["node_labels"], topology_name="default")
    cluster = Cluster([node_of(n, case["pods"]) for n in case["nodes"]], {"default": topology})
    cluster.unschedulable.update(n["name"] for n in case["nodes"] if n["unschedulable"])
    pod_sets = [pod_set_of(p) for p in case["pod_sets"]]
    wl = Workload("wl", "q", pod_sets=tuple(pod_sets))
    if case["case"] in REFUSED_AT_VALIDATION:
        with pytest.raises(PermanentError, match=REFUSED_AT_VALIDATION[case["case"]]):
            wl.validate()
        return
    # Like Kueue's test, the placement is asked directly: some cases combine annotations Kueue's webhook (and
    # Workload.validate) would refuse (a pod-set group with slices), to test the algorithm's corners.
    got = cluster.tas_assign(wl, [{r: "tas" for r in ps.requests} or {"cpu": "tas"} for ps in pod_sets],
                             {"tas": flavor})
    placed = got.placed if isinstance(got, TasFailure) else got[1]
    for spec in case["pod_sets"]:
        if spec["want_reason"]:
            # Kueue reports a group's failure on both of its pod sets; taugrid names the workers' pod set.
            group = [p["name"] for p in case["pod_sets"] if spec["group"] and p["group"] == spec["group"]]
            assert isinstance(got, TasFailure) and got.pod_set in (group or [spec["name"]])
            assert got.reason == spec["want_reason"]
            continue
        want = spec["want"]
        if want is None:  # Kueue stopped at an earlier pod set's failure
            assert spec["name"] not in placed
            continue
        assert placed[spec["name"]] == TopologyAssignment(
            levels=tuple(want["levels"]), domains=tuple((tuple(v), n) for v, n in want["domains"]))
    if not any(spec["want_reason"] for spec in case["pod_sets"]):
        assert not isinstance(got, TasFailure), got


def test_every_case_is_run_or_listed_with_a_reason() -> None:
    assert len(CASES) == 140
    assert len(IN_SCOPE) + len(NOT_PORTED) == len(CASES)
    assert all(NOT_PORTED.values())
