"""platform.yaml departments → KAI ``Queue`` objects (scheduling.run.ai/v2) valid against KAI's CRD, plus the
Kueue cohorts and ClusterQueues the same departments imply."""

from __future__ import annotations

from taugrid.config.platform import load_platform
from taugrid.render.kueue import render_platform
from taugrid.render.validate import validate

PLATFORM = """
resource_flavors:
  - name: a100
departments:
  - name: research
    deserved: {nvidia.com/gpu: 8, cpu: 64, memory: 512Gi}
    limit: {nvidia.com/gpu: 12}
    over_quota_weight: 2
    projects:
      - name: vision
        deserved: {nvidia.com/gpu: 2, cpu: 1500m}
        limit: {nvidia.com/gpu: 6}
        over_quota_weight: 3
        priority: 120
      - name: language
        deserved: {nvidia.com/gpu: 2}
local_queues:
  - {name: q, namespace: team-vision, cluster_queue: vision}
"""


def test_departments_render_as_kai_queues_parents_first_and_valid() -> None:
    objs = render_platform(load_platform(PLATFORM))
    for o in objs:
        validate(o)
    queues = [o for o in objs if o["kind"] == "Queue"]
    assert [(q["metadata"]["name"], q["spec"].get("parentQueue")) for q in queues] == [
        ("research", None), ("vision", "research"), ("language", "research")]
    assert queues[0]["apiVersion"] == "scheduling.run.ai/v2"
    assert queues[0]["spec"] == {"priority": 100, "resources": {
        "cpu": {"quota": 64000, "limit": -1, "overQuotaWeight": 2},
        "memory": {"quota": 549755.813888, "limit": -1, "overQuotaWeight": 2},
        "gpu": {"quota": 8, "limit": 12, "overQuotaWeight": 2}}}
    assert queues[1]["spec"] == {"priority": 120, "parentQueue": "research", "resources": {
        "cpu": {"quota": 1500, "limit": -1, "overQuotaWeight": 3},
        "memory": {"quota": 0, "limit": -1, "overQuotaWeight": 3},
        "gpu": {"quota": 2, "limit": 6, "overQuotaWeight": 3}}}


def test_departments_imply_kueue_cohorts_and_cluster_queues() -> None:
    objs = render_platform(load_platform(PLATFORM))
    cohorts = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Cohort"}
    assert cohorts == {"departments": {"fairSharing": {"weight": "1"}},
                       "research": {"fairSharing": {"weight": "2"}, "parentName": "departments"}}
    vision = next(o for o in objs if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "vision")["spec"]
    assert vision["cohortName"] == "research" and vision["fairSharing"] == {"weight": "3"}
    assert vision["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    assert vision["resourceGroups"] == [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
        {"name": "a100", "resources": [{"name": "cpu", "nominalQuota": "1500m"},
                                       {"name": "memory", "nominalQuota": "0"},
                                       {"name": "nvidia.com/gpu", "nominalQuota": "2", "borrowingLimit": "4"}]}]}]


def test_a_project_run_names_its_kai_queue_on_the_job_and_its_pods() -> None:
    from taugrid.config.resolve import resolve_run
    from taugrid.config.taujob import config_hash, load_tau_config
    from taugrid.render import render

    platform = load_platform(PLATFORM + "workspaces: [{name: vision, namespace: team-vision, local_queue: q}]\n")
    cfg = load_tau_config("name: t\nentrypoint: t.py\ncompute: {gpus: 1}\n")
    run = resolve_run(cfg, platform, run_id="t-0a1b2c", submission_id="s", workspace="vision",
                      platform_revision=1, config_hash=config_hash(cfg), source_object="", source_digest="",
                      user="ada")
    job = next(m for m in render(run, attempt=1) if m["kind"] == "Job")
    validate(job)
    assert job["metadata"]["labels"]["kai.scheduler/queue"] == "vision"
    assert job["spec"]["template"]["metadata"]["labels"]["kai.scheduler/queue"] == "vision"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
