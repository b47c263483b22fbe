"""The rendered manifests of a run's attempts, stored once by digest until the run is sealed (issue 27 item 2).

``render.applied`` carried each attempt's manifests whole (~2 KB of a trivial run's ~9 KB in RUNS, kept 30 days),
a copy of what BACKEND's apply carries to the backend and the evidence bundle seals. The renderer now puts them
here, in the ``manifests`` KV bucket under ``run.<ws>.<run>.<hex>`` (``hex``: the sha256 of their canonical JSON,
the digest ``render.applied`` signs, ``render.manifest_digest``), deflated; the event carries the digest and
leaves ``manifests`` at its default, empty. The evidence reads them at the seal (``read``), keeps them in the
bundle only when they hash to that digest, and purges the run's keys once its ledger is written (``release``):
a sealed run keeps its manifests in its bundle alone.

Trust: only the renderer writes the bucket (the evidence may purge it; operators' identities may do anything),
and a reader checks the digest whoever wrote the value: the bytes stored are the canonical JSON itself, so a
value that does not hash to the digest the renderer signed is refused, never read as the run's manifests.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable
from typing import Any

import msgspec

from taugrid.bus import kv
from taugrid.bus.connection import Bus
from taugrid.core.ids import token

BUCKET = "manifests"
DIGEST_PREFIX = "sha256:"
# A purge marker tells only a live watcher, and nothing watches this bucket: the server removes it after this, the
# shortest per-message TTL it takes (a delete marker stayed forever, an indexed subject per run: issue 27).
MARKER_TTL_S = 1.0
MAX_BYTES = 8 * 1024 * 1024  # inflated: far above any run's manifests (an event carried them under 1 MiB)


def key(workspace: str, run_id: str, digest: str) -> str:
    return f"run.{token(workspace)}.{token(run_id)}.{digest.removeprefix(DIGEST_PREFIX)}"


def pack(canonical: bytes) -> bytes:
    return zlib.compress(canonical, 6)


def unpack(stored: bytes) -> bytes:
    """The canonical JSON a value holds; ValueError when it does not inflate within ``MAX_BYTES``."""
    return kv.inflate_bounded(stored, MAX_BYTES)


async def put(bus: Bus, workspace: str, run_id: str, canonical: bytes) -> str:
    """Store one attempt's manifests (their canonical JSON, ``render.canonical_json``); returns their digest, the
    one ``render.applied`` carries. A repeat (a redelivered render) writes the same bytes under the same key."""
    digest = DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest()
    await kv.put(bus, BUCKET, key(workspace, run_id, digest), pack(canonical))
    return digest


async def read(bus: Bus, workspace: str, run_id: str, digest: str) -> list[dict[str, Any]] | str:
    """The manifests ``digest`` names, checked against it; else why they cannot be had (said in the bundle)."""
    if not digest.startswith(DIGEST_PREFIX) or len(digest) != len(DIGEST_PREFIX) + 64:
        return f"render.applied names no sha256 digest ({digest!r})"
    name = f"{BUCKET}/{key(workspace, run_id, digest)}"
    found = await kv.get(bus, BUCKET, key(workspace, run_id, digest))
    if found is None:
        return f"{name} is not stored (purged at an earlier seal, or never written)"
    try:
        canonical = unpack(found.value)
    except ValueError as exc:
        return f"{name} {exc}"
    if DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest() != digest:
        return f"{name} does not hash to the digest render.applied signed: refused"
    try:
        manifests = msgspec.json.decode(canonical)
    except msgspec.DecodeError as exc:
        return f"{name} is not JSON: {exc}"
    if not isinstance(manifests, list) or not all(isinstance(m, dict) for m in manifests):
        return f"{name} is not a list of manifests"
    return manifests


async def release(bus: Bus, workspace: str, run_id: str, digests: Iterable[str] | None = None) -> int:
    """Purge the run's stored manifests: once its bundle and ledger are written nothing reads them. ``digests``:
    those of its ``render.applied`` events, when the caller has them (one purge each, no listing: issue 30 counts
    every request a run makes); None lists the run's keys first. Returns how many keys were purged; a redelivery
    within ``MARKER_TTL_S`` purges a marker again, which only renews it."""
    if digests is None:
        names = await kv.matching_keys(bus, BUCKET, f"run.{token(workspace)}.{token(run_id)}.*")
    else:
        names = sorted({key(workspace, run_id, d) for d in digests if d.startswith(DIGEST_PREFIX)})
    for name in names:
        await kv.purge(bus, BUCKET, name, marker_ttl=MARKER_TTL_S)
    return len(names)
