"""Kueue's TestPreemption table (``pkg/scheduler/preemption/preemption_test.go``), ported as data.

Each case starts from Kueue's admitted workloads (restored with their flavor assignment and usage), submits the
incoming workload to the target ClusterQueue, asks for the preemption targets under the case's flavor
assignment (as Kueue's test calls ``GetTargets``) and compares the victims and their Preempted reasons with
Kueue's expectation. The data comes from ``kueue/cases_preemption.json`` (``kueue/extract.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "kueue"))
import port  # noqa: E402

CASES = port.load("preemption")["cases"]


def _id(case: dict) -> str:  # type: ignore[type-arg]
    return f"{case['test']}/{case['case']}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_kueue_preemption_case(case: dict) -> None:  # type: ignore[type-arg]
    assert case["unsupported"] == []  # every TestPreemption case is within scope
    engine = port.engine(case)
    for w in case["admitted"]:
        port.restore(engine, w)
    engine.submit(port.workload(case["incoming"], case["target_cq"]), 0.0)
    # Kueue's test hands GetTargets a fixed flavor assignment; so does the port.
    flavors = [{r: fm[0] for r, fm in ps.items()} for ps in case["assignment"]]
    preempt = [[r for r, fm in ps.items() if fm[1] == "Preempt"] for ps in case["assignment"]]
    got = dict(engine.preemption_targets("in", flavors, preempt))
    # A target whose eviction is already under way counts as preempted but gets no new Preempted condition.
    evicted = {w["name"] for w in case["admitted"]
               if any(c["type"] == "Evicted" and c["status"] == "True" for c in w["conditions"])}
    assert {k: v for k, v in got.items() if k not in evicted} == case["want_victims"]
    assert len(got) == case["want_preempted_count"]
