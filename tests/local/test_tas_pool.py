"""Topology-aware placement that is real on the local pool (issue 24 items 3 and 5): four declared nodes in two
racks, a TAS flavor, real processes on a real bus. Pod i of a run that requires a rack runs on the node
admission placed rank i on, with that node's GPUs, and says so itself (``TAU_NODE_NAME``, ``TAU_RANK_NODES``,
``CUDA_VISIBLE_DEVICES``); the Workload records Kueue's v1beta2 ``topologyAssignment``, which the translator
turns into the run's admission event; a cordoned node leaves TAS capacity at once and an uncordon brings it
back."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from taugrid.bus.envelope import Event
from taugrid.core.contracts import AdmissionAdmitted, BackendApply, PodSetTopology, TopologyDomain, WatchEvent
from taugrid.health.wire import NodeCordon, NodeUncordon
from taugrid.kube.translate import translate
from taugrid.local.controller import LocalCluster
from tests.local.pools import pool_cluster, settle
from tests.local.test_controller import job, main
from tests.platforms import CPU_MEMORY, lab_platform, workspace

RACK = "cloud.provider.com/topology-rack"
HOST = "kubernetes.io/hostname"
NODES = (("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("b2", "r2"))
TAS_PLATFORM = lab_platform(
    quota={**CPU_MEMORY, "nvidia.com/gpu": "8"}, workspaces=[workspace(output_root="/tmp")],
    topologies=[{"name": "racks", "levels": [RACK, HOST]}],
    resource_flavors=[{"name": "default", "topology_name": "racks", "node_labels": {"taugrid.io/pool": "gpu"}}],
    local={"nodes": [{"name": name, "gpus": 2, "gpu_memory": "16000Mi", "cpus": 8, "memory": "16Gi",
                      "labels": {"taugrid.io/pool": "gpu", RACK: rack}} for name, rack in NODES]})
# Each pod says where it runs, as the script of a multi-node run would read it.
SAY = ["python3", "-c", "import json, os\nprint(json.dumps({k: os.environ.get(k) for k in ("
       "'JOB_COMPLETION_INDEX', 'TAU_NODE_NAME', 'TAU_RANK_NODES', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR')}))"]


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with pool_cluster(tmp_path, TAS_PLATFORM, name="tas-pool", drain_grace_s=1.0) as (_bus, cluster):
        yield cluster


def gang(name: str, command: list[str], *, pods: int, rack: bool) -> dict[str, Any]:
    """``pods`` pods of 2 GPUs each (a whole node apiece), requiring one rack when ``rack``."""
    container = main(command)
    container["resources"]["requests"]["nvidia.com/gpu"] = "2"
    manifest = job(name, container, pods=pods)
    if rack:
        manifest["spec"]["template"]["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    return manifest


async def submit(c: LocalCluster, name: str, manifest: dict[str, Any]) -> None:
    await c.apply(BackendApply(run_id=name[:-3], workspace="default", attempt=1, manifests=[manifest]))


def said(c: LocalCluster, name: str, pods: int) -> list[dict[str, str]]:
    """What each pod printed, by rank."""
    return [json.loads(c.kubelet.read_log(f"{name}-{i}", "main", final=True)[0][-1].text) for i in range(pods)]


def hold(until: Path) -> list[str]:
    """Run until the test says so, or 60 s (a failing test must not leave the process running for ever)."""
    return ["python3", "-c", f"import os, time\nend = time.time() + 60\n"
            f"while not os.path.exists({str(until)!r}) and time.time() < end: time.sleep(0.05)"]


def node_event(subject: str, payload: msgspec.Struct) -> Event:
    return Event(id=uuid.uuid4().hex, type=subject.rsplit(".", 1)[1], source="/svc/health-monitor",
                 subject=subject.split(".")[1], time="2026-12-01T00:00:00.000Z", data=msgspec.json.encode(payload),
                 nats_subject=subject)


async def test_each_rank_runs_on_the_node_its_placement_names_inside_one_rack(pool: LocalCluster,
                                                                               tmp_path: Path) -> None:
    c = pool
    release = tmp_path / "release"
    await submit(c, "busy-a1", gang("busy-a1", hold(release), pods=1, rack=False))
    await settle(c, lambda: [(p.node, p.phase) for p in c.wls["busy-a1"].pods] == [("a1", "Running")])
    # rack r1 has one free node left: a two-node run that must stay in one rack goes to r2, rank 0 on b1
    await submit(c, "rack-a1", gang("rack-a1", SAY, pods=2, rack=True))
    await settle(c, lambda: c.wls["rack-a1"].state == "running")
    wl = c.wls["rack-a1"]
    assert [(p.index, p.node, p.gpus, p.obj["spec"]["nodeName"]) for p in wl.pods] == [
        (0, "b1", [0, 1], "b1"), (1, "b2", [0, 1], "b2")]
    [assignment] = wl.workload["status"]["admission"]["podSetAssignments"]
    assert assignment["topologyAssignment"] == {  # Kueue v1beta2's compressed form, hostname level only
        "levels": [HOST], "slices": [{"domainCount": 2, "valuesPerLevel": [{"individual": {"prefix": "b",
                                                                                           "roots": ["1", "2"]}}],
                                      "podCounts": {"universal": 1}}]}
    [out] = translate(WatchEvent(type="MODIFIED", object=wl.workload))
    assert out.event_type == "admission.admitted"
    assert msgspec.convert(msgspec.to_builtins(out.payload), AdmissionAdmitted).topology == [
        PodSetTopology(pod_set="main", levels=[HOST], domains=[TopologyDomain(values=["b1"], count=1),
                                                               TopologyDomain(values=["b2"], count=1)])]
    await settle(c, lambda: "rack-a1" not in c.wls)
    assert said(c, "rack-a1", 2) == [
        {"JOB_COMPLETION_INDEX": "0", "TAU_NODE_NAME": "b1", "TAU_RANK_NODES": "b1,b2", "CUDA_VISIBLE_DEVICES": "0,1",
         "MASTER_ADDR": "127.0.0.1"},
        {"JOB_COMPLETION_INDEX": "1", "TAU_NODE_NAME": "b2", "TAU_RANK_NODES": "b1,b2", "CUDA_VISIBLE_DEVICES": "0,1",
         "MASTER_ADDR": "127.0.0.1"}]
    # the same run without the request takes what is free first, across racks (a2 in r1, then b1 in r2)
    await submit(c, "span-a1", gang("span-a1", SAY, pods=2, rack=False))
    await settle(c, lambda: "span-a1" not in c.wls)
    assert [(d["TAU_NODE_NAME"], d["TAU_RANK_NODES"]) for d in said(c, "span-a1", 2)] == [
        ("a2", "a2,b1"), ("b1", "a2,b1")]
    release.touch()
    await settle(c, lambda: not c.wls)


async def test_a_cordoned_node_leaves_tas_capacity_at_once_and_an_uncordon_brings_it_back(
        pool: LocalCluster, tmp_path: Path) -> None:
    c = pool
    release = tmp_path / "release"
    await c.on_node(node_event("node.a1.cordon", NodeCordon(node="a1", reason="XID 79")))
    # with a1 out, rack r1 holds one two-GPU pod: the rack run lands on r2 (it would take r1's a1 and a2 otherwise)
    await submit(c, "first-a1", gang("first-a1", hold(release), pods=2, rack=True))
    await settle(c, lambda: [p.node for p in c.wls["first-a1"].pods] == ["b1", "b2"])
    await submit(c, "second-a1", gang("second-a1", SAY, pods=2, rack=True))
    await settle(c, lambda: bool(c.wls["second-a1"].last_pending))
    # the cordoned node is not counted: three nodes, b1 and b2 without the GPUs, a2 alone in its rack
    assert (c.wls["second-a1"].state, c.wls["second-a1"].last_pending) == ("pending", (
        'WaitingForQuota|couldn\'t assign flavors to pod set main: topology "racks" allows to fit only 1 out of 2 '
        'pod(s). Total nodes: 3; excluded: resource "nvidia.com/gpu": 2|0'))
    await c.on_node(node_event("node.a1.uncordon", NodeUncordon(node="a1", reason="validated")))
    await settle(c, lambda: "second-a1" not in c.wls)
    assert [d["TAU_NODE_NAME"] for d in said(c, "second-a1", 2)] == ["a1", "a2"]
    release.touch()
    await settle(c, lambda: not c.wls)


async def test_consecutive_ranks_share_a_host_in_slices_of_two_each_on_its_own_gpu(pool: LocalCluster) -> None:
    """Four one-GPU pods in slices of two per host (``podset-slice-required-topology``): ranks 0-1 on one node,
    2-3 on the next, the two pods of a node on different GPUs of it."""
    c = pool
    container = main(SAY)
    container["resources"]["requests"]["nvidia.com/gpu"] = "1"
    manifest = job("sliced-a1", container, pods=4)
    manifest["spec"]["template"]["metadata"]["annotations"] = {
        "kueue.x-k8s.io/podset-slice-required-topology": HOST, "kueue.x-k8s.io/podset-slice-size": "2"}
    await submit(c, "sliced-a1", manifest)
    await settle(c, lambda: c.wls["sliced-a1"].state == "running")
    assert c.wls["sliced-a1"].workload["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"] == {
        "levels": [HOST], "slices": [{"domainCount": 2, "valuesPerLevel": [{"individual": {"prefix": "a",
                                                                                           "roots": ["1", "2"]}}],
                                      "podCounts": {"universal": 2}}]}
    await settle(c, lambda: "sliced-a1" not in c.wls)
    assert [(d["JOB_COMPLETION_INDEX"], d["TAU_NODE_NAME"], d["CUDA_VISIBLE_DEVICES"]) for d in said(
        c, "sliced-a1", 4)] == [("0", "a1", "0"), ("1", "a1", "1"), ("2", "a2", "0"), ("3", "a2", "1")]
    assert {d["TAU_RANK_NODES"] for d in said(c, "sliced-a1", 4)} == {"a1,a1,a2,a2"}


def test_the_local_workloads_topology_assignment_passes_kueues_workload_crd() -> None:
    """The admission the local cluster writes is valid v1beta2 (Kueue v0.19.2's CRD, ``deploy/crds``); a pod count
    of 0, which Kueue's schema refuses, is refused here too."""
    from taugrid.core.errors import PermanentError
    from taugrid.local import objects
    from taugrid.render.validate import validate

    owner = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default", "uid": "u1"}}
    wl = objects.workload(owner, uid="u2", queue="q", priority=0, priority_class="", at=0.0,
                          pod_sets=[{"name": "main", "count": 3, "template": {"spec": {"containers": [
                              {"name": "main"}]}}}])
    wl["spec"].pop("priorityClassName")  # the local Workload's one field the v1beta2 CRD lacks (docs §16)
    objects.admit(wl, cluster_queue="cq", flavors={"nvidia.com/gpu": "default"}, pod_counts={"main": 3}, at=1.0,
                  topology=[PodSetTopology(pod_set="main", levels=[HOST], domains=[
                      TopologyDomain(values=["b1"], count=1), TopologyDomain(values=["b2"], count=2)])])
    validate(wl)
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["slices"][0]["podCounts"] = {
        "individual": [0, 3]}
    with pytest.raises(PermanentError) as err:
        validate(wl)
    assert str(err.value).splitlines()[1:] == [
        "  - status.admission.podSetAssignments[0].topologyAssignment.slices[0].podCounts.individual[0]: 0 is less "
        "than the minimum of 1"]
