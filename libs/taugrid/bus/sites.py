"""One bus across sites: each cluster's services run against a NATS leaf node with its own JetStream domain (the
cluster's name), connected to the control plane's server (the hub, domain ``hub``). Work and reports cross the
link only as *sourced streams*, never as plain publishes, so a site keeps running while its link is down and the
two sides catch up when it returns, each message stored once (JetStream sourcing resumes from the last source
sequence it stored, and a source message is stored once per sequence).

- hub → site: the site's ``SITE_IN`` stream sources the hub's BACKEND through a durable the hub made for it
  (``topology.site_in_durable``), filtered to ``backend.<cluster>.>``: the requests addressed to this cluster only,
  delivered on ``sitelink.<cluster>.in``; the site only resets that durable, it creates no consumer on the hub.
- site → hub: the site publishes its reports (``k8s.<cluster>.>``, its nodes, logs) into its own ``SITE_OUT``
  stream, and the hub's ``SITE_<CLUSTER>`` stream sources it with the subject transform ``> → site.<cluster>.>``,
  delivered on ``sitelink.<cluster>.out.…``.

Each link's deliveries have a subject space of the cluster's own (``topology.site_delivery``; the server's default
is ``$JS.S.<random>`` for every link alike), so the hub lets each site's leaf node receive and send only its own
(``permissions.leaf_permissions``): a site cannot read another's requests nor feed another's reports in.

Trust: the hub stamps the cluster's name itself. Whatever subject a site writes, its messages land only in its
own ``SITE_<CLUSTER>`` stream on the hub, under ``site.<cluster>.``; a reader that takes the cluster from the
stream it reads (``origin``) cannot be told by one site that it is another.

Invariant: nothing here starts servers (``taugrid.stack.natsserver.Leaf`` configures them); everything is
idempotent (an existing stream is left as it is).
"""

from __future__ import annotations

import msgspec
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ExternalStream,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamConsumerSource,
    StreamSource,
    SubjectTransform,
)
from nats.js.kv import KeyValue

from taugrid.bus import kv as kvstore
from taugrid.bus import sitecapacity
from taugrid.bus.authors import publish_keys
from taugrid.bus.connection import Bus
from taugrid.bus.errors import KEY_ABSENT, MISSING, NO_BUCKET, REFUSED, UNAVAILABLE, conflicted, unavailable
from taugrid.bus.topology import (
    KV_BUCKETS,
    SITE_DISPATCHER_DURABLE,
    SITE_LOCAL_DURABLE,
    STREAMS,
    site_delivery,
    site_in_durable,
)
from taugrid.core import siteleases
from taugrid.core.errors import PermanentError, TemporaryError
from taugrid.core.siteleases import Renewal

HUB_DOMAIN = "hub"
# The KV buckets a site's local cluster needs on its own server: its workloads, the platform it admits by, and the
# hub's services' public keys it checks each request's author by (``SITE_IN`` is a checked stream,
# ``publishing.CHECKED_STREAMS``); the last two put there by whoever provisions the site (not mirrored, docs §16).
SITE_BUCKETS = ("local_cluster", "platform", "service_keys")
# A Kubernetes site's (the chart's, ``stack/chartsites.py``): its kube-bridge's leader lease and watch checkpoints too.
KUBE_SITE_BUCKETS = (*SITE_BUCKETS, "bridge")
SITE_IN = "SITE_IN"
SITE_OUT = "SITE_OUT"
# What a site's leaf remote denies (``natsserver.Leaf``): its watch changes never leave as plain publishes (only
# through SITE_OUT's source), and neither the hub's requests nor the hub's own watch changes (the dispatcher's
# mirror of them, below) ever come in as plain publishes, or a site's stream would store the hub's copy of its own
# report and send it back.
SITE_DENY_EXPORTS = ("k8s.>",)
SITE_DENY_IMPORTS = ("backend.>", "k8s.>")
DISPATCHER_DURABLE = SITE_DISPATCHER_DURABLE  # on each hub site stream: the cluster's object changes
_DAY = 24 * 3600.0


def hub_stream(cluster: str) -> str:
    """The hub's stream of ``cluster``'s reports (stream names take no '-' or '.')."""
    return "SITE_" + cluster.upper().replace("-", "_")


def hub_subject(cluster: str, subject: str = ">") -> str:
    """Where the hub stores a report the site published on ``subject``."""
    return f"site.{cluster}.{subject}"


def origin(stream: str, clusters: list[str]) -> str | None:
    """The cluster whose reports ``stream`` (a hub stream) holds, or None: the one thing a reader on the hub trusts
    about where a report came from."""
    return next((c for c in clusters if hub_stream(c) == stream), None)


def site_out_subjects(cluster: str) -> list[str]:
    """What a site's own services publish and its ``SITE_OUT`` stores: the cluster's watch changes."""
    return [f"k8s.{cluster}.>"]


def api_prefix(domain: str) -> str:
    return f"$JS.{domain}.API"


STREAM_IN_USE = 10058  # the server's "stream name already in use with a different configuration"


async def _add(bus: Bus, config: StreamConfig, *, may_update: bool = False) -> None:
    """Make the stream; one made by an earlier taugrid with another config is updated where the caller may
    (``may_update``: a site's own server), else refused with the fix (the hub: only the break-glass identity
    changes streams there)."""
    try:
        await bus.js.add_stream(config)
    except REFUSED as exc:
        if getattr(exc, "err_code", None) != STREAM_IN_USE:
            raise unavailable(f"creating stream {config.name}", exc) from exc
        if not may_update:
            deliver = next((s.external.deliver for s in config.sources or () if s.external), None)
            raise PermanentError(
                f"stream {config.name} exists with another configuration (made by an earlier taugrid, whose link "
                "delivered on $JS.S.<random>, which every site could read): update its source to deliver on "
                f"{deliver} with the break-glass identity, or delete it and start again (it is sourced from the "
                "site anew)") from exc
        try:
            await bus.js.update_stream(config)
        except UNAVAILABLE as exc2:
            raise unavailable(f"updating stream {config.name}", exc2) from exc2
    except UNAVAILABLE as exc:
        raise unavailable(f"creating stream {config.name}", exc) from exc


async def provision_site(site: Bus, cluster: str, *, hub_domain: str = HUB_DOMAIN, backend_stream: str = "BACKEND",
                         max_age: float = 7 * _DAY, service_keys: dict[str, str] | None = None,
                         buckets: tuple[str, ...] = SITE_BUCKETS) -> None:
    """On the site's leaf server: ``SITE_IN`` (the hub's requests for this cluster, sourced across the link),
    ``SITE_OUT`` (this site's reports, stored here first), a ``DLQ`` (the requests its local cluster refuses) and
    the local cluster's buckets, with ``service_keys`` (service → public key, the hub's) recorded there: the site
    acts on a request only when signed by a service that may send it (``authors.Authors``), as the hub's
    consumers do, not on the hub's permissions alone."""
    await _add(site, StreamConfig(
        name=SITE_IN, retention=RetentionPolicy.LIMITS, storage=StorageType.FILE, max_age=max_age,
        sources=[StreamSource(name=backend_stream, external=ExternalStream(api=api_prefix(hub_domain)),
                              consumer=StreamConsumerSource(name=site_in_durable(cluster),
                                                            deliver_subject=site_delivery(cluster, "in")))]),
               may_update=True)
    await _add(site, StreamConfig(
        name=SITE_OUT, subjects=site_out_subjects(cluster), retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, max_age=max_age, duplicate_window=600.0))
    dlq = next(spec for spec in STREAMS if spec.name == "DLQ")
    await _add(site, StreamConfig(name=dlq.name, subjects=dlq.subjects, retention=RetentionPolicy.LIMITS,
                                  storage=StorageType.FILE, max_age=dlq.max_age))
    try:
        # the site's local cluster reads its requests here (``TAU_SITE``), not from a BACKEND of its own
        await site.js.add_consumer(SITE_IN, ConsumerConfig(
            durable_name=SITE_LOCAL_DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=60.0, max_deliver=20,
            max_ack_pending=2000, filter_subject=f"backend.{cluster}.>"))
        for bucket in buckets:  # what the site's services keep at the site, link up or down
            try:
                await site.js.key_value(bucket)
            except NO_BUCKET:
                await site.js.create_key_value(KeyValueConfig(bucket=bucket, history=KV_BUCKETS[bucket],
                                                              storage=StorageType.FILE, direct=True))
        if service_keys:
            await publish_keys(site, service_keys)
    except UNAVAILABLE as exc:
        raise unavailable(f"provisioning site {cluster}'s local cluster", exc) from exc


async def provision_feed(hub: Bus, cluster: str, *, backend_stream: str = "BACKEND") -> None:
    """On the hub: the durable on BACKEND that feeds ``cluster``'s ``SITE_IN`` (``topology.site_in_durable``), so
    the site never creates a consumer on the hub. Made before the site's ``SITE_IN`` (``provision_hub`` makes it
    too): a source whose durable is missing tries again only about 12 s later."""
    try:
        await hub.js.add_consumer(backend_stream, ConsumerConfig(
            durable_name=site_in_durable(cluster), deliver_subject=site_delivery(cluster, "in"),
            filter_subject=f"backend.{cluster}.>", ack_policy=AckPolicy.FLOW_CONTROL, flow_control=True,
            idle_heartbeat=1.0, max_ack_pending=10_000))
    except UNAVAILABLE as exc:
        raise unavailable(f"creating the durable that feeds {cluster}'s {SITE_IN}", exc) from exc


async def feed_exists(hub: Bus, cluster: str, *, backend_stream: str = "BACKEND") -> bool:
    """Whether ``cluster``'s feed (``provision_feed``) exists on the hub's BACKEND. BACKEND is an interest-retention
    stream: a request no durable's filter matches is not stored at all, so the dispatcher sends nothing to a
    cluster before this holds (docs §13d)."""
    try:
        await hub.js.consumer_info(backend_stream, site_in_durable(cluster))
    except MISSING:
        return False
    except UNAVAILABLE as exc:
        raise unavailable(f"reading whether {cluster}'s feed exists", exc) from exc
    return True


async def provision_hub(hub: Bus, cluster: str, *, max_age: float = 7 * _DAY, backend_stream: str = "BACKEND") -> None:
    """On the hub: ``SITE_<CLUSTER>``, sourcing the site's ``SITE_OUT`` from its domain, each subject prefixed with
    ``site.<cluster>.`` by the hub, the dispatcher's durable on its Workload changes, the durable on BACKEND that
    feeds the site's ``SITE_IN`` (``topology.site_in_durable``), and the ``site_leases`` and ``site_capacity``
    buckets."""
    await _add(hub, StreamConfig(
        name=hub_stream(cluster), retention=RetentionPolicy.LIMITS, storage=StorageType.FILE, max_age=max_age,
        sources=[StreamSource(name=SITE_OUT, external=ExternalStream(api=api_prefix(cluster),
                                                                    deliver=site_delivery(cluster, "out")),
                              subject_transforms=[SubjectTransform(src=">", dest=hub_subject(cluster))])]))
    await provision_feed(hub, cluster, backend_stream=backend_stream)
    try:
        await hub.js.add_consumer(hub_stream(cluster), ConsumerConfig(
            durable_name=DISPATCHER_DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=60.0, max_deliver=20,
            max_ack_pending=2000, filter_subject=hub_subject(cluster, "k8s.>")))
    except UNAVAILABLE as exc:
        raise unavailable(f"creating the dispatcher's durable on {hub_stream(cluster)}", exc) from exc
    try:
        await hub.js.key_value(LEASES)
    except NO_BUCKET:
        await hub.js.create_key_value(KeyValueConfig(bucket=LEASES, history=1, storage=StorageType.FILE, direct=True))
    except UNAVAILABLE as exc:
        raise unavailable(f"creating the hub's {LEASES} bucket", exc) from exc
    await sitecapacity.provision_hub(hub)  # each site's capacity and usage, written by the site (its own key)


class Link(msgspec.Struct, frozen=True):
    """The hub's view of a site's link: reports not yet pulled (``lag``), seconds since the hub last heard from
    the site's stream (``silent_s``; None: never since the hub started), reports stored on the hub."""

    lag: int
    silent_s: float | None
    stored: int


async def link(hub: Bus, cluster: str) -> Link | None:
    """The link of ``cluster`` as its hub stream's source reports it; None when the hub has no stream for it."""
    try:
        info = await hub.js.stream_info(hub_stream(cluster))
    except MISSING:
        return None
    except UNAVAILABLE as exc:
        raise unavailable(f"reading {hub_stream(cluster)}", exc) from exc
    source = info.sources[0] if info.sources else None
    active = source.active if source is not None and source.active is not None else -1
    return Link(lag=int(source.lag or 0) if source is not None else 0,
                silent_s=None if active < 0 else active / 1e9, stored=int(info.state.messages or 0))


# ---------------------------------------------------------------- leases (core/siteleases.py holds the rules)
# The hub's bucket of site leases, one key per cluster. A site writes its own across the link (the hub's domain
# API), each renewal a compare-and-set on the revision it read; the hub judges silence by when *it* saw a revision
# change (``LeaseClock``), never by a site's clock.
LEASES = "site_leases"


class SiteLease(msgspec.Struct, frozen=True):
    generation: int = 1
    lost: bool = False  # the hub declared the cluster lost under ``generation`` (its runs requeued elsewhere)


async def _hub_leases(site: Bus, hub_domain: str) -> KeyValue:
    return await site.nc.jetstream(domain=hub_domain, timeout=5).key_value(LEASES)


async def _write_across(site: Bus, cluster: str, lease: SiteLease, *, last: int, hub_domain: str) -> None:
    """A compare-and-set write of the site's lease into the hub's bucket from the site's server: through the hub
    domain's API prefix (the server maps it onto the bucket's subject), since a plain ``$KV.`` publish stays on
    the leaf and nats-py's KeyValue does not prefix its writes."""
    js = site.nc.jetstream(domain=hub_domain, timeout=5)
    await js.publish(f"$JS.{hub_domain}.API.$KV.{LEASES}.{cluster}", msgspec.json.encode(lease),
                     headers={"Nats-Expected-Last-Subject-Sequence": str(last)})


async def _read(kv: KeyValue, cluster: str) -> tuple[SiteLease | None, int]:
    try:
        entry = await kv.get(cluster)
    except KEY_ABSENT:
        return None, 0
    return msgspec.json.decode(entry.value or b"{}", type=SiteLease), int(entry.revision or 0)


async def renew(site: Bus, cluster: str, held_generation: int, *, hub_domain: str = HUB_DOMAIN) -> Renewal:
    """A site renews its lease on the hub under the generation it holds. When the hub declared it lost (or moved
    its generation) it writes nothing and answers ``fence``: the caller stops its orphans first, then ``rejoin``s.
    A renewal that loses its compare-and-set to the hub's declaration is read again and answered the same way."""
    try:
        kv = await _hub_leases(site, hub_domain)
        for _ in range(2):
            stored, revision = await _read(kv, cluster)
            decided = siteleases.renewal(None if stored is None else siteleases.Lease(
                cluster, stored.generation, stored.lost), held_generation)
            if decided.fence:
                return decided
            try:
                await _write_across(site, cluster, SiteLease(held_generation), last=revision, hub_domain=hub_domain)
                return decided
            except UNAVAILABLE as exc:
                if not conflicted(exc):
                    raise
    except UNAVAILABLE as exc:
        raise unavailable(f"renewing {cluster}'s lease on the hub", exc) from exc
    raise TemporaryError(f"renewing {cluster}'s lease lost two compare-and-sets in a row", delay=1.0)


async def rejoin(site: Bus, cluster: str, generation: int, *, hub_domain: str = HUB_DOMAIN) -> None:
    """After fencing (its orphans stopped), the site takes its lease back under the hub's ``generation``."""
    try:
        kv = await _hub_leases(site, hub_domain)
        stored, revision = await _read(kv, cluster)
        if stored is None or stored.generation != generation:
            raise TemporaryError(f"{cluster}'s lease moved to generation "
                                 f"{None if stored is None else stored.generation} meanwhile: fence again", delay=0.0)
        await _write_across(site, cluster, SiteLease(generation), last=revision, hub_domain=hub_domain)
    except UNAVAILABLE as exc:
        raise unavailable(f"rejoining {cluster}'s lease on the hub", exc) from exc


async def leases(hub: Bus) -> dict[str, tuple[SiteLease, int]]:
    """Every site's lease on the hub with its revision."""
    try:
        kv = await hub.kv(LEASES)
        # from the stream's per-subject state: nats-py's kv.keys() may end its watch before the first delivery
        # is counted and answer a partial (or empty) list under load
        names = await kvstore.matching_keys(hub, LEASES, ">")
        out: dict[str, tuple[SiteLease, int]] = {}
        for name in names:
            got, revision = await _read(kv, name)
            if got is not None:
                out[name] = (got, revision)
        return out
    except UNAVAILABLE as exc:
        raise unavailable(f"reading the hub's {LEASES}", exc) from exc


async def declare_lost(hub: Bus, cluster: str, lease: SiteLease, revision: int) -> SiteLease | None:
    """The hub's fence: the lease it judged expired, written lost under the next generation by compare-and-set on
    the revision it judged. None when the site renewed meanwhile (then it is not lost)."""
    new = siteleases.declare_lost(siteleases.Lease(cluster, lease.generation, lease.lost))
    written = SiteLease(new.generation, True)
    try:
        kv = await hub.kv(LEASES)
        await kv.update(cluster, msgspec.json.encode(written), last=revision)
    except UNAVAILABLE as exc:
        if conflicted(exc):
            return None
        raise unavailable(f"declaring {cluster} lost", exc) from exc
    return written


class LeaseClock:
    """When the hub saw each lease's revision change, by its own clock: the ``renewed`` of ``siteleases.Lease``.
    A lease first seen after the hub started counts as never renewed (silence from the hub's start)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float | None]] = {}

    def observe(self, current: dict[str, tuple[SiteLease, int]], now: float) -> list[siteleases.Lease]:
        out = []
        for cluster, (lease, revision) in sorted(current.items()):
            before = self._seen.get(cluster)
            if before is None:
                renewed = None  # first seen: silent since the hub started, at the earliest (``siteleases.silent``)
            elif before[0] != revision:
                renewed = now
            else:
                renewed = before[1]
            self._seen[cluster] = (revision, renewed)
            out.append(siteleases.Lease(cluster, lease.generation, lease.lost, renewed))
        return out


# The hub's dispatch records (services/dispatcher/record.py keeps them), as a returning site reads them to find its
# orphans: only the chosen cluster.
DISPATCH_BUCKET = "dispatch"


def dispatch_key(run_id: str, attempt: int) -> str:
    return f"run.{run_id}.a{attempt}"


class _Chosen(msgspec.Struct):
    chosen: str = ""


async def chosen_at_hub(site: Bus, keys: set[str], *, hub_domain: str = HUB_DOMAIN) -> dict[str, str]:
    """The cluster the hub has chosen for each run attempt (``dispatch_key``), read across the link; a key with no
    record is absent."""
    out: dict[str, str] = {}
    try:
        kv = await site.nc.jetstream(domain=hub_domain, timeout=5).key_value(DISPATCH_BUCKET)
        for k in sorted(keys):
            try:
                entry = await kv.get(k)
            except KEY_ABSENT:
                continue
            out[k] = msgspec.json.decode(entry.value or b"{}", type=_Chosen).chosen
    except UNAVAILABLE as exc:
        raise unavailable("reading the hub's dispatch records", exc) from exc
    return out
