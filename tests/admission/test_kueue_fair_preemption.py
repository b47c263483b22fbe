"""Kueue's TestFairPreemptions table (``pkg/scheduler/preemption/preemption_fair_test.go``), ported as data.

Fair sharing on, with the case's preemption strategies; each case restores Kueue's admitted workloads, queues the
incoming one in the target ClusterQueue and asks for the preemption targets with the whole request on the case's
flavor in Preempt mode (as Kueue's test calls ``GetTargets``); victims and reasons must match.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kueue"))
import port  # noqa: E402

from taugrid.core.admission import Engine  # noqa: E402

CASES = port.load("fair_preemption")["cases"]
IN_SCOPE = [c for c in CASES if not c["unsupported"]]
OUT = {c["case"]: "; ".join(c["unsupported"]) for c in CASES if c["unsupported"]}


def _id(case: dict[str, Any]) -> str:
    return f"{case['test']}/{case['case']}"


@pytest.mark.parametrize("case", IN_SCOPE, ids=_id)
def test_kueue_fair_preemption_case(case: dict[str, Any]) -> None:
    engine = Engine([port.cluster_queue(c) for c in case["cluster_queues"]],
                    [port.cohort(c) for c in case["cohorts"]], [port.flavor(f) for f in case["flavors"]],
                    fair_sharing=True, fair_sharing_strategies=case["strategies"])
    for w in case["admitted"]:
        port.restore(engine, w)
    engine.submit(port.workload(case["incoming"], case["target_cq"]), 0.0)
    name = case["incoming"]["name"]
    resources = [list(ps["requests"]) for ps in case["incoming"]["pod_sets"]]
    flavors = [{r: case["assignment_flavor"] for r in rs} for rs in resources]
    got = dict(engine.preemption_targets(name, flavors, [["cpu"] for _ in resources]))
    assert got == case["want_victims"]


def test_out_of_scope_cases_are_documented() -> None:
    doc = " ".join((Path(__file__).parents[2] / "docs" / "architecture.md").read_text().split())
    assert len(CASES) == 35
    assert [name for name in OUT if name not in doc] == []
