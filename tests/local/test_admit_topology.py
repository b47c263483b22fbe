"""The local backend's platform → engine translation for topology-aware scheduling (``local/admit.py``): the
platform's topologies, each flavor's topology name, the pool nodes' level labels (hostname: the node's name) and
each pod set's TAS request, read from the rendered pod template as Kueue's jobframework reads it."""

from __future__ import annotations

from typing import Any

from taugrid.config.platform import load_platform
from taugrid.core import admission as adm
from taugrid.core.contracts import ResolvedRun
from taugrid.local.admit import LocalAdmitter, Request, job_topology, pool_nodes, topology_request
from taugrid.render import render

GPU = "nvidia.com/gpu"
RACK = "cloud.provider.com/topology-rack"
BLOCK = "cloud.provider.com/topology-block"
HOST = "kubernetes.io/hostname"
TAS = "kueue.x-k8s.io/podset-"


def two_racks() -> str:
    nodes = "".join(
        f"    - {{name: {name}, gpus: 2, cpus: 16, memory: 64Gi, labels: {{taugrid.io/pool: gpu, {BLOCK}: b1, "
        f"{RACK}: {rack}}}}}\n"
        for name, rack in (("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("b2", "r2")))
    return f"""\
topologies:
  - name: racks
    levels: [{BLOCK}, {RACK}, {HOST}]
resource_flavors:
  - name: gpu
    topology_name: racks
    node_labels: {{taugrid.io/pool: gpu}}
cluster_queues:
  - name: team
    resource_groups:
      - covered_resources: [cpu, memory, {GPU}]
        flavors:
          - name: gpu
            resources:
              - {{name: cpu, nominal_quota: 64}}
              - {{name: memory, nominal_quota: 256Gi}}
              - {{name: {GPU}, nominal_quota: 8}}
local_queues:
  - {{name: q, namespace: team, cluster_queue: team}}
local:
  nodes:
{nodes}"""


def admitter() -> LocalAdmitter:
    la = LocalAdmitter(node="machine", capacity={"memory": 64 << 30})
    la.configure(load_platform(two_racks()))
    return la


def test_topologies_flavor_topology_names_and_node_levels_reach_the_engine() -> None:
    la = admitter()
    assert la.engine is not None
    assert la.engine.topologies == {"racks": adm.Topology("racks", (BLOCK, RACK, HOST))}
    assert la.engine.flavors["gpu"].topology_name == "racks"
    assert dict(la.pool[2].labels) == {"taugrid.io/pool": "gpu", BLOCK: "b1", RACK: "r2", HOST: "b1"}


def test_the_machine_alone_is_labelled_with_its_hostname() -> None:
    machine = LocalAdmitter(node="box", capacity={"memory": 1.0}).machine()
    assert [dict(n.labels) for n in pool_nodes(None, machine)] == [{HOST: "box"}]


def test_a_nodes_gpu_memory_is_its_models_unless_written() -> None:
    machine = LocalAdmitter(node="box", capacity={"memory": 1.0}).machine()
    p = load_platform("local:\n  nodes:\n    - {name: h200, gpus: 1, gpu_model: nvidia-h200}\n"
                      "    - {name: set, gpus: 1, gpu_model: nvidia-h200, gpu_memory: 40Gi}\n"
                      "    - {name: plain, gpus: 1}\n")
    assert [(n.name, n.gpu_memory_mb) for n in pool_nodes(p, machine)] == [
        ("h200", 141 * 1024), ("set", 40 * 1024), ("plain", 80 * 1024)]


def test_annotations_read_as_kueue_reads_them() -> None:
    assert topology_request({}) is None
    assert topology_request({f"{TAS}required-topology": RACK}) == adm.TopologyRequest(required=RACK)
    assert topology_request({f"{TAS}preferred-topology": RACK}) == adm.TopologyRequest(preferred=RACK)
    assert topology_request({f"{TAS}unconstrained-topology": "true"}) == adm.TopologyRequest(unconstrained=True)
    assert topology_request({f"{TAS}slice-required-topology": HOST, f"{TAS}slice-size": "2"}) == \
        adm.TopologyRequest(slice_required=HOST, slice_size=2)
    both = {f"{TAS}required-topology": BLOCK, f"{TAS}slice-required-topology": RACK, f"{TAS}slice-size": "2"}
    assert topology_request(both) == adm.TopologyRequest(required=BLOCK, slice_required=RACK, slice_size=2)
    assert topology_request(both, slices=False) == adm.TopologyRequest(required=BLOCK)


def run(**kw: Any) -> ResolvedRun:
    base: dict[str, Any] = dict(run_id="train-1", submission_id="s-1", workspace="ws", namespace="team",
                                name="train", entrypoint="train.py", local_queue="q", config_hash="h")
    return ResolvedRun(**{**base, **kw})


def test_a_rendered_job_and_rayjob_give_their_pod_sets_request() -> None:
    job = render(run(launcher="torchrun", nodes=4, topology_level=RACK, topology_slice_level=HOST,
                     topology_slice_size=2), attempt=0)[-1]
    assert job_topology(job) == adm.TopologyRequest(required=RACK, slice_required=HOST, slice_size=2)
    ray = render(run(engine="ray", workers=2, topology_level=RACK, topology_required=False,
                     topology_slice_level=HOST, topology_slice_size=2), attempt=0)[0]
    # one pod on this backend: inside one domain of every level, so the slices are met and not passed on
    assert job_topology(ray) == adm.TopologyRequest(preferred=RACK)
    assert job_topology(render(run(), attempt=0)[0]) is None


def test_a_request_carries_its_topology_into_the_engines_pod_set() -> None:
    la = admitter()
    req = Request("w", "team", 0, 0.0, 2, {GPU: 2.0}, topology=adm.TopologyRequest(required=RACK))
    assert la._workload(req).pod_sets[0].topology_request == adm.TopologyRequest(required=RACK)


def test_without_topologies_a_request_is_not_passed_to_the_engine() -> None:
    """No TAS flavor exists then: the local backend keeps its old answer (the request has no effect here)."""
    la = LocalAdmitter(node="machine", capacity={"memory": 64 << 30})
    text = two_racks()
    la.configure(load_platform(text[text.index("resource_flavors:"):].replace("    topology_name: racks\n", "")))
    req = Request("w", "team", 0, 0.0, 2, {GPU: 2.0}, topology=adm.TopologyRequest(required=RACK))
    assert la._workload(req).pod_sets[0].topology_request is None


def placed(la: LocalAdmitter) -> dict[str, list[str]]:
    return {g.name: g.nodes for g in la.cycle()}


def test_a_run_requiring_a_rack_gets_all_its_pods_on_one_racks_nodes() -> None:
    """a1 (rack r1) is taken; a two-pod run that must stay in one rack lands on r2's b1 and b2, where without the
    request the same run spans both racks (a2 and b1)."""
    la = admitter()
    la.submit(Request("one", "team", 0, 0.0, 1, {GPU: 2.0, "cpu": 1.0}))
    assert placed(la) == {"one": ["a1"]}
    la.submit(Request("rack", "team", 0, 1.0, 2, {GPU: 2.0, "cpu": 1.0}, topology=adm.TopologyRequest(required=RACK)))
    assert placed(la) == {"rack": ["b1", "b2"]}

    la = admitter()
    la.submit(Request("one", "team", 0, 0.0, 1, {GPU: 2.0, "cpu": 1.0}))
    placed(la)
    la.submit(Request("plain", "team", 0, 1.0, 2, {GPU: 2.0, "cpu": 1.0}))
    assert placed(la) == {"plain": ["a2", "b1"]}


def test_a_run_no_rack_can_hold_waits_saying_so() -> None:
    la = admitter()
    la.submit(Request("three", "team", 0, 0.0, 3, {GPU: 2.0, "cpu": 1.0},
                      topology=adm.TopologyRequest(required=RACK)))
    assert placed(la) == {}
    assert la.pending_all()["three"].reason == "TopologyPlacementFailed"
    assert la.pending_all()["three"].message == (
        'couldn\'t assign flavors to pod set main: topology "racks" allows to fit only 2 out of 3 pod(s)')


def test_slices_of_two_pods_each_share_a_host() -> None:
    la = admitter()
    la.submit(Request("sliced", "team", 0, 0.0, 4, {GPU: 1.0, "cpu": 1.0},
                      topology=adm.TopologyRequest(slice_required=HOST, slice_size=2)))
    # four one-GPU pods in slices of two per host: two hosts filled (BestFit, rack r1 first), never one per host
    assert placed(la) == {"sliced": ["a1", "a1", "a2", "a2"]}


def test_the_local_warning_names_the_topology_keys_only_without_platform_topologies() -> None:
    from taugrid.local.podspec import kubernetes_only

    pod = {"metadata": {"annotations": {f"{TAS}unconstrained-topology": "true",
                                        f"{TAS}slice-required-topology": HOST, f"{TAS}slice-size": "2"}},
           "spec": {"containers": [{"name": "main", "command": ["true"]}]}}
    assert kubernetes_only(pod) == ("policy.topology_policy, policy.topology_slice have no effect on the local "
                                    "backend (Kubernetes only)")
    assert kubernetes_only(pod, tas=True) == ""


def test_a_retry_that_excludes_a_node_takes_a_whole_rack_without_it() -> None:
    """A retry excludes a1 (where its last attempt failed): TAS leaves a1 out of the domains, so a run that must
    stay in one rack of two pods cannot take rack r1 (only a2 is left there) and lands on r2, not pending."""
    la = admitter()
    la.submit(Request("retry", "team", 0, 0.0, 2, {GPU: 2.0, "cpu": 1.0}, topology=adm.TopologyRequest(required=RACK),
                      excluded_nodes=("a1",)))
    assert placed(la) == {"retry": ["b1", "b2"]}

    la = admitter()
    la.submit(Request("both", "team", 0, 0.0, 2, {GPU: 2.0, "cpu": 1.0}, topology=adm.TopologyRequest(required=RACK),
                      excluded_nodes=("a1", "b1")))
    assert placed(la) == {}
    assert la.pending_all()["both"].reason == "TopologyPlacementFailed"
    assert la.pending_all()["both"].message == (
        'couldn\'t assign flavors to pod set main: topology "racks" allows to fit only 1 out of 2 pod(s)')


def test_pod_sets_without_excluded_nodes_share_one_empty_set() -> None:
    """A waiting workload's engine pod set holds no set of its own when it excludes no node (a new empty frozenset
    is 216 bytes, kept while it waits: issue 27); a retry's excluded nodes are its own."""
    la = admitter()
    plain = [la._workload(Request(n, "team", 0, 0.0, 1, {"cpu": 1.0})).pod_sets[0].excluded_nodes for n in "ab"]
    assert plain[0] == frozenset() and plain[0] is plain[1]
    retry = la._workload(Request("r", "team", 0, 0.0, 1, {"cpu": 1.0}, excluded_nodes=("a1",)))
    assert retry.pod_sets[0].excluded_nodes == frozenset({"a1"})
