"""Kueue TAS in what ``render`` emits: ``Topology`` objects and ``ResourceFlavor.spec.topologyName`` from the
platform (valid against Kueue's v0.19.2 CRDs in deploy/crds), and the podset topology annotations on the Job's pod
template and a RayJob's groups (the slice pair on the workers only, never on the one-pod head)."""

from __future__ import annotations

from typing import Any

import pytest

from taugrid.config.platform import load_platform
from taugrid.core.contracts import ResolvedRun
from taugrid.core.errors import PermanentError
from taugrid.render import render, validate
from taugrid.render.kueue import render_platform

PLATFORM = load_platform("""\
topologies:
  - name: racks
    levels: [cloud.provider.com/topology-block, cloud.provider.com/topology-rack, kubernetes.io/hostname]
resource_flavors:
  - name: gpu
    topology_name: racks
    node_labels: {taugrid.io/pool: gpu}
  - name: cpu
    node_labels: {taugrid.io/pool: cpu}
""")
TAS = "kueue.x-k8s.io/podset-"


def test_topologies_render_first_as_kueue_topology_objects_and_validate() -> None:
    objs = render_platform(PLATFORM)
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("Topology", "racks"), ("ResourceFlavor", "gpu"), ("ResourceFlavor", "cpu")]
    for o in objs:
        validate(o)
    assert objs[0] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
        "metadata": {"name": "racks", "labels": {"taugrid.io/managed-by": "taugrid"}},
        "spec": {"levels": [{"nodeLabel": "cloud.provider.com/topology-block"},
                            {"nodeLabel": "cloud.provider.com/topology-rack"},
                            {"nodeLabel": "kubernetes.io/hostname"}]}}
    assert objs[1]["spec"] == {"nodeLabels": {"taugrid.io/pool": "gpu"}, "topologyName": "racks"}
    assert "topologyName" not in objs[2]["spec"]


def test_the_topology_crd_is_kueues_schema() -> None:
    """A field the CRD does not have is refused, so a Topology is checked by the real schema, not passed through."""
    topology = render_platform(PLATFORM)[0]
    topology["spec"]["levels"][0]["label"] = "x"
    with pytest.raises(PermanentError, match=r"spec\.levels\[0\]\.label: unknown field"):
        validate(topology)


def run(**kw: Any) -> ResolvedRun:
    base: dict[str, Any] = dict(run_id="train-1", submission_id="s-1", workspace="ws", namespace="team",
                                name="train", entrypoint="train.py", local_queue="q", config_hash="h")
    return ResolvedRun(**{**base, **kw})


def tas(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k.startswith(TAS)}


def test_a_job_carries_the_required_level_and_its_slices() -> None:
    manifests = render(run(launcher="torchrun", nodes=4, topology_level="cloud.provider.com/topology-rack",
                           topology_slice_level="kubernetes.io/hostname", topology_slice_size=2), attempt=0)
    for m in manifests:
        validate(m)
    job = manifests[-1]
    assert tas(job["spec"]["template"]["metadata"]["annotations"]) == {
        f"{TAS}required-topology": "cloud.provider.com/topology-rack",
        f"{TAS}slice-required-topology": "kubernetes.io/hostname",
        f"{TAS}slice-size": "2"}
    assert tas(job["metadata"]["annotations"]) == {}  # Kueue reads them on the pod template only


def test_preferred_and_unconstrained() -> None:
    preferred = render(run(topology_level="cloud.provider.com/topology-rack", topology_required=False), attempt=0)
    assert tas(preferred[0]["spec"]["template"]["metadata"]["annotations"]) == {
        f"{TAS}preferred-topology": "cloud.provider.com/topology-rack"}
    loose = render(run(topology_unconstrained=True), attempt=0)
    validate(loose[0])
    assert tas(loose[0]["spec"]["template"]["metadata"]["annotations"]) == {f"{TAS}unconstrained-topology": "true"}


def test_a_rayjob_slices_its_workers_not_its_head() -> None:
    manifests = render(run(engine="ray", workers=4, topology_level="cloud.provider.com/topology-block",
                           topology_slice_level="cloud.provider.com/topology-rack", topology_slice_size=2),
                       attempt=0)
    validate(manifests[0])
    cluster = manifests[0]["spec"]["rayClusterSpec"]
    assert tas(cluster["headGroupSpec"]["template"]["metadata"]["annotations"]) == {
        f"{TAS}required-topology": "cloud.provider.com/topology-block"}
    assert tas(cluster["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]) == {
        f"{TAS}required-topology": "cloud.provider.com/topology-block",
        f"{TAS}slice-required-topology": "cloud.provider.com/topology-rack",
        f"{TAS}slice-size": "2"}


def test_no_topology_asked_renders_no_tas_annotation() -> None:
    job = render(run(), attempt=0)[0]
    assert tas(job["spec"]["template"]["metadata"]["annotations"]) == {}


def test_platform_apply_addresses_topologies_as_cluster_scoped() -> None:
    from taugrid.kube.client import resource_for

    resource = resource_for("Topology", "kueue.x-k8s.io/v1beta2")
    assert (resource.plural, resource.namespaced) == ("topologies", False)


def test_a_rayjob_asking_for_a_rack_groups_its_head_with_its_workers() -> None:
    """Kueue's podset-group-name on both groups: head (the one-pod leader) and workers placed in one rack, the head
    ranked first; a grouping Kueue's webhook accepts (two pod sets, one of one pod, the same level)."""
    rack = "cloud.provider.com/topology-rack"
    manifests = render(run(engine="ray", workers=3, topology_level=rack), attempt=0)
    validate(manifests[0])
    cluster = manifests[0]["spec"]["rayClusterSpec"]
    grouped = {f"{TAS}required-topology": rack, f"{TAS}group-name": "ray"}
    assert tas(cluster["headGroupSpec"]["template"]["metadata"]["annotations"]) == grouped
    assert tas(cluster["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]) == grouped
    preferred = render(run(engine="ray", workers=3, topology_level=rack, topology_required=False), attempt=0)[0]
    assert preferred["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["annotations"][
        f"{TAS}group-name"] == "ray"
    loose = render(run(engine="ray", workers=3, topology_unconstrained=True), attempt=0)[0]
    assert f"{TAS}group-name" not in loose["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"][
        "annotations"]


def test_every_main_container_learns_its_node_from_the_downward_api() -> None:
    """``TAU_NODE_NAME`` = ``spec.nodeName``: where Kueue's assignment put the pod's rank, as the local cluster
    sets it; the run's own value, if it names one, is left alone."""
    node = {"name": "TAU_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    job = [m for m in render(run(launcher="torchrun", nodes=2), attempt=0) if m["kind"] == "Job"][0]
    assert [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "TAU_NODE_NAME"] == [
        node]
    cluster = render(run(engine="ray", workers=2), attempt=0)[0]["spec"]["rayClusterSpec"]
    for template in (cluster["headGroupSpec"]["template"], cluster["workerGroupSpecs"][0]["template"]):
        assert [e for e in template["spec"]["containers"][0]["env"] if e["name"] == "TAU_NODE_NAME"] == [node]
    own = render(run(env={"TAU_NODE_NAME": "mine"}), attempt=0)[0]["spec"]["template"]["spec"]["containers"][0]
    assert [e for e in own["env"] if e["name"] == "TAU_NODE_NAME"] == [{"name": "TAU_NODE_NAME", "value": "mine"}]
