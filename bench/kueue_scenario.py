"""Kueue's baseline scheduler-performance scenario, replayed through the whole taugrid pipeline.

The embedded stack (nats-server, every service as its own process) runs with the local cluster's simulated
node pool (pods complete after the duration in their env; no process is spawned, as Kueue's own performance
tests simulate jobs). Shape, per Kueue's test/performance/scheduler baseline: 5 cohorts × 6 ClusterQueues,
nominalQuota 20, borrowingLimit 100, reclaimWithinCohort Any, withinClusterQueue LowerPriority; per
ClusterQueue 350 small (1 unit, 200 ms, priority 50, one every 100 ms), 100 medium (5 units, 500 ms,
priority 100, every 500 ms), 50 large (20 units, 1000 ms, priority 200, every 1200 ms) = 15,000 runs.

Prints wall time, average ClusterQueue usage and mean time to admission per class beside Kueue's limits. Usage
is the quota the runs held, from their own events: each run's units from its ``admission.admitted`` to its end,
summed and divided by the 30 ClusterQueues' nominal quota over the wall time (the local cluster's ``queues``
snapshot, printed every second as it stands, is written only now and then, so sampling it under-counts).
Times are the cluster's: an event's ``ce-time``, which the admission watcher copies from the watch event (when
the local cluster admitted or ended the run), as Kueue's figures come from its Workloads' conditions; the same
figures as the bench saw the events arrive (after the admission watcher's lag) are printed beside them.
``--fraction 0.1`` shrinks the run counts (not the rates) for a quick look.

Every run started is counted: a run never admitted counts with its wait until the bench gave up, an
unfinished run makes the wall time the time the bench gave up, and two submissions given one run id count as a
lost run. Also prints each service's resident memory after the scenario against issue 11's aim (80 MB; checked
too) and the CPU per run of each process. Exits 1 when a limit or that aim is missed or a run did not finish.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import msgspec
import nats
from pipeline import cpu_seconds, rss, simulated_stack, stack_up  # bench/ is this script's directory, first on sys.path

from taugrid.bus.envelope import from_message
from taugrid.client import Client, open_client
from taugrid.core.ids import new_run_id, new_submission_id

COHORTS, CQS = 5, 6
CLASSES = {  # name: (count per CQ, units, seconds, priority class, interval)
    "small": (350, 1, 0.2, "p50", 0.1),
    "medium": (100, 5, 0.5, "p100", 0.5),
    "large": (50, 20, 1.0, "p200", 1.2),
}
KUEUE_LIMITS = {"wall_s": 425.0, "usage_pct": 50.0, "large": 23.0, "medium": 90.0, "small": 260.0}
RSS_AIM_MB = 80.0  # issue 11: resident memory per service after 15,000 runs (nats-server is not one)


def platform_yaml() -> str:
    lines = ["resource_flavors: [{name: default}]", "cohorts:"]
    lines += [f"  - {{name: cohort-{c}}}" for c in range(COHORTS)]
    lines.append("cluster_queues:")
    for c in range(COHORTS):
        for q in range(CQS):
            lines += [
                f"  - name: cq-{c}-{q}", f"    cohort: cohort-{c}",
                "    preemption: {within_cluster_queue: LowerPriority, reclaim_within_cohort: Any}",
                "    resource_groups:", "      - covered_resources: [cpu, memory]", "        flavors:",
                "          - name: default", "            resources:",
                '              - {name: cpu, nominal_quota: "20", borrowing_limit: "100"}',
                '              - {name: memory, nominal_quota: "1000Gi"}',
            ]
    lines.append("local_queues:")
    lines += [f"  - {{name: lq-{c}-{q}, namespace: default, cluster_queue: cq-{c}-{q}}}"
              for c in range(COHORTS) for q in range(CQS)]
    lines += ["priority_classes: [{name: p50, value: 50}, {name: p100, value: 100}, {name: p200, value: 200}]",
              "compute_profiles: [{name: unit, cpu: '1', memory: 1Mi}]", "workspaces:"]
    lines += [f"  - {{name: ws-{c}-{q}, namespace: default, local_queue: lq-{c}-{q}, default_profile: unit, "
              f"default_priority: p50, submissions_per_minute: 0}}" for c in range(COHORTS) for q in range(CQS)]
    return "\n".join(lines) + "\n"


def run_yaml(cls: str) -> str:
    _, units, secs, prio, _ = CLASSES[cls]
    return (f"name: {cls}\nentrypoint: sim.py\ncompute: {{gpus: 0, cpu_request: '{units}', memory_request: 1Mi}}\n"
            f"policy: {{workload_priority_class: {prio}}}\nruntime: {{env: {{SIMULATED_DURATION: '{secs}'}}}}\n")


STAGES = ("submit.accepted", "policy.approved", "render.applied", "workload.added", "admission.queued",
          "admission.admitted", "exec.succeeded", "evidence.sealed")


async def drive(url: str, fraction: float, *, creds: Path, user_creds: str, stages: bool = False,
                timeout: float = 1800) -> dict[str, object]:
    # The bench listens to every run's events live, which only the stack's bootstrap identity may do.
    client = await open_client(url, creds=creds)
    # Submissions are signed by the stack's owner, a platform user (the bootstrap identity is not one).
    submitter = await open_client(url, creds=user_creds)
    nc = client.bus.nc
    reached: dict[str, int] = dict.fromkeys(STAGES, 0)

    # run id → stage → when the stage's event happened (its ce-time), for the per-class breakdown (``--stages``)
    stage_times: dict[str, dict[str, float]] = {}

    async def on_stage(msg: nats.aio.msg.Msg) -> None:
        parts = msg.subject.split(".")
        # run.<ws>.<run>.<family>.<type>[.lane]; k8s.local.workload.<ns>.<name>.added[.lane]
        kind = ".".join(parts[3:5]) if parts[0] == "run" else "workload.added"
        if kind in reached:
            reached[kind] += 1
            stage_times.setdefault(msg.headers.get("ce-subject", ""), {}).setdefault(kind, happened(msg))

    if stages:  # per-stage progress: how many runs each stage has passed, to see where a backlog builds
        await nc.subscribe("run.>", cb=on_stage)
        await nc.subscribe("k8s.local.workload.*.*.added", cb=on_stage)
        await nc.subscribe("k8s.local.workload.*.*.added.*", cb=on_stage)
    submissions: list[tuple[str, str, float]] = []  # every run started: (run id, class, when)
    # When each run was admitted and ended by the cluster's clock (the event's ce-time: the admission watcher
    # stamps its events with the time of the watch event, when the local cluster admitted or ended the run), as
    # Kueue's own figures come from the Workload's conditions; and when the bench saw the event, printed beside.
    admitted: dict[str, float] = {}
    finished: dict[str, float] = {}
    seen_admitted: dict[str, float] = {}
    seen_finished: dict[str, float] = {}

    def happened(msg: nats.aio.msg.Msg) -> float:
        return from_message(msg.subject, msg.headers, b"").happened or time.time()

    async def on_admitted(msg: nats.aio.msg.Msg) -> None:
        run = msg.headers.get("ce-subject", "")
        if run not in admitted:
            admitted[run], seen_admitted[run] = happened(msg), time.time()

    async def on_terminal(msg: nats.aio.msg.Msg) -> None:
        run = msg.headers.get("ce-subject", "")
        if run not in finished:
            finished[run], seen_finished[run] = happened(msg), time.time()

    await nc.subscribe("run.*.*.admission.admitted", cb=on_admitted)
    for t in ("exec.succeeded", "recovery.gave_up", "submit.rejected", "policy.rejected", "exec.cancelled"):
        await nc.subscribe(f"run.*.*.{t}", cb=on_terminal)
    texts = {cls: run_yaml(cls) for cls in CLASSES}
    total = sum(max(1, int(n * fraction)) for n, *_ in CLASSES.values()) * COHORTS * CQS
    start = time.time()

    async def feed(ws: str, cls: str) -> None:
        n, _, _, _, every = CLASSES[cls]
        for i in range(max(1, int(n * fraction))):
            await asyncio.sleep(max(0.0, start + i * every - time.time()))
            sid = new_submission_id()
            run_id = new_run_id(cls, sid)
            submissions.append((run_id, cls, time.time()))
            await submitter.submit_text(texts[cls], workspace=ws, submission_id=sid, name=cls)

    usage: list[float] = []

    async def sample() -> None:
        kv = await client.bus.kv("local_cluster")
        while True:
            await asyncio.sleep(1.0)
            try:
                snap = msgspec.json.decode((await kv.get("queues")).value)
                used = sum(q["used"].get("cpu", 0.0) for q in snap["queues"])
                usage.append(100.0 * used / (20 * COHORTS * CQS))
            except (nats.js.errors.KeyNotFoundError, TypeError):
                pass
            print(f"  t={time.time() - start:6.1f}s submitted {len(submissions):5d}/{total}"
                  f"  admitted {len(admitted):5d}"
                  f"  finished {len(finished):5d}  queues snapshot usage {usage[-1] if usage else 0:5.1f}%", flush=True)
            if stages:
                print("           " + "  ".join(f"{k.split('.')[-1]} {v:5d}" for k, v in reached.items()), flush=True)

    sampler = asyncio.create_task(sample())
    feeders = [feed(f"ws-{c}-{q}", cls) for c in range(COHORTS) for q in range(CQS) for cls in CLASSES]
    await asyncio.gather(*feeders)
    deadline = time.time() + timeout
    while not all(r in finished for r, _, _ in submissions) and time.time() < deadline:
        await asyncio.sleep(0.5)
    sampler.cancel()
    end = time.time()
    # Every run started counts: one never admitted waits until the bench gave up, one unfinished makes the
    # wall time the time the bench gave up, and two submissions that got one run id count as a lost run.
    done = all(r in finished for r, _, _ in submissions)
    wall = (max(finished.values(), default=start) if done else end) - start
    seen_wall = (max(seen_finished.values(), default=start) if done else end) - start
    by_class: dict[str, list[float]] = {c: [] for c in CLASSES}
    seen_by_class: dict[str, list[float]] = {c: [] for c in CLASSES}
    for run_id, cls, at in submissions:
        by_class[cls].append(admitted.get(run_id, end) - at)
        seen_by_class[cls].append(seen_admitted.get(run_id, end) - at)
    counts = await stored_per_type(client) if stages else {}
    await client.close()
    await submitter.close()
    # Usage is averaged over the busy period (until the last run finished), as Kueue's test reports it: the units
    # each run held from its admission to its end (a run never finished holds them until the bench gave up).
    units = {cls: CLASSES[cls][1] for cls in CLASSES}
    held = sum(units[cls] * (finished.get(run_id, end) - admitted[run_id])
               for run_id, cls, _ in submissions if run_id in admitted)
    usage_pct = 100.0 * held / (20 * COHORTS * CQS) / max(wall, 1e-9)
    seen_held = sum(units[cls] * (seen_finished.get(run_id, end) - seen_admitted[run_id])
                    for run_id, cls, _ in submissions if run_id in seen_admitted)
    seen_usage_pct = 100.0 * seen_held / (20 * COHORTS * CQS) / max(seen_wall, 1e-9)
    # What of that was the jobs' own work (units × duration): the rest is quota held while pods started and ended.
    work = sum(units[cls] * CLASSES[cls][2] for run_id, cls, _ in submissions if run_id in finished)
    work_pct = 100.0 * work / (20 * COHORTS * CQS) / max(wall, 1e-9)
    breakdown = {cls: {k: _mean([stage_times[r][k] - at for r, c, at in submissions
                                 if c == cls and k in stage_times.get(r, {})]) for k in STAGES}
                 for cls in CLASSES} if stages else {}
    return {"runs": len(submissions), "distinct": len({r for r, _, _ in submissions}), "breakdown": breakdown,
            "counts": counts,
            "admitted": sum(1 for r, _, _ in submissions if r in admitted),
            "finished": sum(1 for r, _, _ in submissions if r in finished), "wall_s": wall,
            "usage_pct": usage_pct, "work_pct": work_pct,
            **{c: _mean(v) for c, v in by_class.items()},
            "seen": {"wall_s": seen_wall, "usage_pct": seen_usage_pct,
                     **{c: _mean(v) for c, v in seen_by_class.items()}}}


async def stored_per_type(client: Client) -> dict[str, int]:
    """Messages stored per kind in the streams a run passes through (``run.*.*.<family>.<type>``,
    ``k8s.local.<kind>.*.*.<change>``, ``backend.local.<verb>``; the lane token dropped), most first."""
    counts: dict[str, int] = {}
    # The server lists at most 100,000 subjects per request: ask in slices that stay below it (a workspace's runs,
    # one kind of watched object).
    slices = [("RUNS", f"run.ws-{c}-{q}.>") for c in range(COHORTS) for q in range(CQS)]
    slices += [("K8S", f"k8s.local.{kind}.>") for kind in ("job", "workload", "pod")] + [("BACKEND", "backend.>")]
    for stream, subjects in slices:
        info = await client.bus.js.stream_info(stream, subjects_filter=subjects)
        for subject, n in (info.state.subjects or {}).items():
            parts = subject.split(".")
            kind = {"run": ".".join(parts[3:5]), "k8s": f"k8s.{parts[2]}.{parts[5] if len(parts) > 5 else ''}",
                    "backend": f"backend.{parts[2] if len(parts) > 2 else ''}"}.get(parts[0], parts[0])
            counts[kind] = counts.get(kind, 0) + n
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, default=1.0, help="share of Kueue's run counts (rates unchanged)")
    ap.add_argument("--scale", action="append", default=[], help="SERVICE=N replicas (repeatable)")
    ap.add_argument("--stages", action="store_true", help="print how many runs passed each stage, every second, "
                    "and at the end the mean time from submission to each stage per class")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for every run to finish")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs, the bus's store)")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-kueue-")
    with stack_up(data, env, tau, platform_yaml(), keep=args.keep,
                  up_args=tuple(a for s in args.scale for a in ("--scale", s))) as url:
        print(f"Kueue baseline scenario through the full pipeline, fraction {args.fraction:g} (data dir {data})",
              flush=True)
        user_creds = msgspec.json.decode((data / "stack.json").read_bytes())["user_creds"]
        cpu_before = cpu_seconds(data)
        result = asyncio.run(drive(url, args.fraction, creds=data / "creds" / "bootstrap.nk", user_creds=user_creds,
                                   stages=args.stages, timeout=args.timeout))
        cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_seconds(data).items()}
        memory = rss(data)
    runs = result["runs"]
    ok = result["finished"] == result["distinct"] == runs
    print("\nmetric                      taugrid      Kueue limit")
    print(f"runs started                {runs}")
    lost = "" if result["distinct"] == runs else "  LOST RUNS"
    print(f"distinct run ids            {result['distinct']}/{runs}{lost}")
    print(f"runs admitted               {result['admitted']}/{runs}")
    print(f"runs finished               {result['finished']}/{runs}{'' if result['finished'] == runs else '  MISSED'}")
    checks = [("wall time (s)", "wall_s", "≤"), ("avg ClusterQueue usage (%)", "usage_pct", "≥")]
    checks += [(f"mean time to admission {c:<6}", c, "≤") for c in ("large", "medium", "small")]
    for label, key, sense in checks:
        value, limit = float(result[key]), KUEUE_LIMITS[key]  # type: ignore[arg-type]
        met = value <= limit if sense == "≤" else value >= limit
        ok &= met
        print(f"{label:<28}{value:8.2f}    {sense} {limit:g}  {'ok' if met else 'MISSED'}")
    print(f"(of the quota, the jobs' own work (units x duration) used {float(result['work_pct']):.2f} %; the rest of"
          " the usage above is quota held from admission to the end by the cluster's clock: pods starting and "
          "ending, and admission cycles)")
    breakdown: dict[str, dict[str, float]] = result["breakdown"]  # type: ignore[assignment]
    if breakdown:  # where each class's time goes: mean seconds from submission to each stage's event (its ce-time)
        print("\nmean s from submission to " + "".join(f"{k.split('.')[-1]:>10}" for k in STAGES))
        for cls, row in breakdown.items():
            print(f"  {cls:<24}" + "".join(f"{row[k]:10.2f}" for k in STAGES))
    services = {k: v for k, v in memory.items() if k != "nats-server"}
    largest = max(services.values(), default=0.0)
    met = largest <= RSS_AIM_MB
    ok &= met
    print(f"{'largest service (MB)':<28}{largest:8.2f}    ≤ {RSS_AIM_MB:g}  {'ok' if met else 'MISSED'}"
          "  (issue 11's aim, resident memory after the scenario: " + ", ".join(
              f"{k} {v:.0f}" for k, v in sorted(memory.items(), key=lambda kv: -kv[1])) + ")")
    print("(CPU per run, ms, from the first submission to the last end, seals still under way not counted: "
          f"{1000 * sum(cpu.values()) / runs:.1f} in all; "
          + ", ".join(f"{k} {1000 * v / runs:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])
                      if 1000 * v / runs >= 0.05) + ")")
    counts: dict[str, int] = result["counts"]  # type: ignore[assignment]
    if counts:
        print("\nmessages stored per run, by kind: " + ", ".join(f"{k} {n / runs:.2f}" for k, n in counts.items()))
    seen: dict[str, float] = result["seen"]  # type: ignore[assignment]
    print(f"(as the bench saw the events arrive, after the admission watcher: wall {seen['wall_s']:.2f} s, usage "
          f"{seen['usage_pct']:.2f} %, mean time to admission large {seen['large']:.2f} s, medium "
          f"{seen['medium']:.2f} s, small {seen['small']:.2f} s)")
    print("(unadmitted runs count with their wait until the bench gave up; unfinished ones make the wall time "
          "the time it gave up)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
