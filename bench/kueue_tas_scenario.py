"""Kueue's TAS scheduler-performance scenario, replayed through the whole taugrid pipeline.

The configuration is Kueue's ``test/performance/scheduler/configs/tas`` (``kueue_tas_shape`` says where it was
read and gives every figure): 640 nodes in 1 block x 10 racks x 64 hosts, one TAS flavor, 5 cohorts x 6
ClusterQueues, per queue nine classes (small, medium and large workloads of 2, 4 and 8 pods, each asking for one
rack as required, preferred, or slices required within a rack), 15,000 workloads in all.

Here the embedded stack (nats-server, every service its own process) runs the local cluster with simulated pods
(a pod completes after ``SIMULATED_DURATION``, no process spawned, as Kueue's runner mimics its jobs). The
platform declares the topology, the flavor (``topology_name``) and the 640 nodes as ``local.nodes`` carrying the
block and rack labels; each run is a ``tau.yaml`` with ``execution.nodes`` pods (torchrun, so a multi-pod Job),
``compute.cpu_request`` per pod and ``policy.topology`` + ``policy.topology_policy`` (required, preferred) or
``policy.topology_slice`` (Kueue's balanced class: slice-required topology and slice size). Runs are submitted
through the client at Kueue's cadence, each class on its own clock, the first one interval after the start.

Measured by the cluster's clock (each event's ``ce-time``, as ``kueue_scenario.py`` measures the baseline; the
local cluster stamps an admission's events with the admission's time and a simulated run's end events with the
time it found the pods ended and released the quota, since both are reported a save and round trips later):
wall time from the first submission to the last run's end; usage = cpu each run held from each admission to its
preemption or its end, summed, over the 30 queues' nominal quota times the wall (Kueue's checker: admitted cpu
integrated over time over nominal quota times the monitored time); mean time to admission per class, from the
submission to the run's last admission (Kueue's recorder times the Admitted condition's last transition, so a
preempted and re-admitted workload counts to its re-admission; ``kueue_scenario.py`` takes the first). Every run
started counts: one never admitted counts with its wait until the bench gave up. Printed beside, not judged: the
mean time to admission to when this bench heard each admission event (Kueue's recorder times what it observes;
here that includes the admission watcher's backlog).

Placement (``kueue_tas_checks``): each admitted run's last admission event must carry a topology assignment that
holds all its pods and keeps its request (every pod in one rack for a required class; whole slices in each rack
for a balanced class), and each pod (of the last attempt; its node and completion index from the gang its first
rank's ``exec.running`` lists, or from the pod the local cluster published, ``k8s.local.pod.*.*.added``) must run
on the node its rank was assigned; anything else is a
violation. How often a *preferred* run spread over racks, and how often a balanced run's consecutive-rank slice
did not share a rack, are printed beside.

Exits 1 when any of Kueue's limits is missed, a placement violates its request, a run did not finish, or two
submissions got one run id. ``--fraction 0.1`` shrinks the counts (not the cadence) for a quick look.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
from kueue_tas_checks import Heard, check  # bench/ is this script's directory, first on sys.path
from kueue_tas_shape import (
    BLOCK_LABEL,
    BORROWING_LIMIT_CPU,
    CLASSES,
    FLAVOR,
    HOSTNAME_LABEL,
    NODE_CPU,
    NODE_GROUP,
    NODE_MEMORY_GI,
    NOMINAL_CPU,
    RACK_LABEL,
    TOPOLOGY,
    USAGE_LIMIT_PCT,
    WALL_LIMIT_S,
    TasClass,
    count,
    mean,
    nodes,
    nominal_cpu,
    queue_names,
)
from pipeline import cpu_seconds, rss, simulated_stack, stack_up

from taugrid.client import open_client
from taugrid.core.ids import new_run_id, new_submission_id

TERMINAL = ("exec.succeeded", "recovery.gave_up", "submit.rejected", "policy.rejected", "exec.cancelled")


def platform_yaml() -> str:
    lines = [f"topologies: [{{name: {TOPOLOGY}, levels: [{BLOCK_LABEL}, {RACK_LABEL}, {HOSTNAME_LABEL}]}}]",
             f"resource_flavors: [{{name: {FLAVOR}, node_labels: {{{NODE_GROUP[0]}: {NODE_GROUP[1]}}}, "
             f"topology_name: {TOPOLOGY}}}]",
             "cohorts:"]
    lines += [f"  - {{name: {c}}}" for c in sorted({c for c, _ in queue_names()})]
    lines.append("cluster_queues:")
    for cohort, cq in queue_names():
        lines += [
            f"  - name: {cq}", f"    cohort: {cohort}",
            "    preemption: {within_cluster_queue: LowerPriority, reclaim_within_cohort: Any}",
            "    resource_groups:", "      - covered_resources: [cpu, memory]", "        flavors:",
            f"          - name: {FLAVOR}", "            resources:",
            f'              - {{name: cpu, nominal_quota: "{NOMINAL_CPU}", borrowing_limit: "{BORROWING_LIMIT_CPU}"}}',
            '              - {name: memory, nominal_quota: "1000Gi"}',
        ]
    lines.append("local_queues:")
    lines += [f"  - {{name: l{cq}, namespace: default, cluster_queue: {cq}}}" for _, cq in queue_names()]
    prios = sorted({c.priority for c in CLASSES})
    lines += ["priority_classes: [" + ", ".join(f"{{name: p{p}, value: {p}}}" for p in prios) + "]",
              "compute_profiles: [{name: unit, cpu: '1', memory: 1Mi}]", "workspaces:"]
    lines += [f"  - {{name: ws-{cq}, namespace: default, local_queue: l{cq}, default_profile: unit, "
              f"default_priority: p{prios[0]}, submissions_per_minute: 0}}" for _, cq in queue_names()]
    lines += ["local:", "  nodes:"]
    lines += [f"    - {{name: {n.name}, cpus: '{NODE_CPU}', memory: {NODE_MEMORY_GI}Gi, labels: "
              f"{{{NODE_GROUP[0]}: {NODE_GROUP[1]}, {BLOCK_LABEL}: {n.block}, {RACK_LABEL}: {n.rack}}}}}"
              for n in nodes()]
    return "\n".join(lines) + "\n"


def run_yaml(cls: TasClass) -> str:
    if cls.constraint == "balanced":
        topology = f"topology_slice: {{level: {RACK_LABEL}, size: {cls.slice_size}}}"
    else:
        topology = f"topology: {RACK_LABEL}, topology_policy: {cls.constraint}"
    return (f"name: {cls.name}\nentrypoint: sim.py\n"
            f"compute: {{gpus: 0, cpu_request: '{cls.cpu:g}', memory_request: 1Mi}}\n"
            f"execution: {{launcher: torchrun, nodes: {cls.pods}}}\n"
            f"policy: {{workload_priority_class: {cls.priority_class}, {topology}}}\n"
            f"runtime: {{env: {{SIMULATED_DURATION: '{cls.seconds:g}'}}}}\n")


@dataclass
class Outcome:
    runs: int
    distinct: int  # distinct run ids among the submissions (fewer: two submissions got one id)
    admitted: int
    finished: int
    wall_s: float
    usage_pct: float
    work_pct: float  # the jobs' own work (cpu x duration) over the quota and the wall
    late_s: float  # how far the submissions fell behind Kueue's cadence, at most
    submitted_s: float  # when the last run was submitted
    classes: dict[str, float]  # mean time to admission per class
    heard: dict[str, float]  # the same, to when the bench heard the admission (through the admission watcher)
    violations: dict[str, int]  # per class, runs placed against their request
    spread: dict[str, int]  # per preferred class, runs over more than one rack
    split: dict[str, int]  # per balanced class, runs with a consecutive-index slice in two racks
    examples: list[str]


async def drive(url: str, fraction: float, *, creds: Path, user_creds: str, timeout: float) -> Outcome:
    client = await open_client(url, creds=creds)  # the bootstrap identity sees every run's events
    submitter = await open_client(url, creds=user_creds)  # the stack's owner, a platform user, submits
    nc = client.bus.nc
    submissions: list[tuple[str, TasClass, float, float]] = []  # (run id, class, when submitted, when scheduled)
    heard = Heard()
    await nc.subscribe("run.*.*.admission.admitted", cb=heard.on_admitted)
    await nc.subscribe("run.*.*.admission.preempted", cb=heard.on_preempted)
    for t in TERMINAL:
        await nc.subscribe(f"run.*.*.{t}", cb=heard.on_terminal)
    for subject in ("k8s.local.pod.*.*.added", "k8s.local.pod.*.*.added.*"):
        await nc.subscribe(subject, cb=heard.on_pod)
    await nc.subscribe("run.*.*.exec.running", cb=heard.on_running)  # a gang's pods, listed by its first rank
    texts = {cls.name: run_yaml(cls) for cls in CLASSES}
    total = sum(count(cls, fraction) for cls in CLASSES) * len(queue_names())
    start = time.time()

    async def feed(cq: str, cls: TasClass) -> None:
        for i in range(count(cls, fraction)):
            due = start + (i + 1) * cls.every  # Kueue's generator waits one interval before each creation
            await asyncio.sleep(max(0.0, due - time.time()))
            sid = new_submission_id()
            submissions.append((new_run_id(cls.name, sid), cls, time.time(), due))
            await submitter.submit_text(texts[cls.name], workspace=f"ws-{cq}", submission_id=sid, name=cls.name)

    async def progress() -> None:
        while True:
            await asyncio.sleep(2.0)
            print(f"  t={time.time() - start:6.1f}s submitted {len(submissions):5d}/{total}  admitted "
                  f"{len(heard.admissions):5d}  finished {len(heard.finished):5d}", flush=True)

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(feed(cq, cls) for _, cq in queue_names() for cls in CLASSES))
    deadline = time.time() + timeout
    while not all(r in heard.finished for r, *_ in submissions) and time.time() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # the last pods' events, published before their runs' ends, are in
    reporter.cancel()
    end = time.time()
    finished = heard.finished
    done = all(r in finished for r, *_ in submissions)
    wall = (max(finished.values(), default=start) if done else end) - start
    held = sum(cls.units * heard.held_s(r, end) for r, cls, _, _ in submissions)
    rack_of = {n.name: n.rack for n in nodes()}
    violations: dict[str, int] = {}
    spread: dict[str, int] = {}
    split: dict[str, int] = {}
    examples: list[str] = []
    for run_id, cls, _, _ in submissions:
        if heard.admitted_at(run_id) is None:
            continue
        verdict = check(cls, heard.topology(run_id), heard.last_pods(run_id), rack_of)
        spread[cls.name] = spread.get(cls.name, 0) + verdict.spread
        split[cls.name] = split.get(cls.name, 0) + verdict.split
        if verdict.violation:
            violations[cls.name] = violations.get(cls.name, 0) + 1
            if len(examples) < 5:
                examples.append(f"{run_id} ({cls.name}): {verdict.violation}")
    await client.close()
    await submitter.close()
    return Outcome(
        runs=len(submissions), distinct=len({r for r, *_ in submissions}),
        admitted=sum(1 for r, *_ in submissions if heard.admitted_at(r) is not None),
        finished=sum(1 for r, *_ in submissions if r in finished),
        wall_s=wall, usage_pct=100.0 * held / nominal_cpu() / max(wall, 1e-9),
        work_pct=100.0 * sum(cls.units * cls.seconds for r, cls, _, _ in submissions if r in finished)
        / nominal_cpu() / max(wall, 1e-9),
        late_s=max((at - due for _, _, at, due in submissions), default=0.0),
        submitted_s=max((at for _, _, at, _ in submissions), default=start) - start,
        classes={cls.name: mean([(heard.admitted_at(r) or end) - at for r, c, at, _ in submissions if c is cls])
                 for cls in CLASSES},
        heard={cls.name: mean([heard.heard.get(r, end) - at for r, c, at, _ in submissions if c is cls])
               for cls in CLASSES},
        violations=violations, spread=spread, split=split, examples=examples,
    )


def report(r: Outcome, memory: dict[str, float], cpu: dict[str, float]) -> bool:
    ok = r.finished == r.distinct == r.runs
    print("\nmetric                                   taugrid      Kueue limit")
    print(f"runs started                             {r.runs}  (the last submitted at {r.submitted_s:.1f} s, "
          f"at most {r.late_s:.2f} s behind Kueue's cadence)")
    lost = "" if r.distinct == r.runs else "  LOST RUNS"
    print(f"distinct run ids                         {r.distinct}/{r.runs}{lost}")
    print(f"runs admitted                            {r.admitted}/{r.runs}")
    unfinished = "" if r.finished == r.runs else "  MISSED"
    print(f"runs finished                            {r.finished}/{r.runs}{unfinished}")
    rows = [("wall time (s)", r.wall_s, "≤", WALL_LIMIT_S),
            ("avg ClusterQueue usage (%)", r.usage_pct, "≥", USAGE_LIMIT_PCT)]
    rows += [(f"mean time to admission {cls.name}", r.classes[cls.name], "≤", cls.limit_s) for cls in CLASSES]
    for label, value, sense, limit in rows:
        met = value <= limit if sense == "≤" else value >= limit
        ok &= met
        print(f"{label:<41}{value:8.2f}    {sense} {limit:g}  {'ok' if met else 'MISSED'}")
    print("(mean time to admission as this bench heard each admission, through the admission watcher: "
          + ", ".join(f"{c.name} {r.heard[c.name]:.1f}" for c in CLASSES) + ")")
    print(f"(of the quota, the jobs' own work (cpu x duration) used {r.work_pct:.2f} %; the rest of the usage is "
          "quota held from admission to the end: pods starting and ending, admission cycles)")
    ok &= not r.violations
    print(f"{'topology violations':<41}{sum(r.violations.values()):8d}    = 0  {'ok' if not r.violations else 'MISSED'}"
          + (f"  {r.violations}" if r.violations else ""))
    for e in r.examples:
        print(f"    {e}")
    print("(preferred runs spread over more than one rack: "
          + ", ".join(f"{c.name} {r.spread.get(c.name, 0)}" for c in CLASSES if c.constraint == "preferred")
          + "; balanced runs with a consecutive-index slice split across racks: "
          + ", ".join(f"{c.name} {r.split.get(c.name, 0)}" for c in CLASSES if c.constraint == "balanced") + ")")
    print("(resident memory after the scenario, MB: " + ", ".join(
        f"{k} {v:.0f}" for k, v in sorted(memory.items(), key=lambda kv: -kv[1])) + ")")
    runs = max(r.runs, 1)
    print(f"(CPU per run, ms: {1000 * sum(cpu.values()) / runs:.1f} in all; " + ", ".join(
        f"{k} {1000 * v / runs:.1f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])
        if 1000 * v / runs >= 0.05) + ")")
    return ok


async def node_messages(url: str, creds: Path) -> int:
    """Messages the NODES stream has taken so far (its last sequence): the node agents' samples, mostly."""
    client = await open_client(url, creds=creds)
    try:
        info = await client.bus.js.stream_info("NODES")
        return int(info.state.last_seq)
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, default=1.0, help="share of Kueue's run counts (cadence unchanged)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for every run to finish")
    ap.add_argument("--keep", action="store_true", help="keep the data directory (service logs, the bus's store)")
    args = ap.parse_args()
    data, env, tau = simulated_stack("tau-bench-kueue-tas-")
    with stack_up(data, env, tau, platform_yaml(), keep=args.keep) as url:
        print(f"Kueue TAS scenario through the full pipeline, fraction {args.fraction:g}, 640 simulated nodes "
              f"(data dir {data})", flush=True)
        user_creds = msgspec.json.decode((data / "stack.json").read_bytes())["user_creds"]
        cpu_before = cpu_seconds(data)
        nodes_before, started = asyncio.run(node_messages(url, data / "creds" / "bootstrap.nk")), time.monotonic()
        result = asyncio.run(drive(url, args.fraction, creds=data / "creds" / "bootstrap.nk",
                                   user_creds=user_creds, timeout=args.timeout))
        cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_seconds(data).items()}
        nodes = asyncio.run(node_messages(url, data / "creds" / "bootstrap.nk")) - nodes_before
        elapsed = time.monotonic() - started
        memory = rss(data)
    ok = report(result, memory, cpu)
    print(f"NODES: {nodes} message(s) stored while the runs went through, {nodes / max(elapsed, 1e-9):.1f} a second "
          f"(640 nodes' samples and heartbeats, and any health decision)")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
