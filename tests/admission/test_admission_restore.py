"""Restoring already-admitted workloads with their flavor assignment and GPU devices, and unknown flavors."""

from __future__ import annotations

import pytest
from adm_build import cq, wl

from taugrid.core.admission import GPU, Engine, GpuDevice, Node, ResourceFlavor
from taugrid.core.admission import results as R
from taugrid.core.errors import PermanentError
from taugrid.local.admit import LocalAdmitter, Request


def _node() -> Node:
    return Node("n0", tuple(GpuDevice(i) for i in range(4)), cpu=64, memory=1e12)


def test_restored_workload_keeps_its_gpus_and_quota() -> None:
    e = Engine([cq("team", gpu=4)], flavors=[ResourceFlavor("default")], nodes=[_node()])
    adm = e.restore(wl("old", "team", gpu=2), [{GPU: "default"}], 5.0, gpus=[[2, 3]])
    assert adm.placements[0].gpus == (2, 3) and adm.admitted_at == 5.0
    assert e.usage("team") == {("default", GPU): 2000}
    e.submit(wl("new", "team", gpu=2), 6.0)
    res = e.cycle(6.0)
    assert [a.workload for a in res.admitted] == ["new"]
    assert res.admitted[0].placements[0].gpus == (0, 1)
    e.submit(wl("more", "team", gpu=1), 7.0)
    e.cycle(7.0)
    assert e.pending_info("more").reason == R.WAITING_FOR_QUOTA  # type: ignore[union-attr]


def test_restore_refuses_an_unknown_flavor() -> None:
    e = Engine([cq("team", gpu=4)], flavors=[ResourceFlavor("default")])
    with pytest.raises(PermanentError,
                       match=r"flavor 'spot', which is not a known ResourceFlavor; use one of \['default'\]"):
        e.restore(wl("old", "team", gpu=1), [{GPU: "spot"}], 0.0)


def test_a_cluster_queue_naming_an_unknown_flavor_is_inactive() -> None:
    e = Engine([cq("team", flavors={"ghost": {GPU: 4}})], flavors=[ResourceFlavor("default")])
    e.submit(wl("a", "team", gpu=1), 0.0)
    res = e.cycle(0.0)
    assert res.admitted == []
    info = e.pending_info("a")
    assert info is not None and info.reason == R.INADMISSIBLE
    assert info.message.startswith("ClusterQueue team is inactive: flavor(s) ghost not found")


def test_local_admitter_restores_running_work_on_the_same_gpus() -> None:
    from taugrid.config.platform import Platform
    p = Platform.model_validate({
        "resource_flavors": [{"name": "default"}],
        "cluster_queues": [{"name": "team", "resource_groups": [{"covered_resources": [GPU], "flavors": [
            {"name": "default", "resources": [{"name": GPU, "nominal_quota": 4}]}]}]}],
        "local_queues": [{"name": "q", "namespace": "ns", "cluster_queue": "team"}],
    })
    la = LocalAdmitter(node="n0", capacity={"memory": 1e12}, gpu_count=4)
    la.configure(p)
    running = Request("old", "team", 0, 0.0, 1, {GPU: 2}, flavors={GPU: "default"}, gpus=[[1, 3]])
    la.rebuild([running], [Request("new", "team", 0, 1.0, 1, {GPU: 2})])
    granted = la.cycle()
    assert [(g.name, g.gpus) for g in granted] == [("new", [[0, 2]])]
