"""``apply_platform`` against the kmock API: every Kueue object server-side applied, idempotently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taugrid.config.platform import load_platform
from taugrid.core.errors import PermanentError
from taugrid.kube.platform import apply_platform

REPO = Path(__file__).resolve().parents[2]
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def platform() -> Any:
    return load_platform((REPO / "deploy" / "platform.yaml").read_text())


async def test_applies_every_object_with_ssa_and_reapply_changes_nothing(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    refs = await apply_platform(platform(), api_client=api_client)
    assert refs[:3] == ["ResourceFlavor/a100-80gb", "ResourceFlavor/cpu", "Cohort/research"]
    assert "LocalQueue/team-vision/vision-queue" in refs and "WorkloadPriorityClass/critical" in refs
    assert len(refs) == 2 + 1 + 2 + 2 + 4
    assert all(a["params"]["fieldManager"] == "taugrid" for a in fake.applies)
    assert all(a["params"]["force"] == "true" for a in fake.applies)
    assert {a["content_type"] for a in fake.applies} == {"application/apply-patch+yaml"}

    cq = fake.objects[((*KUEUE, "clusterqueues"), None, "vision")]
    assert cq["spec"]["cohortName"] == "research"
    lq = fake.objects[((*KUEUE, "localqueues"), "team-language", "language-queue")]
    assert lq["spec"] == {"clusterQueue": "language"}
    assert fake.objects[((*KUEUE, "workloadpriorityclasses"), None, "high")]["value"] == 200

    rv = fake.rv
    assert await apply_platform(platform(), api_client=api_client) == refs
    assert fake.rv == rv  # a no-op apply bumps no resourceVersion
    assert not api_client.rest_client.pool_manager.closed  # the caller's client stays open


async def test_a_rejected_apply_is_permanent_and_stops(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    fake.fail("PATCH", 403, 'resourceflavors.kueue.x-k8s.io "a100-80gb" is forbidden')
    with pytest.raises(PermanentError, match="forbidden"):
        await apply_platform(platform(), api_client=api_client)
    assert not fake.objects


async def test_client_from_env(fake_kube: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake, api_client = fake_kube
    monkeypatch.setenv("TAU_KUBE_HOST", api_client.configuration.host)
    refs = await apply_platform(platform())
    assert len(fake.objects) == len(refs) == 11


async def test_departments_apply_as_kai_queues_at_cluster_scope(fake_kube: Any) -> None:
    fake, api_client = fake_kube
    p = load_platform("""
resource_flavors: [{name: default}]
departments:
  - name: research
    deserved: {nvidia.com/gpu: 4}
    projects:
      - {name: vision, deserved: {nvidia.com/gpu: 2}, over_quota_weight: 3}
""")
    refs = await apply_platform(p, api_client=api_client)
    assert refs == ["ResourceFlavor/default", "Cohort/departments", "Cohort/research", "ClusterQueue/vision",
                    "Queue/research", "Queue/vision"]
    kai = ("scheduling.run.ai", "v2", "queues")
    assert fake.objects[(kai, None, "vision")]["spec"]["parentQueue"] == "research"
    assert fake.objects[(kai, None, "vision")]["spec"]["resources"]["gpu"] == {
        "quota": 2, "limit": -1, "overQuotaWeight": 3}
