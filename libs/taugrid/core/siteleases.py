"""Losing a cluster, fenced by lease (pure: no I/O, the time passed in; issue 28 item 4).

Each site renews a lease in the hub's KV; the hub judges silence by its own clock (the time its server stored the
last renewal), never by a site's. A cluster whose lease has gone unrenewed for longer than
``worker_lost_timeout`` (Kueue's ``workerLostTimeout``, 15 minutes by default) is *lost*: the hub marks its lease
lost, raising the lease's generation, by compare-and-set, and only then requeues the runs it had chosen there,
each new choice written with compare-and-set too. The generation is the fence: a site's renewal names the
generation it holds, so a site that comes back after it was declared lost finds a newer generation, and before
doing anything else stops the pods of the runs the hub no longer has chosen there (``orphans``), then rejoins
under the new generation.

Two rules keep a healthy run from being taken away:

- **the hub suspects itself**: when every cluster not already lost falls silent at once, the likelier fault is the
  hub's own link or process, so no lease expires (``judge``'s ``suspect_self``); a control-plane outage never
  requeues (and so never doubles) a multi-day run;
- **silence counts from the hub's start at the earliest**: while the hub is down no renewal can land, so a lease
  renewed before the hub stopped is judged only once the hub has been up for the timeout itself (``silent``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WORKER_LOST_TIMEOUT_S = 900.0  # Kueue's defaultWorkerLostTimeout (15 minutes)


@dataclass(frozen=True)
class Lease:
    """A cluster's lease as the hub keeps it: the generation it is held under; ``lost`` once the hub declared it
    lost (its runs requeued elsewhere); ``renewed``: when the hub's server stored its last write (None: never)."""

    cluster: str
    generation: int = 1
    lost: bool = False
    renewed: float | None = None


@dataclass(frozen=True)
class Judgement:
    lost: tuple[str, ...]  # clusters whose lease expired now, in the order given
    suspect_self: bool  # every live cluster fell silent at once: nothing is expired (the hub suspects itself)
    reason: str


def silent(lease: Lease, now: float, hub_up_since: float) -> float:
    """Seconds the hub has gone without a renewal it could have stored: counted from the later of the last
    renewal and the hub's start (a lease never renewed counts from the hub's start)."""
    since = hub_up_since if lease.renewed is None else max(lease.renewed, hub_up_since)
    return max(0.0, now - since)


def judge(leases: Iterable[Lease], now: float, *, timeout: float = WORKER_LOST_TIMEOUT_S,
          hub_up_since: float) -> Judgement:
    """Which clusters are lost now. Leases already lost are neither judged again nor counted among the live."""
    live = [lease for lease in leases if not lease.lost]
    expired = tuple(lease.cluster for lease in live if silent(lease, now, hub_up_since) > timeout)
    if expired and len(expired) == len(live):
        return Judgement((), True, f"every cluster ({', '.join(expired)}) silent for over {timeout:g}s at once: "
                                   f"the hub suspects its own link and expires no lease")
    if not expired:
        return Judgement((), False, "")
    return Judgement(expired, False, f"no lease renewal for over {timeout:g}s")


def declare_lost(lease: Lease) -> Lease:
    """The lease the hub writes (compare-and-set on the revision it judged) before requeueing the cluster's runs:
    a new generation, so the site's next renewal under the old one is refused."""
    return Lease(lease.cluster, lease.generation + 1, True, lease.renewed)


def requeue(chosen: Mapping[str, str], lost: Iterable[str], finished: Iterable[str] = ()) -> list[str]:
    """The run attempts (record keys) to requeue: chosen at a lost cluster and not finished there, sorted."""
    gone, done = set(lost), set(finished)
    return sorted(k for k, cluster in chosen.items() if cluster in gone and k not in done)


@dataclass(frozen=True)
class Renewal:
    """What a site does with the lease it reads before renewing: ``fence`` (stop its orphans first) when the hub
    declared it lost or moved its generation past the one the site holds; then it renews under ``generation``."""

    fence: bool
    generation: int


def renewal(stored: Lease | None, held_generation: int) -> Renewal:
    """The site's side: no lease yet, or the one it holds, is renewed as it is; a lost one, or a newer generation
    (the hub declared it lost while the site was away), is fenced first and then rejoined under the hub's
    generation."""
    if stored is None:
        return Renewal(False, held_generation)
    if stored.lost or stored.generation != held_generation:
        return Renewal(True, stored.generation)
    return Renewal(False, held_generation)


def orphans(running: Mapping[str, str], chosen: Mapping[str, str], me: str) -> list[str]:
    """The workloads a returning site must stop before anything else: those it runs for a dispatched run attempt
    (workload → record key) that the hub no longer has chosen at this cluster (requeued elsewhere, or its record
    gone), sorted."""
    return sorted(w for w, k in running.items() if chosen.get(k) != me)


def renew_period(timeout: float) -> float:
    """How often a site renews its lease and the hub judges them, for a ``worker_lost_timeout`` of ``timeout``:
    a quarter of it, between 0.5 s and 5 s, so a lease misses several renewals before it can expire."""
    return min(5.0, max(0.5, timeout / 4))
