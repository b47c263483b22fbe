"""Checks of a platform's ``topologies`` and of what uses them: the flavors that name one, the local pool's nodes.

The rules on a topology are Kueue's (v0.19 ``Topology`` CRD, checked there by its schema and CEL rules): a name
that is a DNS-1123 subdomain, 1 to 16 levels, each a node label key (at most 316 characters, Kueue's pattern,
and a valid label name), no level twice, and ``kubernetes.io/hostname`` only as the lowest (last) level. A
flavor naming a topology needs at least one node label (Kueue's ResourceFlavor CEL rule: the labels are what
select the nodes whose topology Kueue reads). On the local backend every node a topology flavor selects must
carry every level's label, or topology-aware admission could never put a pod there; a node's
``kubernetes.io/hostname`` is its name unless written.

Invariant: ``check_topologies`` never raises; it reports every problem through ``add`` (field path, message,
fix), as ``platformcheck`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from taugrid.config.platform import LocalNode, Platform
from taugrid.config.source import suggest

HOSTNAME_LABEL = "kubernetes.io/hostname"
MAX_LEVELS = 16  # Kueue's Topology spec.levels maxItems
_LEVEL_MAX = 316  # Kueue's nodeLabel maxLength
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

Add = Callable[..., None]


def is_label_key(key: str) -> bool:
    """A Kubernetes label key (``[prefix/]name``: a DNS subdomain prefix of ≤ 253, a name of ≤ 63)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return len(key) <= _LEVEL_MAX and 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def node_labels(node: LocalNode) -> dict[str, str]:
    """A local node's labels as Kubernetes would show them: ``kubernetes.io/hostname`` is its name if not written."""
    return {HOSTNAME_LABEL: node.name, **{k: str(v) for k, v in node.labels.items()}}


def selects(flavor_labels: Mapping[str, object], labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` belongs to a flavor with ``flavor_labels`` (every one matches)."""
    return all(labels.get(k) == str(v) for k, v in flavor_labels.items())


def check_topologies(platform: Platform, add: Add) -> None:
    for i, topology in enumerate(platform.topologies):
        base: tuple[str | int, ...] = ("topologies", i)
        if len(topology.name) > 253 or not _DNS1123_SUBDOMAIN.match(topology.name):
            add((*base, "name"), f"{topology.name!r} is not a Kubernetes object name (Kueue's Topology)",
                "use lowercase letters, digits, '-' and '.', e.g. default or gpu-racks")
        _levels(add, base, topology.levels)
    names = {t.name for t in platform.topologies}
    for i, flavor in enumerate(platform.resource_flavors):
        if flavor.topology_name is None:
            continue
        path: tuple[str | int, ...] = ("resource_flavors", i, "topology_name")
        if flavor.topology_name not in names:
            guess = suggest(flavor.topology_name, sorted(names))
            add(path, f"unknown topology {flavor.topology_name!r}" + (f"; did you mean '{guess}'?" if guess else ""),
                f"use one of: {', '.join(sorted(names))}" if names else
                "declare it under topologies: [{name: ..., levels: [...]}], or remove topology_name")
            continue
        if not flavor.node_labels:
            add(path, f"flavor {flavor.name!r} names a topology but has no node_labels (Kueue requires at least one: "
                "they select the nodes whose topology labels Kueue reads)",
                "add node_labels that the flavor's nodes carry, e.g. node_labels: {taugrid.io/pool: gpu}")
            continue
        _local_nodes(platform, add, flavor.name, flavor.node_labels, flavor.topology_name)


def _levels(add: Add, base: tuple[str | int, ...], levels: list[str]) -> None:
    if not levels:
        add((*base, "levels"), "a topology needs at least one level",
            "list node label keys, highest first, e.g. levels: [cloud.provider.com/topology-block, "
            "cloud.provider.com/topology-rack, kubernetes.io/hostname]")
        return
    if len(levels) > MAX_LEVELS:
        add((*base, "levels"), f"{len(levels)} levels; Kueue allows at most {MAX_LEVELS}",
            f"keep at most {MAX_LEVELS} levels")
    seen: dict[str, int] = {}
    for j, level in enumerate(levels):
        if not is_label_key(level):
            add((*base, "levels", j), f"{level!r} is not a node label key",
                "write a label key such as cloud.provider.com/topology-rack (≤ 316 characters, a name part ≤ 63)")
        if level in seen:
            add((*base, "levels", j), f"level {level!r} is listed twice (also levels[{seen[level]}])",
                "list each node label once")
        seen.setdefault(level, j)
    if HOSTNAME_LABEL in levels and levels[-1] != HOSTNAME_LABEL:
        j = levels.index(HOSTNAME_LABEL)
        add((*base, "levels", j), f"{HOSTNAME_LABEL} can only be the lowest level of a topology (Kueue's rule)",
            f"move {HOSTNAME_LABEL} to the end of levels")


def _local_nodes(platform: Platform, add: Add, flavor: str, flavor_labels: Mapping[str, object],
                 topology_name: str) -> None:
    """Every local node the flavor selects carries every level of its topology."""
    topology = platform.topology(topology_name)
    if topology is None:
        return
    for n, node in enumerate(platform.local.nodes):
        labels = node_labels(node)
        if not selects(flavor_labels, labels):
            continue
        for level in topology.levels:
            if level not in labels:
                add(("local", "nodes", n, "labels"),
                    f"node {node.name!r} is in flavor {flavor!r}, whose topology {topology_name!r} has level "
                    f"{level!r}, but the node has no {level!r} label",
                    f"add labels: {{{level}: <domain>}} to node {node.name!r} (e.g. the rack it stands in)")


def queue_topologies(platform: Platform, cluster_queue: str) -> list[list[str]] | None:
    """The levels of each topology ``cluster_queue``'s flavors name (what a run of it can be placed by); None when
    the platform declares no topologies or names no such queue (nothing to check against)."""
    cq = platform.cluster_queue(cluster_queue) if platform.topologies else None
    if cq is None:
        return None
    flavors = {fq.name for g in cq.resource_groups for fq in g.flavors}
    out: list[list[str]] = []
    for f in platform.resource_flavors:
        topology = platform.topology(f.topology_name) if f.name in flavors and f.topology_name else None
        if topology is not None and topology.levels not in out:
            out.append(list(topology.levels))
    return out
