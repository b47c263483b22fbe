"""Kueue's ``topologyAssignment`` read and written (``core.topologyassignment``). The compressed cases are the
four examples of the v1beta2 Workload CRD's own description (Kueue v0.19.2, ``deploy/crds``); the v1beta1 case
is that version's example; encode follows Kueue's single-slice encoding (``pkg/util/tas/tas_assignment.go``)."""

from __future__ import annotations

import pytest

from taugrid.core.contracts import PodSetTopology, TopologyDomain
from taugrid.core.topologyassignment import decode, encode, ranks

BLOCK, RACK, HOST = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack", "kubernetes.io/hostname"
RACKS = [TopologyDomain(values=["block-1", "rack-1"], count=4), TopologyDomain(values=["block-1", "rack-2"], count=2)]
NODES = [TopologyDomain(values=[f"block-1-rack-{r}-node-{n}"], count=1)
         for r, n in ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2))]


def test_crd_example_1_individual_values_and_counts() -> None:
    ta = {"levels": [BLOCK, RACK], "slices": [{"domainCount": 2, "valuesPerLevel": [
        {"individual": {"roots": ["block-1", "block-1"]}}, {"individual": {"roots": ["rack-1", "rack-2"]}}],
        "podCounts": {"individual": [4, 2]}}]}
    assert decode("main", ta) == PodSetTopology(pod_set="main", levels=[BLOCK, RACK], domains=RACKS)


def test_crd_example_2_universal_value_and_prefix() -> None:
    ta = {"levels": [BLOCK, RACK], "slices": [{"domainCount": 2, "valuesPerLevel": [
        {"universal": "block-1"}, {"individual": {"prefix": "rack-", "roots": ["1", "2"]}}],
        "podCounts": {"individual": [4, 2]}}]}
    assert decode("main", ta).domains == RACKS
    assert encode([BLOCK, RACK], RACKS) == ta  # what Kueue writes for it


def test_crd_example_3_hostnames_with_a_common_prefix_and_universal_count() -> None:
    ta = {"levels": [HOST], "slices": [{"domainCount": 6, "valuesPerLevel": [{"individual": {
        "prefix": "block-1-rack-", "roots": ["1-node-1", "1-node-2", "1-node-3", "1-node-4", "2-node-1", "2-node-2"]}}],
        "podCounts": {"universal": 1}}]}
    assert decode("main", ta).domains == NODES
    assert encode([HOST], NODES) == ta


def test_crd_example_4_several_slices_are_one_assignment_in_order() -> None:
    ta = {"levels": [HOST], "slices": [
        {"domainCount": 4, "podCounts": {"universal": 1},
         "valuesPerLevel": [{"individual": {"prefix": "block-1-rack-1-node-", "roots": list("1234")}}]},
        {"domainCount": 2, "podCounts": {"universal": 1},
         "valuesPerLevel": [{"individual": {"prefix": "block-1-rack-2-node-", "roots": list("12")}}]}]}
    assert decode("main", ta).domains == NODES


def test_v1beta1_domains() -> None:
    ta = {"levels": [BLOCK, RACK], "domains": [{"values": ["block-1", "rack-1"], "count": 4},
                                              {"values": ["block-1", "rack-2"], "count": 2}]}
    assert decode("workers", ta) == PodSetTopology(pod_set="workers", levels=[BLOCK, RACK], domains=RACKS)


def test_encode_takes_out_a_suffix_never_overlapping_the_prefix() -> None:
    doms = [TopologyDomain(values=["ababa"], count=1), TopologyDomain(values=["aba"], count=1)]
    # Kueue's motivating case: prefix "aba" and suffix "aba" would overlap in "aba", so the prefix gives way
    assert encode([HOST], doms)["slices"][0]["valuesPerLevel"] == [
        {"individual": {"roots": ["ab", ""], "suffix": "aba"}}]
    assert decode("main", encode([HOST], doms)).domains == doms
    nodes = [TopologyDomain(values=["a1.dc"], count=2), TopologyDomain(values=["b1.dc"], count=1)]
    assert encode([HOST], nodes)["slices"][0] == {
        "domainCount": 2, "valuesPerLevel": [{"individual": {"roots": ["a", "b"], "suffix": "1.dc"}}],
        "podCounts": {"individual": [2, 1]}}
    assert encode([HOST], []) == {"levels": [HOST], "slices": []}


def test_ranks_follow_the_domains_in_order() -> None:
    assert ranks(PodSetTopology(pod_set="main", levels=[BLOCK, RACK], domains=RACKS)) == (
        [["block-1", "rack-1"]] * 4 + [["block-1", "rack-2"]] * 2)


@pytest.mark.parametrize(("ta", "message"), [
    ({"slices": []}, "topologyAssignment has no levels"),
    ({"levels": [HOST], "slices": [{"domainCount": 2, "valuesPerLevel": [{"universal": "a"}],
                                    "podCounts": {"individual": [1]}}]},
     "topologyAssignment slice has 1 pod count(s) for 2 domain(s)"),
    ({"levels": [HOST], "slices": [{"domainCount": 2, "valuesPerLevel": [{"individual": {"roots": ["a"]}}],
                                    "podCounts": {"universal": 1}}]},
     "topologyAssignment level has 1 root(s) for 2 domain(s)"),
    ({"levels": [BLOCK, RACK], "slices": [{"domainCount": 1, "valuesPerLevel": [{"universal": "a"}],
                                           "podCounts": {"universal": 1}}]},
     "topologyAssignment slice of 1 domain(s) has 1 level(s), not 2"),
    ({"levels": [BLOCK, RACK], "domains": [{"values": ["b1"], "count": 2}]},
     f"topologyAssignment domain ['b1'] x2 does not match levels {[BLOCK, RACK]}"),
])
def test_a_malformed_assignment_is_refused_saying_what_is_wrong(ta: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        decode("main", ta)
    assert str(err.value) == message
