"""Accounting folds a run's events into queue wait, run time, GPU-seconds and cost, retries and fractions included."""

from __future__ import annotations

import msgspec

from taugrid.core.contracts import ResolvedRun, Resources
from taugrid.core.usage import Seen, fold, gpus_held, roll_up


def resolved(**kw) -> ResolvedRun:  # type: ignore[no-untyped-def]
    return ResolvedRun(run_id="r", submission_id="s", workspace="ws", namespace="ns", name="r", profile="a100-1",
                       cluster_queue="team", **kw)


def test_a_retried_gpu_run_counts_both_attempts_and_its_cost() -> None:
    run = resolved(resources=Resources(gpu=2))
    evs = [Seen("submit.requested", "r", "ws", 100.0, user="ada"), Seen("policy.approved", "r", "ws", 101.0,
                                                                       resolved=run),
           Seen("admission.admitted", "r", "ws", 110.0), Seen("exec.running", "r", "ws", 112.0),
           Seen("exec.failed", "r", "ws", 172.0), Seen("recovery.retrying", "r", "ws", 173.0),
           Seen("admission.admitted", "r", "ws", 178.0), Seen("exec.running", "r", "ws", 180.0),
           Seen("exec.succeeded", "r", "ws", 300.0)]
    [u] = fold(evs, prices={"a100-1": 3.6}, now=1000.0)
    assert (u.user, u.queue, u.gpus, u.queued_s, u.running_s) == ("ada", "team", 2.0, 15.0, 180.0)
    assert (u.gpu_seconds, round(u.cost, 6)) == (360.0, 0.36)  # 0.1 GPU-hour × 3.6


def test_fractions_ray_workers_and_runs_still_going_count_to_now() -> None:
    assert gpus_held(resolved(resources=Resources(gpu_fraction=0.5), nodes=2)) == 1.0
    # a Ray run's resources are its workers' (resolve); its head holds none
    assert gpus_held(resolved(engine="ray", resources=Resources(gpu=2), workers=3, gpus_per_worker=2)) == 6.0
    evs = [Seen("submit.requested", "q", "ws", 0.0), Seen("policy.approved", "q", "ws", 1.0,
                                                          resolved=resolved(resources=Resources(gpu_fraction=0.25))),
           Seen("submit.requested", "w", "other", 0.0)]
    evs += [Seen("admission.admitted", "q", "ws", 4.0), Seen("exec.running", "q", "ws", 5.0)]
    usage = {u.run_id: u for u in fold(evs, prices={}, now=45.0)}
    assert (usage["q"].queued_s, usage["q"].running_s, usage["q"].gpu_seconds, usage["q"].cost) == (
        4.0, 40.0, 10.0, 0.0)
    assert (usage["w"].queued_s, usage["w"].running_s) == (45.0, 0.0)  # still waiting
    assert roll_up(usage.values(), "workspace") == [
        {"workspace": "ws", "runs": 1, "queued_s": 4.0, "running_s": 40.0, "gpu_seconds": 10.0, "cost": 0.0},
        {"workspace": "other", "runs": 1, "queued_s": 45.0, "running_s": 0.0, "gpu_seconds": 0.0, "cost": 0.0}]


def test_an_elastic_run_pays_for_the_pods_it_held_between_its_resizes() -> None:
    run = resolved(resources=Resources(gpu=1), nodes=3)  # started with 3 one-GPU pods
    evs = [Seen("submit.requested", "e", "ws", 0.0), Seen("policy.approved", "e", "ws", 1.0, resolved=run),
           Seen("admission.admitted", "e", "ws", 2.0), Seen("exec.running", "e", "ws", 10.0),
           Seen("exec.resized", "e", "ws", 20.0, pods=2),  # shrunk for a preemptor: 3 GPUs × 10 s
           Seen("exec.resized", "e", "ws", 50.0, pods=3),  # grown back: 2 GPUs × 30 s
           Seen("exec.succeeded", "e", "ws", 60.0)]  # 3 GPUs × 10 s
    [u] = fold(evs, prices={"a100-1": 3.6}, now=100.0)
    assert (u.gpus, u.running_s, u.gpu_seconds) == (3.0, 50.0, 120.0)
    assert round(u.cost, 6) == 0.12
    preempted = [*evs[:5], Seen("admission.preempted", "e", "ws", 30.0), Seen("admission.admitted", "e", "ws", 40.0),
                 Seen("exec.running", "e", "ws", 40.0)]  # requeued at the 2 pods it had
    [p] = fold(preempted, prices={}, now=50.0)
    assert (p.running_s, p.gpu_seconds) == (30.0, 3 * 10 + 2 * 10 + 2 * 10)
    retried = [*evs[:5], Seen("exec.failed", "e", "ws", 30.0), Seen("recovery.retrying", "e", "ws", 31.0),
               Seen("admission.admitted", "e", "ws", 40.0), Seen("exec.running", "e", "ws", 40.0)]
    [r] = fold(retried, prices={}, now=50.0)  # a new attempt: a new Job at the written 3 pods
    assert (r.running_s, r.gpu_seconds) == (30.0, 3 * 10 + 2 * 10 + 3 * 10)


def _ran(run_id: str, run: ResolvedRun, node: str, seconds: float) -> list[Seen]:
    return [Seen("submit.requested", run_id, "ws", 0.0), Seen("policy.approved", run_id, "ws", 0.0, resolved=run),
            Seen("admission.admitted", run_id, "ws", 0.0), Seen("exec.running", run_id, "ws", 0.0, node=node),
            Seen("exec.succeeded", run_id, "ws", seconds)]


def test_gpu_time_is_accounted_by_vendor_and_model() -> None:
    """A vendor from the run's GPU resource ("" is NVIDIA's); a model from its profile's gpu_model, else from the
    node it ran on; a CPU run has neither."""
    evs = (_ran("cuda", resolved(resources=Resources(gpu=2)), "nv-0", 100.0)
           + _ran("rocm", msgspec.structs.replace(resolved(resources=Resources(gpu=4), gpu_resource="amd.com/gpu"),
                                                  profile="mi"), "mi-0", 50.0)
           + _ran("hpu", resolved(resources=Resources(gpu=1), gpu_resource="habana.ai/gaudi"), "hl-0", 10.0)
           + _ran("cpu", resolved(resources=Resources(cpu=1.0)), "nv-0", 10.0))
    usage = fold(evs, prices={}, now=200.0, models={"mi": "amd-mi300x"}, node_models={"hl-0": "gaudi3",
                                                                                      "mi-0": "amd-mi250x"})
    assert {u.run_id: (u.vendor, u.model, u.node) for u in usage} == {
        "cuda": ("nvidia", "", "nv-0"), "rocm": ("amd", "amd-mi300x", "mi-0"), "hpu": ("intel-gaudi", "gaudi3", "hl-0"),
        "cpu": ("", "", "nv-0")}
    assert [(r["vendor"], r["runs"], r["gpu_seconds"]) for r in roll_up(usage, "vendor")] == [
        ("amd", 1, 200.0), ("nvidia", 1, 200.0), ("intel-gaudi", 1, 10.0), ("-", 1, 0.0)]
    assert [(r["model"], r["gpu_seconds"]) for r in roll_up(usage, "model")] == [
        ("-", 200.0), ("amd-mi300x", 200.0), ("gaudi3", 10.0)]
