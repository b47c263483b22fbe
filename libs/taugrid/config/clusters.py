"""``platform.yaml`` ``clusters``: the places runs may go, as MultiKueue's worker clusters are to its manager.

Each cluster is a site with its own backend (the embedded local pool or a Kubernetes cluster with Kueue), its own
bus (a NATS leaf node whose JetStream domain is the cluster's name, ``taugrid.bus.sites``), the ClusterQueues it
serves and, optionally, its own nominal quota for some of them (``quotas``: a cluster without one holds the
platform's nominal quota in full, as every MultiKueue worker holds its own ClusterQueue's; ``siteplatform``
gives a site the platform with its own quotas put in). The control plane's quota view is the sum of what the
clusters report (``core.sitecapacity.summed``). The dispatcher (``taugrid.dispatch``) nominates clusters for a
run in ``preference`` order, lower first (ties keep the file's order): the first cluster to admit the run wins and
the other copies are withdrawn.

No ``clusters`` means what it always meant: one cluster, the stack's own backend (``TAU_BACKEND``/``TAU_CLUSTER``),
serving every queue; nothing is dispatched.

Invariants: a cluster's name is one subject token and one JetStream domain name (lowercase letters, digits, '-');
``check_clusters`` never raises, it reports every problem through ``add`` (field path, message, fix) as
``platformcheck`` does; every ClusterQueue is served by at least one cluster when any is declared, so no run is
accepted that no cluster would ever take; a cluster's quota names a ClusterQueue it serves, one of that queue's
flavors and resources that flavor lists, each (queue, flavor) once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Literal

from pydantic import Field

from taugrid.config.fields import Duration, Strict, Text
from taugrid.config.source import suggest
from taugrid.core.devices import is_gpu_resource
from taugrid.core.quantity import parse_cpu, parse_memory

# A subject token and a JetStream domain (nats-server refuses '.', '*', '>' and spaces in a domain).
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,39}$"
ClusterName = Annotated[str, Field(pattern=NAME_PATTERN)]

Add = Callable[..., None]
# The renderer's requests for the dispatcher travel as backend.dispatch.* (TAU_CLUSTER=dispatch): no cluster's name.
DISPATCH = "dispatch"


class ClusterQuota(Strict):
    """A cluster's own nominal quota of one flavor of one ClusterQueue, replacing the platform's there."""

    cluster_queue: str = Field(description="a ClusterQueue this cluster serves")
    flavor: str = Field(description="one of that ClusterQueue's flavors")
    resources: dict[str, Text] = Field(min_length=1, description="resource → nominal quota at this cluster "
                                       "(cpu: 32, memory: 256Gi, nvidia.com/gpu: 8); resources not named keep "
                                       "the platform's")


class Cluster(Strict):
    """One site: where its runs execute, in which order it is tried, which queues it serves."""

    name: ClusterName = Field(description="one token: the site's subjects (backend.<name>.*, k8s.<name>.*) and the "
                              "JetStream domain of its leaf node")
    backend: Literal["local", "kubernetes"] = Field(description="local: an embedded pool (local.nodes); kubernetes: "
                                                    "Kueue on a real cluster, through its kube-bridge")
    preference: int = Field(default=0, ge=0, description="spill-over order: lower is nominated first (on-prem "
                            "before cloud); equal preferences keep the file's order")
    cluster_queues: list[str] | None = Field(
        default=None, description="the ClusterQueues this cluster serves (a run of another queue is never "
        "nominated to it); absent: every ClusterQueue")
    quotas: list[ClusterQuota] = Field(
        default_factory=list, description="this cluster's own nominal quota where it differs from the platform's "
        "cluster_queues (absent: it holds their nominal quota in full); the control plane's view sums the clusters'")


class Dispatch(Strict):
    """How runs are nominated to clusters (Kueue's MultiKueue dispatchers, ``core/dispatch.py``)."""

    mode: Literal["AllAtOnce", "Incremental"] = Field(
        default="AllAtOnce", description="AllAtOnce: every eligible cluster at once; Incremental: "
        "incremental_step clusters per round, the next ones after round_timeout without an admission")
    incremental_step: int = Field(default=3, ge=1, description="clusters added per Incremental round (Kueue's 3)")
    round_timeout: Duration = Field(default=300.0, description="how long an Incremental round waits for an "
                                    "admission before the next clusters are nominated (Kueue's 5 minutes)")
    worker_lost_timeout: Duration = Field(
        default=900.0, description="how long a cluster's lease may go unrenewed before its admitted runs are "
        "requeued on the others (Kueue's workerLostTimeout, 15 minutes); never while every cluster is silent")
    preemption_gate_timeout: Duration = Field(
        default=300.0, description="one cluster at a time may preempt for a run: how long the cluster let do so "
        "has before the next cluster waiting to preempt is let (MultiKueue's PreemptionGateTimeout, 5 minutes)")


def serves(cluster: Cluster, cluster_queue: str) -> bool:
    """Whether ``cluster`` may be nominated for a run admitted through ``cluster_queue``."""
    return cluster.cluster_queues is None or cluster_queue in cluster.cluster_queues


def in_preference_order(clusters: list[Cluster]) -> list[Cluster]:
    """The clusters as they are tried: lower ``preference`` first, the file's order among equals (a stable sort)."""
    return sorted(clusters, key=lambda c: c.preference)


def eligible(clusters: list[Cluster], cluster_queue: str) -> list[str]:
    """The clusters a run of ``cluster_queue`` may be nominated to, in the order they are tried."""
    return [c.name for c in in_preference_order(clusters) if serves(c, cluster_queue)]


# A ClusterQueue's flavors as a cluster's quota may name them: queue → flavor → resource → its lending limit
# (None: none), from the platform's ``cluster_queues`` (``platformcheck`` passes them).
Flavors = Mapping[str, Mapping[str, Mapping[str, str | None]]]


def _amount(resource: str, value: str) -> float:
    if resource == "memory" or resource.endswith("memory") or resource == "ephemeral-storage":
        return float(parse_memory(value))
    return parse_cpu(value)


def check_clusters(clusters: list[Cluster], queues: list[str], add: Add, dispatch: Dispatch | None = None,
                   flavors: Flavors | None = None) -> None:
    """Names unique, every named ClusterQueue one of ``queues`` (the platform's), every one of them served; the
    ``dispatch`` keys only where they act (with clusters; the Incremental ones with that mode); each cluster's
    ``quotas`` against ``flavors``."""
    # judged by value, not by the keys written: a platform dumped whole (tau up's machine platform, a merged
    # apply) writes every default, and a default changes nothing anywhere
    default = Dispatch()
    if not clusters:
        if dispatch is not None and dispatch != default:
            add(("dispatch",), "dispatch has no effect without clusters",
                "declare clusters: [{name: ..., backend: local}, ...], or remove dispatch")
        return
    if dispatch is not None and dispatch.mode == "AllAtOnce":
        for name in ("incremental_step", "round_timeout"):
            if getattr(dispatch, name) == getattr(default, name):
                continue
            add(("dispatch", name), f"{name} has no effect with mode AllAtOnce (every cluster is nominated at once)",
                f"set mode: Incremental, or remove {name}")
    seen: set[str] = set()
    for i, cluster in enumerate(clusters):
        if cluster.name == DISPATCH:
            add(("clusters", i, "name"), f"{DISPATCH!r} is reserved: the renderer's requests to the dispatcher "
                f"travel as backend.{DISPATCH}.*", "choose another name")
        if cluster.name in seen:
            add(("clusters", i, "name"), f"duplicate cluster name {cluster.name!r}",
                "give each cluster a distinct name")
        seen.add(cluster.name)
    for i, cluster in enumerate(clusters):
        for j, name in enumerate(cluster.cluster_queues or []):
            if name not in queues:
                guess = suggest(name, queues)
                add(("clusters", i, "cluster_queues", j),
                    f"unknown cluster queue {name!r}" + (f"; did you mean '{guess}'?" if guess else ""),
                    f"use one of: {', '.join(queues)}" if queues else "declare it under cluster_queues first")
    for queue in queues:
        if not any(serves(c, queue) for c in clusters):
            add(("clusters",), f"no cluster serves cluster queue {queue!r}: its runs would never be dispatched",
                f"add {queue} to a cluster's cluster_queues, or leave cluster_queues out on one cluster "
                "(it then serves every queue)")
    for i, cluster in enumerate(clusters):
        _check_quotas(i, cluster, flavors or {}, add)


def _check_quotas(i: int, cluster: Cluster, flavors: Flavors, add: Add) -> None:
    seen: set[tuple[str, str]] = set()
    for j, quota in enumerate(cluster.quotas):
        path = ("clusters", i, "quotas", j)
        queue = flavors.get(quota.cluster_queue)
        if queue is None:
            guess = suggest(quota.cluster_queue, list(flavors))
            add((*path, "cluster_queue"), f"unknown cluster queue {quota.cluster_queue!r}"
                + (f"; did you mean '{guess}'?" if guess else ""), f"use one of: {', '.join(flavors)}")
            continue
        if not serves(cluster, quota.cluster_queue):
            add((*path, "cluster_queue"), f"{cluster.name} does not serve {quota.cluster_queue!r}: its quota there "
                "would never hold a run", f"add {quota.cluster_queue} to its cluster_queues, or remove this quota")
            continue
        listed = queue.get(quota.flavor)
        if listed is None:
            add((*path, "flavor"), f"{quota.cluster_queue} has no flavor {quota.flavor!r}",
                f"use one of its flavors: {', '.join(queue)}")
            continue
        if (quota.cluster_queue, quota.flavor) in seen:
            add((*path,), f"a second quota for {quota.cluster_queue}/{quota.flavor} at {cluster.name}",
                "give each ClusterQueue and flavor one entry, with every resource in it")
        seen.add((quota.cluster_queue, quota.flavor))
        for resource, value in quota.resources.items():
            rpath = (*path, "resources", resource)
            if resource not in listed:
                add(rpath, f"{quota.cluster_queue}/{quota.flavor} has no quota for {resource!r}",
                    f"use one of: {', '.join(listed)} (a resource the platform's flavor lists)")
                continue
            try:
                got = _amount(resource, value)
            except ValueError as exc:
                add(rpath, str(exc), "write a quantity such as 16, 500m or 64Gi")
                continue
            if is_gpu_resource(resource) and got != int(got):
                add(rpath, f"GPUs are whole devices, got {value!r}", "use a whole number")
            lending = listed[resource]
            if lending is not None and got < _amount(resource, lending):
                add(rpath, f"below {quota.cluster_queue}'s lending_limit {lending} for {resource}",
                    "give this cluster at least the lending limit, or lower the limit")
