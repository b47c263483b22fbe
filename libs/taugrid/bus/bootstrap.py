"""Provision every stream, the AUDIT mirror, KV buckets, the object store and service consumers.

Idempotent: run it any number of times. Existing streams are updated in place to the declared config;
existing consumers are left as they are (JetStream does not allow changing most consumer fields).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys

import nats
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)

from taugrid.bus.connection import Bus, connect
from taugrid.bus.topology import (
    AUDIT_MAX_AGE,
    AUDIT_STREAM,
    CONSUMERS,
    KV_BUCKETS,
    OBJECT_STORE,
    SOURCES_STORE,
    STREAMS,
    ConsumerSpec,
)


async def _ensure_stream(bus: Bus, config: StreamConfig) -> None:
    try:
        await bus.js.stream_info(config.name or "")
    except nats.js.errors.NotFoundError:
        await bus.js.add_stream(config)
        return
    if config.mirror is None:
        await bus.js.update_stream(config)


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=spec.durable,
        description=spec.description or None,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subjects=spec.filters if len(spec.filters) > 1 else None,
        filter_subject=spec.filters[0] if len(spec.filters) == 1 else None,
        max_deliver=spec.max_deliver,
        ack_wait=spec.ack_wait,
        max_ack_pending=spec.max_ack_pending,
    )


async def ensure_consumer(bus: Bus, spec: ConsumerSpec) -> None:
    try:
        await bus.js.consumer_info(spec.stream, spec.durable)
    except nats.js.errors.NotFoundError:
        await bus.js.add_consumer(spec.stream, consumer_config(spec))


async def _allow_direct(bus: Bus, stream: str) -> None:
    """Reads by key must be direct gets (the key in the request subject) so permissions can confine them to
    some keys; buckets made before that get it turned on."""
    info = await bus.js.stream_info(stream)
    if not info.config.allow_direct:
        await bus.js.update_stream(dataclasses.replace(info.config, allow_direct=True))


async def bootstrap(bus: Bus) -> None:
    for s in STREAMS:
        await _ensure_stream(bus, StreamConfig(
            name=s.name, subjects=s.subjects, retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
            max_age=s.max_age, duplicate_window=s.duplicate_window, max_bytes=s.max_bytes,
            discard=DiscardPolicy.OLD,
        ))
    # AUDIT mirrors RUNS; deletes and purges are denied so an auditor's replay is complete.
    await _ensure_stream(bus, StreamConfig(
        name=AUDIT_STREAM, mirror=StreamSource(name="RUNS"), storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS, max_age=AUDIT_MAX_AGE, deny_delete=True, deny_purge=True,
    ))
    for bucket, history in KV_BUCKETS.items():
        try:
            await bus.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            await bus.js.create_key_value(KeyValueConfig(bucket=bucket, history=history, storage=StorageType.FILE,
                                                         direct=True))
        await _allow_direct(bus, f"KV_{bucket}")
    for store in (OBJECT_STORE, SOURCES_STORE):
        try:
            await bus.js.object_store(store)
        except nats.js.errors.BucketNotFoundError:
            await bus.js.create_object_store(store, ObjectStoreConfig(storage=StorageType.FILE))
    for spec in CONSUMERS.values():
        await ensure_consumer(bus, spec)


async def _main(url: str | None) -> None:
    bus = await connect(url, name="bootstrap")
    try:
        await bootstrap(bus)
    finally:
        await bus.close()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1] if len(sys.argv) > 1 else None))
