"""``render_platform``: platform.yaml → Kueue v1beta2 objects that pass the CRD schemas."""

from __future__ import annotations

from pathlib import Path

import pytest

from taugrid.config.machine import default_platform
from taugrid.config.platform import load_platform
from taugrid.core.errors import PermanentError
from taugrid.render.kueue import render_platform
from taugrid.render.validate import validate

REPO = Path(__file__).resolve().parents[2]


def sample() -> list[dict]:
    return render_platform(load_platform((REPO / "deploy" / "platform.yaml").read_text()))


def by(objs: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_sample_platform_renders_every_kind_valid_in_apply_order() -> None:
    objs = sample()
    for o in objs:
        validate(o)
        assert o["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert o["metadata"]["labels"]["taugrid.io/managed-by"] == "taugrid"
    kinds = [o["kind"] for o in objs]
    assert kinds == sorted(kinds, key=["ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue",
                                       "WorkloadPriorityClass"].index)
    assert kinds.count("ClusterQueue") == 2 and kinds.count("WorkloadPriorityClass") == 4
    assert objs == sample()  # deterministic


def test_cluster_queue_fields_follow_v1beta2() -> None:
    cq = by(sample(), "ClusterQueue", "language")["spec"]
    assert cq["cohortName"] == "research" and "cohort" not in cq
    assert cq["namespaceSelector"] == {"matchLabels": {"taugrid.io/team": "language"}}
    assert cq["queueingStrategy"] == "BestEffortFIFO"
    assert cq["fairSharing"] == {"weight": "2"}
    assert cq["preemption"] == {
        "withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any",
        "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
    }
    group = cq["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert [f["name"] for f in group["flavors"]] == ["a100-80gb", "cpu"]  # order is preference
    gpu = group["flavors"][0]["resources"][2]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": "16", "borrowingLimit": "8", "lendingLimit": "8"}
    assert group["flavors"][0]["resources"][1]["nominalQuota"] == "1800Gi"


def test_flavor_cohort_local_queue_and_priority_class_shapes() -> None:
    objs = sample()
    rf = by(objs, "ResourceFlavor", "a100-80gb")["spec"]
    assert rf["nodeLabels"]["taugrid.io/gpu-class"] == "a100-80gb"
    assert rf["nodeTaints"] == [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}]
    assert rf["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert by(objs, "Cohort", "research")["spec"] == {"fairSharing": {"weight": "1"}}
    lq = by(objs, "LocalQueue", "vision-queue")
    assert lq["metadata"]["namespace"] == "team-vision" and lq["spec"] == {"clusterQueue": "vision"}
    crit = by(objs, "WorkloadPriorityClass", "critical")
    assert crit["value"] == 1000 and "never preempted" in crit["description"]
    assert crit["metadata"]["annotations"]["taugrid.io/preemptible"] == "false"


def test_machine_default_platform_renders_valid_with_open_namespace_selector() -> None:
    p = default_platform(8, 32 << 30, ["NVIDIA H200"], output_root="/tmp/out")
    objs = render_platform(p)
    for o in objs:
        validate(o)
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    assert cq["spec"]["namespaceSelector"] == {}  # {} admits every namespace; null would admit none
    flavor = cq["spec"]["resourceGroups"][0]["flavors"][0]
    resources = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    assert resources["cpu"] == "8" and resources["nvidia.com/gpu"] == "1"
    assert {o["kind"] for o in objs} == {"ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue",
                                         "WorkloadPriorityClass"}


def test_nested_cohorts_render_parents_first_with_parent_name() -> None:
    text = (REPO / "deploy" / "platform.yaml").read_text().replace(
        "cohorts:\n  - name: research\n", "cohorts:\n  - name: research\n    parent: org\n  - name: org\n")
    objs = render_platform(load_platform(text))
    cohorts = [o for o in objs if o["kind"] == "Cohort"]
    assert [c["metadata"]["name"] for c in cohorts] == ["org", "research"]
    assert cohorts[1]["spec"]["parentName"] == "org"
    for c in cohorts:
        validate(c)


def test_validate_catches_a_v1beta1_field_name() -> None:
    cq = by(sample(), "ClusterQueue", "vision")
    cq["spec"]["cohort"] = cq["spec"].pop("cohortName")
    with pytest.raises(PermanentError, match="cohort: unknown field"):
        validate(cq)
