"""Provision every stream, HISTORY (every run event, one subject a run) and AUDIT (what verification needs of RUNS),
their feeds on RUNS, KV buckets, object stores and consumers.

Idempotent: run it any number of times. ``replicas`` (``--replicas N``, else ``TAU_BUS_REPLICAS``, else 1) is how
many servers of a JetStream cluster hold each stream, bucket and object store (3 for ``tau up --ha`` and the chart's
``nats.cluster.replicas: 3``: any one server may die); consumers follow their stream's count (a stream made with
another count keeps it). It only *creates*: the bootstrap identity may not change or delete a stream
(``permissions.STREAM_GUARD``), so an existing stream whose configuration differs from the declared one is reported,
not changed (``python -m taugrid.bus.bootstrap --update`` with the break-glass credentials changes it). AUDIT's
protective settings (it sources from RUNS, through its feeds, every kind ``topology.AUDIT_KEPT_EVENTS`` names and
nothing else, deny delete and purge, retention) are re-checked on every run and any difference raises an alarm
(``audit_drift``; logged at ERROR and returned); an earlier release's AUDIT, a mirror of all of RUNS, keeps more and
is only reported (``audit_notes``). An existing consumer gets the declared filter when its own differs (a release
narrowed it); its other fields are left as they are (JetStream does not allow changing most of them).

Retention (``platform.yaml``'s ``retention``, ``taugrid.config.retention``): RUNS' and LOGS' max age and size and
AUDIT's max age come from the platform stored in the ``platform`` KV when there is one (else the defaults, which are
the limits the streams always had); RUNS' are HISTORY's too (``retention.runs``). A stream is created with them; one
that exists and differs is reported like any other difference, and ``--update`` applies it (AUDIT's max age too: its
protections stay).

Interest retention (``topology.StreamSpec.interest``: RUNS, K8S, BACKEND): such a stream is made with its durables
right after it (it stores nothing that no durable's filter matches), RUNS with HISTORY's and AUDIT's feeds
(``topology.FEEDS``) too; one an earlier release made with limits retention is reported, and ``--update`` switches
it, the server then dropping every message its durables have all acked. An earlier release's RUNS is copied into
HISTORY from its first event; its AUDIT (a plain source per kept kind) is reported (``audit_notes``), and
``--update`` switches it to its feeds, which copy what it did not hold. A hub's BACKEND also has a feed per cluster
(``sites.provision_feed``, made by the sites' provisioning after this): the switch keeps what a feed has not acked
(a site down), and a request no durable reads ages out as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
from pathlib import Path

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamConsumerSource,
    StreamSource,
    SubjectTransform,
)

from taugrid import settings
from taugrid.bus.authors import publish_keys
from taugrid.bus.connection import Bus, connect
from taugrid.bus.errors import MISSING, NO_BUCKET, UNAVAILABLE
from taugrid.bus.topology import (
    AUDIT_DUPLICATE_WINDOW_S,
    AUDIT_FILTERS,
    AUDIT_MAX_AGE,
    AUDIT_STREAM,
    CONSUMERS,
    FEEDS,
    HISTORY_STREAM,
    KV_BUCKETS,
    OBJECT_STORE,
    SOURCES_STORE,
    STORE_DUPLICATE_WINDOW_S,
    STREAMS,
    UPLOADS_STORE,
    UPLOADS_TTL_S,
    ConsumerSpec,
    FeedSpec,
)
from taugrid.config.retention import Retention
from taugrid.core.errors import ConfigError, TauError

log = logging.getLogger("taugrid.bootstrap")

# the stream settings the bootstrap compares (the rest are server defaults or set by the server)
_COMPARED = ("subjects", "retention", "storage", "max_age", "duplicate_window", "max_bytes", "discard",
             "deny_delete", "deny_purge", "max_msgs", "allow_direct")


def _differences(want: StreamConfig, have: StreamConfig) -> list[str]:
    out = []
    for name in _COMPARED:
        wanted, got = getattr(want, name, None), getattr(have, name, None)
        if name == "max_msgs":
            wanted = wanted if wanted is not None else -1
            got = got if got is not None else -1
        unset = (0, -1, None)  # the server reports an unset limit as -1, 0 or nothing
        if wanted is None or wanted == got or (wanted in unset and got in unset):
            continue
        out.append(f"{name} is {_shown(got)!r}, declared {_shown(wanted)!r}")
    if want.mirror is not None and (have.mirror is None or have.mirror.name != want.mirror.name):
        out.append(f"mirror is {getattr(have.mirror, 'name', None)!r}, declared {want.mirror.name!r}")
    return out


def _shown(value: object) -> object:
    """A setting as the server writes it: an enum (retention, storage, discard) by its value."""
    return getattr(value, "value", value)


async def _ensure_stream(bus: Bus, config: StreamConfig, *, update: bool) -> list[str]:
    """Create the stream if missing; else the differences from its declared config (applied with ``update``,
    which only the break-glass identity may)."""
    try:
        info = await bus.js.stream_info(config.name or "")
    except MISSING:
        await bus.js.add_stream(config)
        return []
    diff = _differences(config, info.config)
    if diff and update and config.mirror is None:
        await bus.guarded(bus.js.update_stream(config))
        return []
    return diff


REPLICAS_ENV = "TAU_BUS_REPLICAS"


def feed_sources(into: str) -> list[StreamSource]:
    """The sources of ``into`` (HISTORY or AUDIT): RUNS through each of its feeds (``topology.FEEDS``), with the
    feed's transform to one subject a run."""
    out = []
    for feed in FEEDS:
        if feed.into == into:
            src, dest = feed.transform
            out.append(StreamSource(name="RUNS", consumer=StreamConsumerSource(name=feed.durable,
                                                                               deliver_subject=feed.deliver),
                                    subject_transforms=[SubjectTransform(src=src, dest=dest)]))
    return out


def audit_config(replicas: int = 1, max_age: float = AUDIT_MAX_AGE) -> StreamConfig:
    """AUDIT keeps what verification needs of RUNS (``topology.AUDIT_KEPT_EVENTS``): its feeds' filters, one
    subject a run (``topology.FEEDS``; not a mirror: ``topology.AUDIT_DUPLICATE_WINDOW_S`` says why); deletes and
    purges are denied so an auditor's replay is complete. No subjects of its own: nothing but RUNS writes into
    it."""
    return StreamConfig(
        name=AUDIT_STREAM, sources=feed_sources(AUDIT_STREAM),
        storage=StorageType.FILE, retention=RetentionPolicy.LIMITS, max_age=max_age, deny_delete=True,
        deny_purge=True, duplicate_window=AUDIT_DUPLICATE_WINDOW_S, num_replicas=replicas,
        allow_direct=True,  # a run's kept events read back by their one subject (``history.run_events``)
    )


def history_config(replicas: int = 1, max_age: float = 30 * 86400.0, max_bytes: int = -1) -> StreamConfig:
    """HISTORY keeps every run event under one subject a run (``topology.FEEDS``) for RUNS' retention (the
    platform's ``retention.runs``); deletes and purges denied, as RUNS' were (``permissions.STREAM_GUARD``). No
    subjects of its own. Direct gets: a run's events are read back by their subject."""
    return StreamConfig(
        name=HISTORY_STREAM, sources=feed_sources(HISTORY_STREAM), storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS, max_age=max_age, max_bytes=max_bytes, discard=DiscardPolicy.OLD,
        deny_delete=True, deny_purge=True, allow_direct=True, duplicate_window=AUDIT_DUPLICATE_WINDOW_S,
        num_replicas=replicas,
    )


def feed_config(feed: FeedSpec, start: int = 0) -> ConsumerConfig:
    """A feed's push durable on RUNS: flow-control acks (the sourcing stream acks what it stored), from
    RUNS' first event (a RUNS an earlier release kept with limits retention is copied whole), or from ``start``."""
    return ConsumerConfig(
        durable_name=feed.durable, description=f"feeds {feed.into} (flow-control acks: RUNS keeps an event until "
                                               f"{feed.into} stored it)",
        deliver_subject=feed.deliver, ack_policy=AckPolicy.FLOW_CONTROL, flow_control=True, idle_heartbeat=1.0,
        max_ack_pending=10_000, deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start else DeliverPolicy.ALL,
        opt_start_seq=start or None, filter_subjects=list(feed.filters) if len(feed.filters) > 1 else None,
        filter_subject=feed.filters[0] if len(feed.filters) == 1 else None,
    )


async def ensure_feed(bus: Bus, feed: FeedSpec) -> None:
    """Create the feed's durable if missing (an AUDIT an earlier release made keeps the RUNS events it holds: its
    feed starts after the last of them); give an existing one the declared filters."""
    try:
        info = await bus.js.consumer_info("RUNS", feed.durable)
    except MISSING:
        start = await _audit_sourced_through(bus) + 1 if feed.into == AUDIT_STREAM else 0
        await bus.js.add_consumer("RUNS", feed_config(feed, start if start > 1 else 0))
        return
    have = list(info.config.filter_subjects or ([info.config.filter_subject] if info.config.filter_subject else []))
    if sorted(have) != sorted(feed.filters):
        log.info("feed %s: filter %s, declared %s; updating it", feed.durable, have, list(feed.filters))
        await bus.js.add_consumer("RUNS", dataclasses.replace(
            info.config, filter_subjects=list(feed.filters) if len(feed.filters) > 1 else None,
            filter_subject=feed.filters[0] if len(feed.filters) == 1 else None))


async def _audit_sourced_through(bus: Bus) -> int:
    """The RUNS sequence of the last event an existing AUDIT holds (0: none, or no AUDIT)."""
    from taugrid.bus import streams

    _, last = await streams.bounds(bus, AUDIT_STREAM)
    if not last:
        return 0
    ev = await streams.at(bus, AUDIT_STREAM, last)
    return ev.seq if ev is not None else 0


# AUDIT's settings that protect what it keeps (its duplicate window and direct gets protect nothing)
_AUDIT_COMPARED = ("retention", "storage", "max_age", "max_bytes", "discard", "deny_delete", "deny_purge", "max_msgs")


def _copied(have: StreamConfig, feeds: dict[str, list[str]] | None = None) -> list[str]:
    """The RUNS subjects AUDIT copies: its mirror's filters (all of RUNS without one), else its sources' filters;
    a source through a feed copies what the feed's durable delivers (``feeds``: durable → its filters)."""
    picked = [have.mirror] if have.mirror is not None else list(have.sources or [])
    out = []
    for src in picked:
        if src.name != "RUNS":
            continue
        through = getattr(src, "consumer", None)
        if through is not None:
            out += (feeds or {}).get(through.name, [])
            continue
        out += [t.src or ">" for t in src.subject_transforms] if src.subject_transforms else \
            [src.filter_subject or ">"]
    return out


def _covers(wide: str, narrow: str) -> bool:
    """Whether every subject the filter ``narrow`` matches also matches ``wide``."""
    w, n = wide.split("."), narrow.split(".")
    for i, tok in enumerate(w):
        if tok == ">":
            return i < len(n)
        if i >= len(n) or tok not in ("*", n[i]) or (tok != "*" and n[i] in ("*", ">")):
            return False
    return len(w) == len(n)


def _audit_differences(want: StreamConfig, have: StreamConfig,
                       feeds: dict[str, list[str]] | None = None) -> list[str]:
    out = [d for d in _differences(want, have) if d.split(" ", 1)[0] in _AUDIT_COMPARED]
    if have.mirror is not None and have.mirror.name != "RUNS":
        out.append(f"mirror is {have.mirror.name!r}, declared sources of 'RUNS'")
    foreign = sorted({s.name for s in have.sources or [] if s.name != "RUNS"})
    if foreign:
        out.append(f"sources {foreign} besides RUNS (their messages would read as run events)")
    if have.subjects:
        out.append(f"subjects is {have.subjects!r}, declared none (whoever may publish them writes into AUDIT)")
    copied = _copied(have, feeds)
    dropped = [f for f in AUDIT_FILTERS if not any(_covers(c, f) for c in copied)]
    if dropped:
        out.append(f"does not keep {', '.join(dropped)} (it copies {copied or 'nothing'} of RUNS), which "
                   "`tau verify` checks runs against")
    return out


def _plain_sources(have: StreamConfig) -> bool:
    """Whether AUDIT sources RUNS without its feeds (an earlier release's: one source per kept filter)."""
    return any(s.name == "RUNS" and getattr(s, "consumer", None) is None for s in have.sources or [])


def audit_notes(have: StreamConfig) -> list[str]:
    """What is worth saying about an AUDIT that keeps *more* than declared, or keeps it as an earlier release
    did (no alarm: it holds what verification needs)."""
    if have.mirror is None and _plain_sources(have):
        return [f"{AUDIT_STREAM} sources RUNS without its feeds (an earlier release made it): RUNS now lets an event "
                "go once its durables acked it, and such a source is no durable, so an event could go before it "
                "is copied while the server re-establishes the source. Switch it with the break-glass identity: "
                "python -m taugrid.bus.bootstrap --update (what it holds stays; its feeds copy RUNS' events after "
                "the last it holds)"]
    if have.mirror is not None and _copied(have) == [">"]:
        return [f"{AUDIT_STREAM} mirrors all of RUNS (an earlier release made it): every run event is stored twice "
                f"(~10 KB a run) where verification needs only {len(AUDIT_FILTERS)} kinds "
                "(topology.AUDIT_KEPT_EVENTS). A mirror's settings never change. To store less: once its events "
                "older than RUNS keeps are no longer needed, delete AUDIT with the break-glass identity and run "
                "python -m taugrid.bus.bootstrap, which makes the filtered one (then start a new anchor file: "
                "the old anchors record the old AUDIT's sequences)"]
    return []


async def audit_drift(bus: Bus, max_age: float = AUDIT_MAX_AGE) -> list[str]:
    """How AUDIT differs from its protective settings and the retention declared (``max_age``: the platform's
    ``retention.audit.max_age``); empty when it holds them; a missing AUDIT is drift too. An AUDIT that keeps
    more than declared (an earlier release's mirror of all of RUNS) is no drift: ``audit_notes``."""
    try:
        info = await bus.js.stream_info(AUDIT_STREAM)
    except MISSING:
        return [f"{AUDIT_STREAM} does not exist"]
    # What a feed delivers is its durable's filters, which only the bootstrap identity may set (``ensure_feed``
    # holds them to the declared ones; ``permissions.durable_guard`` refuses everyone else's create, and the
    # anchor, which calls this too, may not even read them): a source through a declared feed with the declared
    # transform copies the declared filters; any other source copies nothing counted.
    declared = {f.durable: f for f in FEEDS if f.into == AUDIT_STREAM}
    feeds: dict[str, list[str]] = {}
    for src in info.config.sources or []:
        through = getattr(src, "consumer", None)
        feed = declared.get(through.name) if src.name == "RUNS" and through is not None else None
        transforms = [(t.src, t.dest) for t in src.subject_transforms or []]
        if feed is not None and through is not None and through.deliver_subject == feed.deliver \
                and transforms == [feed.transform]:
            feeds[feed.durable] = list(feed.filters)
    return _audit_differences(audit_config(max_age=max_age), info.config, feeds)


async def _update_audit_age(bus: Bus, max_age: float) -> None:
    """Give AUDIT the declared max age (break-glass ``--update``): only the limit changes; its deny flags and an
    earlier release's mirror are kept as they are (their drift stays an alarm). An earlier release's plain sources
    are switched to its feeds, each restarted first after the last RUNS event AUDIT holds: the plain sources went
    on copying since the feed was made (``ensure_feed``), and what they copied is not copied again. (An event they
    copy in the moment between that restart and the switch comes again: AUDIT drops it as a duplicate when it
    carries a message id, else it is held twice and read once, ``auditread``.)"""
    info = await bus.js.stream_info(AUDIT_STREAM)
    config = info.config
    if config.mirror is None and _plain_sources(config):
        start = await _audit_sourced_through(bus) + 1
        for feed in FEEDS:
            if feed.into == AUDIT_STREAM:
                await bus.js.delete_consumer("RUNS", feed.durable)
                await bus.js.add_consumer("RUNS", feed_config(feed, start if start > 1 else 0))
        config = dataclasses.replace(config, sources=feed_sources(AUDIT_STREAM))
    if config.mirror is None and not config.allow_direct:  # readers fall back to a replay until then
        config = dataclasses.replace(config, allow_direct=True)
    if config != info.config or config.max_age != max_age:
        await bus.guarded(bus.js.update_stream(dataclasses.replace(config, max_age=max_age)))


async def _audit_alarms(bus: Bus, max_age: float) -> tuple[list[str], list[str]]:
    """(alarms, differences merely pending) of AUDIT against its declared settings. AUDIT keeping events *longer*
    than the platform now asks is a retention cut not applied yet (nothing is lost): reported like any stream's
    difference. Keeping them for less, or any other difference, is an alarm."""
    drift = await audit_drift(bus, max_age)
    try:
        have = (await bus.js.stream_info(AUDIT_STREAM)).config
    except MISSING:
        have = None
    kept = (have.max_age or 0.0) if have is not None else 0.0
    for note in audit_notes(have) if have is not None else []:
        log.warning("%s", note)
    age = f"max_age is {kept!r}, declared {max_age!r}"
    pending = [d for d in drift if d == age and kept > max_age]
    alarms = [f"ALARM: {AUDIT_STREAM} {d}" + ("" if d != age else " (the platform's retention.audit.max_age "
              "changed? apply it with the break-glass identity: python -m taugrid.bus.bootstrap --update)")
              for d in drift if d not in pending]
    return alarms, pending


_NO_PLATFORM: tuple[type[Exception], ...] = (TauError, *UNAVAILABLE)  # no grant, an invalid platform, a server away


async def stored_retention(bus: Bus) -> Retention:
    """The retention of the newest valid platform in the ``platform`` KV; the defaults when none is stored yet
    (a fresh bus: the bucket is made by this bootstrap) or it cannot be read."""
    from taugrid.bus.platformread import PlatformReader

    try:
        got = await PlatformReader(bus).get()
    except NO_BUCKET:
        return Retention()  # a fresh bus: no platform applied yet
    except _NO_PLATFORM as exc:
        log.warning("retention: no platform to read (%s); the streams get the default limits", exc)
        return Retention()
    return got[0].retention if got is not None else Retention()


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable,
        description=spec.description or None,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subjects=_filters(spec)[0],
        filter_subject=_filters(spec)[1],
        max_deliver=spec.max_deliver,
        ack_wait=spec.ack_wait,
        max_ack_pending=spec.max_ack_pending,
    )


async def ensure_consumer(bus: Bus, spec: ConsumerSpec) -> None:
    """Create the durable if missing; give an existing one the declared filter when it has another (the one
    field of a durable that a release changes, and one the server lets an update change: deliveries resume where
    the durable stands, under the new filter)."""
    try:
        info = await bus.js.consumer_info(spec.stream, spec.durable)
    except MISSING:
        await bus.js.add_consumer(spec.stream, consumer_config(spec))
        return
    have = list(info.config.filter_subjects or ([info.config.filter_subject] if info.config.filter_subject else []))
    if sorted(have) != sorted(spec.filters):
        log.info("consumer %s: filter %s, declared %s; updating it", spec.durable, have, spec.filters)
        many, one = _filters(spec)
        await bus.js.add_consumer(spec.stream, dataclasses.replace(info.config, filter_subjects=many,
                                                                   filter_subject=one))


def _filters(spec: ConsumerSpec) -> tuple[list[str] | None, str | None]:
    """(filter_subjects, filter_subject): the server takes one filter in the latter, several in the former."""
    return (spec.filters if len(spec.filters) > 1 else None, spec.filters[0] if len(spec.filters) == 1 else None)


def kv_config(bucket: str, *, history: int, replicas: int) -> StreamConfig:
    """A KV bucket's stream as nats-py makes it (``create_key_value``), but with ``STORE_DUPLICATE_WINDOW_S``,
    which nats-py fixes at 2 min; direct gets and per-message TTLs (``kv.create(ttl=)``, ``kv.purge``) allowed."""
    return StreamConfig(
        name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_direct=True, allow_rollup_hdrs=True,
        allow_msg_ttl=True, deny_delete=True, discard=DiscardPolicy.NEW, duplicate_window=STORE_DUPLICATE_WINDOW_S,
        max_consumers=-1, max_msgs=-1, max_msgs_per_subject=history, num_replicas=replicas, storage=StorageType.FILE,
    )


def object_store_config(store: str, *, ttl: float | None, replicas: int) -> StreamConfig:
    """An object store's stream as nats-py makes it (``create_object_store``), with ``STORE_DUPLICATE_WINDOW_S``."""
    return StreamConfig(
        name=f"OBJ_{store}", subjects=[f"$O.{store}.C.>", f"$O.{store}.M.>"], max_age=ttl, max_bytes=-1,
        storage=StorageType.FILE, num_replicas=replicas, discard=DiscardPolicy.NEW, allow_rollup_hdrs=True,
        allow_direct=True, duplicate_window=STORE_DUPLICATE_WINDOW_S,
    )


async def _kv_settings(bus: Bus, stream: str, *, history: int, update: bool) -> list[str]:
    """Reads by key must be direct gets (the key in the request subject) so permissions can confine them to
    some keys, and a bucket keeps the history declared for it (a bucket made with a deeper one keeps every older
    revision until then), takes per-message TTLs and has the stores' duplicate window; a bucket made before gets
    them (by the break-glass identity: ``update``). Lowering the history drops the older revisions the bucket
    holds."""
    info = await bus.js.stream_info(stream)
    config = info.config
    diff = []
    if not config.allow_direct:
        diff.append("allow_direct is False, declared True")
    if (config.max_msgs_per_subject or 0) != history:
        diff.append(f"history is {config.max_msgs_per_subject}, declared {history}")
    if not config.allow_msg_ttl:
        diff.append("allow_msg_ttl is False, declared True")
    diff += _window_difference(config)
    if diff and update:
        await bus.guarded(bus.js.update_stream(dataclasses.replace(
            config, allow_direct=True, max_msgs_per_subject=history, allow_msg_ttl=True,
            duplicate_window=STORE_DUPLICATE_WINDOW_S)))
        return []
    return diff


def _window_difference(config: StreamConfig) -> list[str]:
    if config.duplicate_window == STORE_DUPLICATE_WINDOW_S:
        return []
    return [f"duplicate_window is {config.duplicate_window!r}, declared {STORE_DUPLICATE_WINDOW_S!r}"]


async def _store_settings(bus: Bus, store: str, *, update: bool) -> list[str]:
    """An object store made before has the server's 2 min duplicate window: reported, set with ``update``."""
    config = (await bus.js.stream_info(f"OBJ_{store}")).config
    diff = _window_difference(config)
    if diff and update:
        await bus.guarded(bus.js.update_stream(dataclasses.replace(config,
                                                                   duplicate_window=STORE_DUPLICATE_WINDOW_S)))
        return []
    return diff


async def bootstrap(bus: Bus, *, update: bool = False, replicas: int | None = None,
                    retention: Retention | None = None) -> list[str]:
    """Provision what is missing; returns the alarms (AUDIT drift) and logs every difference it did not apply.
    ``replicas``: None reads ``TAU_BUS_REPLICAS``. ``retention``: None reads the stored platform's."""
    replicas = settings.current().bus.replicas if replicas is None else replicas
    limits = (retention if retention is not None else await stored_retention(bus)).stream_limits()
    drifted: dict[str, list[str]] = {}
    interest = {s.name for s in STREAMS if s.interest}
    for s in STREAMS:
        max_age, max_bytes = limits.get(s.name, (s.max_age, s.max_bytes))
        drifted[s.name] = await _ensure_stream(bus, StreamConfig(
            name=s.name, subjects=s.subjects, storage=StorageType.FILE,
            retention=RetentionPolicy.INTEREST if s.interest else RetentionPolicy.LIMITS,
            max_age=max_age, duplicate_window=s.duplicate_window, max_bytes=max_bytes,
            discard=DiscardPolicy.OLD, num_replicas=replicas, allow_direct=s.allow_direct or None,
        ), update=update)
        if s.interest:  # its durables at once: an interest stream does not store what no durable's filter matches
            for spec in CONSUMERS.values():
                if spec.stream == s.name:
                    await ensure_consumer(bus, spec)
            if s.name == "RUNS":  # before HISTORY and AUDIT: a source whose durable is missing retries ~12 s later
                for feed in FEEDS:
                    await ensure_feed(bus, feed)
    runs_age, runs_bytes = limits.get("RUNS", (30 * 86400.0, -1))
    drifted[HISTORY_STREAM] = await _ensure_stream(bus, history_config(replicas, runs_age, runs_bytes),
                                                   update=update)
    audit_age = limits[AUDIT_STREAM][0]
    await _ensure_stream(bus, audit_config(replicas, audit_age), update=False)  # AUDIT is never re-declared
    if update:
        await _update_audit_age(bus, audit_age)
    alarms, drifted[AUDIT_STREAM] = await _audit_alarms(bus, audit_age)
    for bucket, history in KV_BUCKETS.items():
        try:
            await bus.js.key_value(bucket)
        except NO_BUCKET:
            await bus.js.add_stream(kv_config(bucket, history=history, replicas=replicas))
        drifted[f"KV_{bucket}"] = await _kv_settings(bus, f"KV_{bucket}", history=history, update=update)
    for store, ttl in ((OBJECT_STORE, None), (SOURCES_STORE, None), (UPLOADS_STORE, UPLOADS_TTL_S)):
        try:
            await bus.js.object_store(store)
        except NO_BUCKET:
            await bus.js.add_stream(object_store_config(store, ttl=ttl, replicas=replicas))
        drifted[f"OBJ_{store}"] = await _store_settings(bus, store, update=update)
    for spec in CONSUMERS.values():
        if spec.stream not in interest:  # made above, right after their stream
            await ensure_consumer(bus, spec)
    for stream, diff in drifted.items():
        for d in diff:
            log.warning("stream %s: %s; not changed (apply with the break-glass identity: "
                        "python -m taugrid.bus.bootstrap --update)", stream, d)
    for alarm in alarms:
        log.error("%s", alarm)
    return alarms


async def record_local_admin(bus: Bus, value: str) -> bool:
    """Store ``TAU_LOCAL_ADMIN`` (``<name>:<public key>``, the chart's operator) as the platform's local user,
    so clients (``tau whoami``) know that person as a platform admin, as ``tau up`` does for its own."""
    from taugrid.bus.platformstore import LocalUser, put_local_user

    name, _, key = value.partition(":")
    if not (name and key):
        return False
    await put_local_user(bus, LocalUser(name=name, nkey=key))
    return True


def _service_keys(path: Path) -> dict[str, str]:
    """Each service's public key from ``identities.json`` (``tau admin chart-credentials``)."""
    try:
        services = json.loads(path.read_text())["services"]
        return {str(name): str(key) for name, key in services.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"--service-keys {path}: not an identities file written by `tau admin "
                          f"chart-credentials` ({exc!r}); fix: mount the credentials Secret's identities.json") from exc


def _file_retention(path: Path) -> Retention:
    """The retention of a platform.yaml about to be applied (the chart's bootstrap Job applies it after the bus
    exists, so the streams' first limits come from the file, not the defaults)."""
    from taugrid.config.platform import load_platform

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--platform {path}: {exc}; fix: mount the platform ConfigMap") from exc
    return load_platform(text, path=str(path)).retention


async def _main(url: str | None, *, update: bool, replicas: int | None, service_keys: Path | None,
                platform: Path | None = None) -> int:
    keys = _service_keys(service_keys) if service_keys is not None else {}
    retention = _file_retention(platform) if platform is not None else None
    bus = await connect(url, name="bootstrap")
    try:
        alarms = await bootstrap(bus, update=update, replicas=replicas, retention=retention)
        if keys:  # what every stage checks its events' signatures against (bus/authors.py)
            await publish_keys(bus, keys)
        await record_local_admin(bus, settings.current().bus.local_admin)
    finally:
        await bus.close()
    for alarm in alarms:
        print(alarm, file=sys.stderr)
    return 1 if alarms else 0


def main(argv: list[str] | None = None) -> int:
    import argparse  # here: every service imports this module, only this command line parses arguments

    ap = argparse.ArgumentParser(prog="python -m taugrid.bus.bootstrap", description=__doc__)
    ap.add_argument("url", nargs="?", help="the bus (default TAU_NATS_URL); several servers comma separated")
    ap.add_argument("--update", action="store_true", help="apply stream differences (break-glass identity)")
    ap.add_argument("--replicas", type=int, choices=range(1, 6), metavar="{1..5}",
                    help=f"servers holding each stream (default {REPLICAS_ENV}, else 1)")
    ap.add_argument("--service-keys", type=Path, metavar="IDENTITIES_JSON",
                    help="publish each service's public key from this identities.json (the chart's credentials "
                         "Secret): stages act only on events their owning service signed")
    ap.add_argument("--platform", type=Path, metavar="PLATFORM_YAML",
                    help="take the streams' retention from this platform.yaml (the one about to be applied) "
                         "instead of the one stored in the platform KV")
    args = ap.parse_args(argv)
    return asyncio.run(_main(args.url, update=args.update, replicas=args.replicas, service_keys=args.service_keys,
                             platform=args.platform))


if __name__ == "__main__":
    sys.exit(main())
