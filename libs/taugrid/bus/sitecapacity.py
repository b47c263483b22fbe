"""Each site's capacity and usage on the hub (many clusters, docs §13d): the hub's ``site_capacity`` KV bucket,
one key per cluster holding its latest ``core.sitecapacity.SiteCapacity``, written by the site's local cluster
across its link when the record changed (``report``) and read by ``tau clusters`` and ``tau queue`` (``reports``).

Trust: a site writes only its own key. Its leaf user on the hub may publish ``$JS.hub.API.$KV.site_capacity.<its
cluster>`` and no other key of the bucket (``permissions.leaf_permissions``), so whatever its own server is told,
the hub stores nothing it says under another cluster's name; the figures themselves are the site's word.

Invariant: one value per key (history 1) of at most ``MAX_RECORD_BYTES``, so the bucket's size is one bounded
record per cluster, however often or however much a site writes; nothing here starts servers or keeps state.
"""

from __future__ import annotations

import dataclasses
import logging

import msgspec
from nats.js.api import StreamConfig

from taugrid.bus import kv
from taugrid.bus.bootstrap import kv_config
from taugrid.bus.connection import Bus
from taugrid.bus.errors import MISSING, NO_BUCKET, UNAVAILABLE, unavailable
from taugrid.bus.topology import SITE_CAPACITY_BUCKET
from taugrid.core.sitecapacity import SiteCapacity

BUCKET = SITE_CAPACITY_BUCKET
log = logging.getLogger("taugrid.bus")


# A record is a few hundred bytes per ClusterQueue; the server refuses a larger write, so a site cannot fill the
# hub's store through its one key (history 1: at most this much per cluster).
MAX_RECORD_BYTES = 64 * 1024


def bucket_config() -> StreamConfig:
    """The hub's bucket: one revision per cluster, as the bootstrap makes its own buckets, records of at most
    ``MAX_RECORD_BYTES``."""
    return dataclasses.replace(kv_config(BUCKET, history=1, replicas=1), max_msg_size=MAX_RECORD_BYTES)


async def provision_hub(hub: Bus) -> None:
    """The hub's ``site_capacity`` bucket, made once (``sites.provision_hub`` calls this for every cluster)."""
    try:
        await hub.js.key_value(BUCKET)
    except NO_BUCKET:
        try:
            await hub.js.add_stream(bucket_config())
        except UNAVAILABLE as exc:
            raise unavailable(f"creating the hub's {BUCKET} bucket", exc) from exc
    except UNAVAILABLE as exc:
        raise unavailable(f"reading the hub's {BUCKET} bucket", exc) from exc


async def provisioned(hub: Bus) -> bool:
    """Whether this server is a hub whose sites were provisioned (it has the bucket): a platform may name clusters
    on a stack that does not run them (applied but not restarted yet, or a chart release not upgraded with them
    since), whose queues are then its own backend's."""
    try:
        await hub.kv(BUCKET)
    except NO_BUCKET:
        return False
    except UNAVAILABLE as exc:
        raise unavailable(f"reading the hub's {BUCKET} bucket", exc) from exc
    return True


async def report(site: Bus, cluster: str, record: SiteCapacity, *, hub_domain: str) -> None:
    """Write ``cluster``'s record into the hub's bucket from the site's server: through the hub domain's API
    prefix (the server maps it onto the bucket's subject; a plain ``$KV.`` publish stays on the leaf), as a site
    renews its lease. Raises ``TemporaryError`` when the hub cannot be reached (the link is down)."""
    js = site.nc.jetstream(domain=hub_domain, timeout=5)
    try:
        await js.publish(f"$JS.{hub_domain}.API.$KV.{BUCKET}.{cluster}", msgspec.json.encode(record))
    except UNAVAILABLE as exc:
        raise unavailable(f"reporting {cluster}'s capacity to the hub", exc) from exc


async def reports(hub: Bus, clusters: list[str]) -> dict[str, SiteCapacity]:
    """The latest record of each of ``clusters`` that reported; a cluster with none (or no bucket: no site was
    ever provisioned) is absent, and a record that does not decode is logged and left out."""
    if not await provisioned(hub):  # no site was ever provisioned on this stack: nothing reported
        return {}
    out: dict[str, SiteCapacity] = {}
    for cluster in clusters:
        found = await kv.get(hub, BUCKET, cluster)
        if found is None:
            continue
        try:
            out[cluster] = msgspec.json.decode(found.value, type=SiteCapacity)
        except msgspec.DecodeError as exc:
            log.warning("cluster %s's capacity record does not decode, left out: %s", cluster, exc)
    return out


async def writes(hub: Bus) -> int:
    """How many records the sites have written into the hub's bucket since it was made (its stream's last
    sequence): what the reports cost the bus, for benchmarks; 0 without a bucket."""
    try:
        info = await hub.js.stream_info(f"KV_{BUCKET}")
    except MISSING:
        return 0
    except UNAVAILABLE as exc:
        raise unavailable(f"reading the hub's {BUCKET} bucket", exc) from exc
    return int(info.state.last_seq or 0)
