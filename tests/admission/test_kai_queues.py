"""KAI's queue model from platform.yaml: departments of projects with deserved quota, limit and over-quota weight.

The platform text goes through the same translation the local cluster uses (``local.admit.engine_objects`` and
``local.kaiqueues``) onto one 8-GPU node, so these are the decisions the local cluster makes.
"""

from __future__ import annotations

from adm_build import run_until_quiet, wl

from taugrid.config.platform import load_platform
from taugrid.core.admission import GPU, Engine, GpuDevice, Node
from taugrid.local.admit import engine_objects
from taugrid.local.kaiqueues import kai_spec, with_department_quota

PLATFORM = """
resource_flavors:
  - name: gpu
departments:
  - name: research
    deserved: {nvidia.com/gpu: 8}
    projects:
      - name: vision
        deserved: {nvidia.com/gpu: 2}
        over_quota_weight: 3
      - name: language
        deserved: {nvidia.com/gpu: 2}
        over_quota_weight: 1
"""
CAPACITY = {GPU: 8.0, "cpu": 64.0, "memory": float(512 << 30)}


def engine(text: str = PLATFORM) -> Engine:
    p = load_platform(text)
    cqs, cohorts, flavors = engine_objects(p)
    node = Node("n0", tuple(GpuDevice(i) for i in range(8)), cpu=64, memory=512 << 30)
    return Engine(cqs, with_department_quota(p, cohorts, CAPACITY), flavors, [node], kai=kai_spec(p, CAPACITY),
                  audit=True)


def gpus(e: Engine, project: str) -> int:
    return sum(v for (_, r), v in e.usage(project).items() if r == GPU) // 1000


def test_two_projects_share_the_departments_idle_gpus_in_proportion_to_their_weights() -> None:
    e = engine()
    for i in range(8):
        e.submit(wl(f"v{i}", "vision", gpu=1, t=i), 0)
        e.submit(wl(f"l{i}", "language", gpu=1, t=i), 0)
    _, preempted = run_until_quiet(e)
    # deserved 2 each, the other 4 idle GPUs split 3:1 by weight: 2+3 and 2+1
    assert (gpus(e, "vision"), gpus(e, "language")) == (5, 3)
    assert e.kai is not None and e.kai.fair["vision"][GPU] == 5000 and e.kai.fair["language"][GPU] == 3000
    # both filled 4 GPUs first; vision, below its fair share, reclaimed the newest of language's fourth
    assert [(p.victim, p.preemptor, p.reason) for p in preempted] == [("l3", "v4", "InCohortReclamation")]
    waiting = e.pending_info("l4")
    assert waiting is not None and waiting.message.endswith(
        "; project language uses 3 nvidia.com/gpu of its fair share of 3 and this workload asks for 1 more, so it "
        "waits for idle resources")


def test_a_project_below_its_deserved_quota_reclaims_it_by_preempting_over_quota_use() -> None:
    e = engine()
    for i in range(8):
        e.submit(wl(f"v{i}", "vision", gpu=1, t=i), 0)
    run_until_quiet(e)
    assert gpus(e, "vision") == 8  # alone, vision takes every idle GPU of the department
    e.submit(wl("l0", "language", gpu=1, t=10), 10)
    e.submit(wl("l1", "language", gpu=1, t=11), 10)
    _, preempted = run_until_quiet(e, 10)
    assert (gpus(e, "vision"), gpus(e, "language")) == (6, 2)
    assert e.is_admitted("l0") and e.is_admitted("l1")
    # the newest over-quota workloads of vision go first
    assert sorted((p.victim, p.preemptor) for p in preempted) == [("v6", "l1"), ("v7", "l0")]


def test_a_project_limit_caps_what_it_takes_even_when_gpus_are_idle() -> None:
    e = engine(PLATFORM.replace("        over_quota_weight: 3\n", "        over_quota_weight: 3\n"
                                "        limit: {nvidia.com/gpu: 5}\n"))
    for i in range(8):
        e.submit(wl(f"v{i}", "vision", gpu=1, t=i), 0)
    run_until_quiet(e)
    assert gpus(e, "vision") == 5
    pending = e.pending_info("v5")
    assert pending is not None and pending.message == ("couldn't assign flavors to pod set main: insufficient "
                                                       "unused quota for nvidia.com/gpu in flavor gpu, 1 more needed; "
                                                       "project vision uses 5 nvidia.com/gpu of its limit of 5 and "
                                                       "this workload asks for 1 more")


def test_the_local_queue_snapshot_shows_each_projects_fair_share() -> None:
    from taugrid.cli.queue_cmd import queue_view
    from taugrid.local.admit import LocalAdmitter, Request

    admitter = LocalAdmitter("n0", {"memory": float(64 << 30)}, gpu_count=8)
    admitter.configure(load_platform(PLATFORM))
    for i in range(8):
        admitter.submit(Request(f"v{i}", "vision", 0, float(i), 1, {"cpu": 1, GPU: 1}))
    admitter.submit(Request("l0", "language", 0, 0.0, 1, {"cpu": 1, GPU: 1}))
    admitter.cycle()
    snap = {q["cluster_queue"]: q for q in admitter.snapshot(0.0)}
    assert snap["vision"]["fair_share"] == {GPU: 7.0} and snap["language"]["fair_share"] == {GPU: 1.0}
    for q in snap.values():
        q["pending"] = []
    view = queue_view({"time": 0.0, "node": "n0", "queues": list(snap.values())}, show_pending=0, now=0.0)
    assert "  vision: fair share gpu=7\n  language: fair share gpu=1" in view
