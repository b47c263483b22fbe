"""platform.yaml ``topologies`` and a flavor's ``topology_name``: Kueue's Topology rules, refused with the line and
the fix; the local pool's nodes of a topology flavor carry every level's label (hostname: the node's name)."""

from __future__ import annotations

import textwrap

import pytest

from taugrid.config.platform import load_platform
from taugrid.core.errors import ConfigError

RACKS = """\
topologies:
  - name: default
    levels:
      - cloud.provider.com/topology-block
      - cloud.provider.com/topology-rack
      - kubernetes.io/hostname
resource_flavors:
  - name: gpu
    topology_name: default
    node_labels: {taugrid.io/pool: gpu}
local:
  nodes:
    - name: a1
      gpus: 2
      labels: {taugrid.io/pool: gpu, cloud.provider.com/topology-block: b1, cloud.provider.com/topology-rack: r1}
    - name: b1
      gpus: 2
      labels: {taugrid.io/pool: gpu, cloud.provider.com/topology-block: b1, cloud.provider.com/topology-rack: r2}
"""


def issues(text: str) -> list[tuple[str, int | None, str, str]]:
    with pytest.raises(ConfigError) as err:
        load_platform(textwrap.dedent(text))
    return [(str(i["field"]), i["line"], str(i["message"]), str(i["fix"])) for i in err.value.issues]  # type: ignore[misc]


def test_a_topology_a_flavor_names_and_a_labelled_pool_load() -> None:
    p = load_platform(RACKS)
    assert p.topology("default") is not None
    assert p.topologies[0].levels == ["cloud.provider.com/topology-block", "cloud.provider.com/topology-rack",
                                      "kubernetes.io/hostname"]
    assert p.resource_flavors[0].topology_name == "default"


def test_an_unknown_topology_is_named_with_the_nearest_one() -> None:
    assert issues(RACKS.replace("topology_name: default", "topology_name: defualt")) == [
        ("resource_flavors[0].topology_name", 9, "unknown topology 'defualt'; did you mean 'default'?",
         "use one of: default")]


def test_empty_duplicate_and_misplaced_levels_are_kueues_errors() -> None:
    found = issues("""\
        topologies:
          - name: empty
            levels: []
          - name: twice
            levels:
              - example.com/rack
              - example.com/rack
          - name: host-first
            levels:
              - kubernetes.io/hostname
              - example.com/rack
        """)
    assert found == [
        ("topologies[0].levels", 3, "a topology needs at least one level",
         "list node label keys, highest first, e.g. levels: [cloud.provider.com/topology-block, "
         "cloud.provider.com/topology-rack, kubernetes.io/hostname]"),
        ("topologies[1].levels[1]", 7, "level 'example.com/rack' is listed twice (also levels[0])",
         "list each node label once"),
        ("topologies[2].levels[0]", 10,
         "kubernetes.io/hostname can only be the lowest level of a topology (Kueue's rule)",
         "move kubernetes.io/hostname to the end of levels"),
    ]


def test_too_many_levels_bad_label_keys_bad_names_and_duplicate_topologies() -> None:
    levels = "\n".join(f"      - example.com/l{i}" for i in range(17))
    found = issues(f"topologies:\n  - name: Wide_One\n    levels:\n{levels}\n"
                   "  - name: bad\n    levels: [-rack]\n  - name: bad\n    levels: [example.com/x]\n")
    assert found == [
        ("topologies[0].name", 2, "'Wide_One' is not a Kubernetes object name (Kueue's Topology)",
         "use lowercase letters, digits, '-' and '.', e.g. default or gpu-racks"),
        ("topologies[0].levels", 3, "17 levels; Kueue allows at most 16", "keep at most 16 levels"),
        ("topologies[1].levels[0]", 22, "'-rack' is not a node label key",
         "write a label key such as cloud.provider.com/topology-rack (≤ 316 characters, a name part ≤ 63)"),
        ("topologies[2].name", 23, "duplicate name 'bad'", "give each entry a distinct name"),
    ]


def test_a_topology_flavor_needs_node_labels() -> None:
    text = RACKS.replace("    node_labels: {taugrid.io/pool: gpu}\n", "").replace("taugrid.io/pool: gpu, ", "")
    assert issues(text) == [
        ("resource_flavors[0].topology_name", 9, "flavor 'gpu' names a topology but has no node_labels (Kueue "
         "requires at least one: they select the nodes whose topology labels Kueue reads)",
         "add node_labels that the flavor's nodes carry, e.g. node_labels: {taugrid.io/pool: gpu}")]


def test_a_local_node_of_a_topology_flavor_without_a_level_label_is_named() -> None:
    text = RACKS.replace(", cloud.provider.com/topology-rack: r2", "")
    assert issues(text) == [
        ("local.nodes[1].labels", 18, "node 'b1' is in flavor 'gpu', whose topology 'default' has level "
         "'cloud.provider.com/topology-rack', but the node has no 'cloud.provider.com/topology-rack' label",
         "add labels: {cloud.provider.com/topology-rack: <domain>} to node 'b1' (e.g. the rack it stands in)")]


def test_nodes_outside_the_flavor_need_no_topology_labels() -> None:
    text = RACKS + "    - {name: cpu1, labels: {taugrid.io/pool: cpu}}\n"
    assert [n.name for n in load_platform(text).local.nodes] == ["a1", "b1", "cpu1"]


def test_hostname_is_the_node_name_unless_written() -> None:
    """No node writes kubernetes.io/hostname, yet the hostname level is met; one written is taken as written."""
    p = load_platform(RACKS.replace("labels: {taugrid.io/pool: gpu, cloud.provider.com/topology-block: b1, "
                                    "cloud.provider.com/topology-rack: r1}",
                                    "labels: {taugrid.io/pool: gpu, cloud.provider.com/topology-block: b1, "
                                    "cloud.provider.com/topology-rack: r1, kubernetes.io/hostname: host-a1}"))
    assert p.local.nodes[0].labels["kubernetes.io/hostname"] == "host-a1"
    assert "kubernetes.io/hostname" not in p.local.nodes[1].labels


def test_tau_platform_apply_names_a_changed_topology() -> None:
    from taugrid.config.platformdiff import diff

    old = load_platform(RACKS)
    new = load_platform(RACKS.replace("      - cloud.provider.com/topology-block\n", ""))
    assert [c.lines() for c in diff(old, new)] == [["~ topology default",
                                                    "    levels: -cloud.provider.com/topology-block"]]
    added = diff(load_platform("resource_flavors: []\n"), old)[0]
    assert (added.kind, added.name, added.action) == ("topology", "default", "add")
