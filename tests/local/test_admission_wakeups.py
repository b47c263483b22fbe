"""The local cluster, real bus, simulated pods: capacity a simulated run frees at its end is admitted in the same
pass that notices the end, before that run's end is reported. Under load each report is a bus round trip and the
pass holds the cluster's lock for all of them (every pod's end, the Job's and the Workload's, the save), with the
next passes queued behind it: admission waited for all of that while the quota stood free (Kueue's TAS scenario
through the pipeline: a batch of 30 large runs every ~4 s where 1 s of runtime allows one a second). The ends
are reported as of the release; an apply waits on the lock only to read a platform revision it names."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import platformstore
from taugrid.core.contracts import BackendApply
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster, settle

RACK = "cloud.provider.com/topology-rack"
NODES = "".join(f"    - {{name: n{r}{i}, cpus: '4', memory: 8Gi, labels: {{pool: t, {RACK}: r{r}}}}}\n"
                for r in range(2) for i in range(2))
# One queue whose quota holds one two-pod run at a time: the second waits for the first's end.
PLATFORM = f"""\
topologies:
  - {{name: racks, levels: [{RACK}, kubernetes.io/hostname]}}
resource_flavors:
  - {{name: t, topology_name: racks, node_labels: {{pool: t}}}}
cluster_queues:
  - name: team
    resource_groups:
      - covered_resources: [cpu, memory]
        flavors:
          - name: t
            resources:
              - {{name: cpu, nominal_quota: 2}}
              - {{name: memory, nominal_quota: 8Gi}}
local_queues:
  - {{name: default, namespace: default, cluster_queue: team}}
workspaces:
  - {{name: default, namespace: default, local_queue: default, output_root: /tmp}}
local:
  nodes:
{NODES}"""


def rack_job(name: str) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11-slim", "command": ["true"],
                 "env": [{"name": "SIMULATED_DURATION", "value": "600"}],
                 "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kueue.x-k8s.io/queue-name": "default", "taugrid.io/run-id": name[:-3],
                                    "taugrid.io/workspace": "default", "taugrid.io/attempt": "1"}},
            "spec": {"suspend": True, "backoffLimit": 0, "completions": 2, "parallelism": 2,
                     "completionMode": "Indexed",
                     "template": {"metadata": {"labels": {}, "annotations": {
                         "kueue.x-k8s.io/podset-required-topology": RACK}},
                                  "spec": {"restartPolicy": "Never", "subdomain": f"{name}-headless",
                                           "containers": [container]}}}}


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalCluster]:
    monkeypatch.setenv("TAU_LOCAL_SIMULATE", "1")
    async with pool_cluster(tmp_path, PLATFORM, name="wakeups") as (_bus, c):
        yield c


@pytest.mark.parametrize("noticed_by", ["the simulated ends' pass", "housekeeping"])
async def test_a_simulated_end_admits_the_waiting_tas_head_before_its_reports(cluster: LocalCluster,
                                                                              noticed_by: str) -> None:
    c = cluster
    for name in ("first-a1", "second-a1"):
        await c.apply(BackendApply(run_id=name[:-3], workspace="default", attempt=1, manifests=[rack_job(name)]))
    await settle(c, lambda: c.wls["first-a1"].state == "running" and all(p.added for p in c.wls["first-a1"].pods))
    assert c.wls["second-a1"].state == "pending"  # the quota holds one run: the TAS head is parked
    order: list[str] = []
    publish = c.publish

    async def recording(wl: Any, kind: str, obj: dict[str, Any], change: str, *, at: float = 0.0) -> None:
        order.append(f"{wl.name} {kind} {change}")
        await publish(wl, kind, obj, change, at=at)

    c.publish = recording  # type: ignore[method-assign]
    for p in c.wls["first-a1"].pods:
        p.sim_end = time.time() - 1.0  # its pods' runtime is over
    if noticed_by == "housekeeping":
        await c.housekeep()
    else:
        await c._supervise_due(["first-a1"])  # as its timer runs it
    # no admission cycle ran but the one these ran
    assert "first-a1" not in c.wls  # ended and reported
    second = c.wls["second-a1"]
    assert second.state == "running"
    assert sorted(p.node[:2] for p in second.pods) in (["n0", "n0"], ["n1", "n1"])  # one rack, as required
    # its admission went out before the first run's end was reported: its Job's Complete alone (issue 30: a Job's
    # simulated pods' ends are not published, nor the Workload's Finished away from a site)
    assert order.index("second-a1 Workload modified") < order.index("first-a1 Job modified")
    assert [o for o in order if o.startswith("first-a1")] == ["first-a1 Job modified"]


async def test_an_apply_resolved_against_a_newer_platform_revision_is_admitted_under_it(
        cluster: LocalCluster) -> None:
    """The cluster reads the platform at most once a second; a run the policy resolved against a revision
    applied since (an admin's apply, then at once a researcher's run) makes it read the platform first, so the run
    lands on the nodes of its own revision (here rack r0's nodes are gone), never on a removed one."""
    c = cluster
    await c.refresh_platform()  # checked just now: the next look-up would be a second away
    old = c.platform_rev
    without_r1 = "".join(line for line in PLATFORM.splitlines(keepends=True) if "r0}" not in line)
    newer = await platformstore.put_text(c.bus, without_r1)
    assert newer > old and c.platform_rev == old
    await c.apply(BackendApply(run_id="fresh", workspace="default", attempt=1, manifests=[rack_job("fresh-a1")],
                               platform_revision=newer))
    assert c.platform_rev == newer
    await settle(c, lambda: c.wls["fresh-a1"].state == "running" and all(p.node for p in c.wls["fresh-a1"].pods))
    assert {p.node for p in c.wls["fresh-a1"].pods} <= {"n10", "n11"}  # rack r1, the one left


async def test_a_simulated_runs_end_is_reported_as_of_the_release_of_its_quota(cluster: LocalCluster) -> None:
    """The pass that finds a run's simulated pods ended releases its quota and admits the waiting head before it
    reports the end; the end's events say when the capacity was freed (their ce-time), not when they went out,
    and the admission it allowed is stamped after it."""
    c = cluster
    for name in ("first-a1", "second-a1"):
        await c.apply(BackendApply(run_id=name[:-3], workspace="default", attempt=1, manifests=[rack_job(name)]))
    await settle(c, lambda: c.wls["first-a1"].state == "running" and all(p.added for p in c.wls["first-a1"].pods))
    sent: list[tuple[str, float]] = []  # (workload kind change, the change's time as published)
    publish = c.publish

    async def recording(wl: Any, kind: str, obj: dict[str, Any], change: str, *, at: float = 0.0) -> None:
        sent.append((f"{wl.name} {kind} {change}", at or time.time()))
        await publish(wl, kind, obj, change, at=at)

    c.publish = recording  # type: ignore[method-assign]
    for p in c.wls["first-a1"].pods:
        p.sim_end = time.time() - 1.0
    before = time.time()
    await c._supervise_due(["first-a1"])  # as its timer runs it
    assert "first-a1" not in c.wls and c.wls["second-a1"].state == "running"
    times = dict(sent)
    ends = ["first-a1 Job modified"]  # its pods' and its Workload's ends are not published (issue 30)
    released = times[ends[0]]
    assert before <= released and all(times[e] == released for e in ends)  # one moment: the release
    assert times["second-a1 Workload modified"] >= released  # the admission it allowed came after
    order = [k for k, _ in sent]
    assert order.index("second-a1 Workload modified") < order.index("first-a1 Job modified")  # and went out first


async def test_an_apply_does_not_wait_on_the_lock_for_the_periodic_platform_read(cluster: LocalCluster) -> None:
    """A run resolved against the revision the cluster holds is applied while another pass holds the lock, though
    the periodic read is due (housekeeping makes it, under its own lock)."""
    c = cluster
    await c.lock.acquire()
    try:
        c._platform_checked = 0.0  # a read is due
        await asyncio.wait_for(c.apply(BackendApply(run_id="third", workspace="default", attempt=1,
                                                    manifests=[rack_job("third-a1")],
                                                    platform_revision=c.platform_rev)), timeout=10)
        assert c.wls["third-a1"].state == "pending"
    finally:
        c.lock.release()
