"""Sealed evidence archived out of the bus: to a directory (one machine) or an S3-compatible object store.

Set by ``platform.yaml``'s ``retention.evidence.archive`` (``taugrid.config.retention``). At each seal the evidence
service copies the run's bundle and the objects it names under ``runs/<run>/`` (separately stored logs, kept
outputs) into the archive, reads each copy back and checks it, and only then deletes them from the bus. The base
the bundle is stored against (``bases.py``, shared by the workspace's bundles) is copied too and stays on the
bus: content-addressed and write-once in both places, it is never deleted, so no other bundle loses it. The bus
keeps the run's ledger, whose seal holds the bundle's digest, and AUDIT keeps ``evidence.sealed`` with the same
digest: that is what verifies the archived bundle, and the bundle's sha256 of each log verifies the logs, so an
archive that was changed fails ``tau verify`` (``verify.py``), wherever it is read from.

Invariants:
- Write-once: an object already in the archive is never replaced; one whose bytes differ from what is being
  archived stops the archiving (``ArchiveConflict``) and the bus keeps its copy.
- The bus copy is deleted only after the archive's copy was read back equal to it; a bundle on the bus that does
  not hash to its seal's digest is never archived (nor deleted).
- Readers (``read_object``) try the bus first, then the archive: the same names, the same bytes, the same checks.
- Only the evidence service writes: the directory is created 0750 and refused when it is not its own or anyone
  else may write it; its files are 0440. On S3 the bucket's policy grants writes to the evidence service's
  credentials only (readers get read-only ones); the digest check catches any change that slips past it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Protocol

import msgspec

from taugrid.bus import objects
from taugrid.bus.connection import Bus
from taugrid.bus.platformread import shared_reader
from taugrid.config.retention import Archive
from taugrid.core.errors import ConfigError, PermanentError, TemporaryError
from taugrid.core.ids import token
from taugrid.evidence import bundle as b
from taugrid.evidence import ledger as lg
from taugrid.evidence import packing

RETRY_S = 5.0  # an archive that cannot be written now (a server away, a directory to fix): the seal retries


class ArchiveConflict(PermanentError):
    """The archive holds other bytes under a name being archived: never overwritten."""


class ArchiveStore(Protocol):
    where: str

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes | None: ...


def _safe_name(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PermanentError(f"object name {name!r} cannot be archived (an empty, absolute or .. part)")
    return name


class DirectoryStore:
    """Files under ``root``; every object written once (link from a private temporary file, 0440)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.where = f"directory {root}"

    def _checked_root(self) -> Path:
        try:
            self.root.mkdir(mode=0o750, parents=True, exist_ok=True)
            st = os.lstat(self.root)
        except OSError as exc:
            raise TemporaryError(f"evidence archive {self.root}: {exc}; create it for the evidence service's user "
                                 f"(mode 0750)", delay=RETRY_S) from exc
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise TemporaryError(f"evidence archive {self.root} is not a directory (a link or a file); "
                                 f"point retention.evidence.archive.directory at a real directory", delay=RETRY_S)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise TemporaryError(f"evidence archive {self.root} may be written by others (owner uid {st.st_uid}, "
                                 f"mode {stat.S_IMODE(st.st_mode):o}); only the evidence service may write it: "
                                 f"chown it to uid {os.geteuid()} and chmod 0750", delay=RETRY_S)
        return self.root

    def put(self, name: str, data: bytes) -> None:
        root = self._checked_root()
        path = root / _safe_name(name)
        try:
            self._put(path, data)
        except FileExistsError:
            if path.read_bytes() != data:
                raise ArchiveConflict(f"{self.where}: {name} holds other bytes; it is never overwritten (the bus "
                                      f"keeps its copy): look into who changed it") from None
        except OSError as exc:  # a full disk, a folder made unwritable: the seal retries, the bus keeps its copy
            raise TemporaryError(f"{self.where}: writing {name}: {exc}", delay=RETRY_S) from exc

    @staticmethod
    def _put(path: Path, data: bytes) -> None:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o440)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.link(tmp, path)  # FileExistsError when the name exists: never replaced
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, name: str) -> bytes | None:
        try:
            return (self.root / _safe_name(name)).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TemporaryError(f"reading {name} from the evidence archive {self.root}: {exc}", delay=1.0) from exc


class S3Store:
    """Objects under ``s3://bucket/prefix/``. boto3 (the ``s3`` extra) with the standard AWS credential chain."""

    def __init__(self, archive: Archive) -> None:
        assert archive.s3 is not None
        try:
            import boto3  # the s3 extra: only where an S3 archive is configured
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigError("retention.evidence.archive.s3 needs the S3 client: pip install 'taugrid[s3]' "
                              "(boto3)") from exc
        s3 = archive.s3
        self.bucket, self.prefix, self.where = s3.bucket, s3.prefix, archive.where()
        self.client: Any = boto3.client("s3", endpoint_url=s3.endpoint or None, region_name=s3.region,
                                        config=Config(retries={"max_attempts": 3}, connect_timeout=5,
                                                      read_timeout=30))

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{_safe_name(name)}" if self.prefix else _safe_name(name)

    def put(self, name: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            held = self.get(name)
            if held is None:
                # IfNoneMatch: a server with conditional writes refuses to replace an object created meanwhile
                self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data, IfNoneMatch="*")
                return
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise TemporaryError(f"{self.where}: writing {name}: {exc}", delay=RETRY_S) from exc
            held = self.get(name)
        except BotoCoreError as exc:
            raise TemporaryError(f"{self.where}: writing {name}: {exc}", delay=RETRY_S) from exc
        if held != data:
            raise ArchiveConflict(f"{self.where}: {name} holds other bytes; it is never overwritten (the bus keeps "
                                  f"its copy): look into who changed it")

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            return bytes(got["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise TemporaryError(f"{self.where}: reading {name}: {exc}", delay=1.0) from exc
        except BotoCoreError as exc:
            raise TemporaryError(f"{self.where}: reading {name}: {exc}", delay=1.0) from exc


def store_for(archive: Archive) -> ArchiveStore:
    return DirectoryStore(archive.directory) if archive.directory is not None else S3Store(archive)


# Stores are kept per archive setting.
_STORES: dict[str, ArchiveStore] = {}


async def configured(bus: Bus) -> ArchiveStore | None:
    """The archive the current platform names; None when it names none (or no platform is stored)."""
    reader = shared_reader(bus)  # the process's one reader: each revision parsed and held once
    platform = await reader.get_or_none()
    archive = platform.retention.evidence.archive if platform is not None else None
    if archive is None:
        return None
    key = archive.model_dump_json()
    if key not in _STORES:
        _STORES[key] = store_for(archive)
    return _STORES[key]


def _run_objects(doc: Any, run_id: str) -> list[str]:
    """Every object name the bundle refers to (an ``object`` field anywhere in it) under ``runs/<run>/``: its
    separately stored logs and kept outputs. Objects shared between runs stay on the bus."""
    prefix = f"runs/{token(run_id)}/"
    found: set[str] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            name = v.get("object")
            if isinstance(name, str) and name.startswith(prefix):
                found.add(name)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(doc)
    return sorted(found)


async def _copy(store: ArchiveStore, name: str, data: bytes) -> None:
    await asyncio.to_thread(store.put, name, data)
    back = await asyncio.to_thread(store.get, name)
    if back != data:
        raise TemporaryError(f"{store.where}: {name} read back differs from what was written", delay=RETRY_S)


async def archive_run(bus: Bus, ledger: lg.Ledger, store: ArchiveStore) -> list[str]:
    """Move a sealed run's bundle and its own objects into ``store``; the names moved (empty when the bus holds
    no bundle for it any more: archived before). Idempotent: a retry after any step finishes the move."""
    seal = ledger.seal
    if seal is None or not seal.digest:
        raise PermanentError(f"run {ledger.run_id} is not sealed: nothing to archive")
    name = seal.bundle or b.bundle_name(ledger.run_id)
    data = await objects.read(bus, name)  # as stored (``packing``): archived as it is
    if data is None:
        return []
    try:
        base = packing.base_of(data)
        base_stored = await _base(bus, store, base) if base else None
        dictionary = packing.dictionary_of(base, base_stored) if base_stored is not None else None
        canonical = packing.unpack(data, dictionary=dictionary)
    except packing.PackingError as exc:
        raise PermanentError(f"bundle {name} on the bus is damaged ({exc}): not archived") from exc
    if lg.sha256(canonical) != seal.digest:
        raise PermanentError(f"bundle {name} on the bus hashes to {lg.sha256(canonical)[:12]}…, sealed as "
                             f"{seal.digest[:12]}…: not archived (run `tau verify {ledger.run_id}`)")
    extra = _run_objects(msgspec.json.decode(canonical), ledger.run_id)
    held: dict[str, bytes] = {}
    for obj in extra:
        blob = await objects.read(bus, obj)
        if blob is None:
            blob = await asyncio.to_thread(store.get, obj)  # moved by an interrupted earlier try
            if blob is None:
                continue  # never stored (tau verify reports it as missing, as it would on the bus)
        held[obj] = blob
        await _copy(store, obj, blob)
    if base and base_stored is not None:  # copied, never removed: other bundles on the bus read with it
        await _copy(store, base, base_stored)
    await _copy(store, name, data)  # the bundle last: its presence in the archive means the run's objects are there
    for obj in extra:
        await objects.remove(bus, obj)
    await objects.remove(bus, name)
    return [*held, name]


async def _base(bus: Bus, store: ArchiveStore, name: str) -> bytes:
    """The base ``name`` as stored (``bases.py``): on the bus, where it stays, else in the archive already."""
    found = await objects.read(bus, name)
    if found is None:
        found = await asyncio.to_thread(store.get, name)
    if found is None:
        raise packing.PackingError(f"its base {name} is missing")
    return found


async def read_object(bus: Bus, name: str) -> tuple[bytes | None, str]:
    """(bytes as stored, where they were read: "" for the bus, else the archive in words) of an evidence object;
    (None, "") when neither holds it. Nothing is checked or unpacked here: the caller does (``verify.py``,
    ``store.read_bundle_bytes``)."""
    data = await objects.read(bus, name)
    if data is not None:
        return data, ""
    store = await configured(bus)
    if store is None:
        return None, ""
    got = await asyncio.to_thread(store.get, name)
    return (got, store.where) if got is not None else (None, "")
