"""``python -m taugrid.sources.fetch``: the init container that puts a run's submitted project into its pod.

Reads the snapshot object (``TAU_SOURCE_OBJECT``) from the ``sources`` object store over NATS
(``TAU_NATS_URL``, optional credentials file ``TAU_NATS_CREDS``), checks its SHA-256 against
``TAU_SOURCE_DIGEST`` (the pod's ``taugrid.io/source-digest`` annotation, through the downward API) and unpacks
it into ``TAU_SOURCE_DIR``, by default its working directory (the ``emptyDir`` that the main containers mount
as theirs).

Invariants: nothing is unpacked unless the whole archive matched the digest; the archive is streamed to disk,
so memory does not grow with the project; entries that would land outside the directory (absolute paths,
``..``, links, devices) are refused by the tar ``data`` filter. On failure the process exits 1 with one line
saying why, on stderr and in the container's termination message (``TAU_TERMINATION_MESSAGE_PATH``), which
Kubernetes puts in the pod status and ``tau status`` shows. An unreachable bus is retried for
``TAU_SOURCE_FETCH_TIMEOUT`` seconds (default 120) before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import BinaryIO

from taugrid.bus.connection import Bus, connect
from taugrid.bus.objects import download
from taugrid.bus.topology import SOURCES_STORE
from taugrid.core.errors import NotFound, TemporaryError
from taugrid.settings import Settings, SettingsError, current

ARCHIVE_NAME = ".tau-source.tar.gz"


class FetchFailed(Exception):
    """The project cannot be put in place; the message is the one line the pod fails with."""


class _HashingWriter:
    """A file that hashes what is written to it (nats-py writes chunk by chunk)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.f.write(data)


async def fetch(bus: Bus, *, object_name: str, digest: str, dest: Path) -> int:
    """Download, verify and unpack; returns the number of files unpacked. Raises ``FetchFailed``."""
    if not digest.startswith("sha256:") or len(digest) != len("sha256:") + 64:
        raise FetchFailed(f"source digest {digest!r} is not sha256:<64 hex> (taugrid.io/source-digest annotation)")
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / ARCHIVE_NAME
    try:
        with open(archive, "wb") as f:
            writer = _HashingWriter(f)
            try:
                await download(bus, object_name, writer, store=SOURCES_STORE)  # type: ignore[arg-type]
            except NotFound as exc:
                raise FetchFailed(
                    f"source snapshot {object_name} not found in the object store ({exc}); submit the run again"
                ) from exc
        got = "sha256:" + writer.sha.hexdigest()
        if got != digest:
            raise FetchFailed(
                f"source snapshot {object_name} has digest {got}, but this pod expects {digest}; "
                "refusing to run code that is not what was submitted"
            )
        try:
            with tarfile.open(archive, mode="r:gz") as tar:
                members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
                tar.extractall(dest, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise FetchFailed(f"source snapshot {object_name} cannot be unpacked into {dest}: {exc}") from exc
        return sum(1 for m in members if m.isfile())
    finally:
        archive.unlink(missing_ok=True)


async def _connect_within(url: str, timeout_s: float) -> Bus:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await connect(url, name="sourcefetch", max_reconnect_attempts=3)
        except TemporaryError as exc:
            if time.monotonic() >= deadline:
                raise FetchFailed(f"cannot reach the bus at {url} after {timeout_s:g}s: {exc}") from exc
            await asyncio.sleep(1.0)


async def run(given: Settings) -> str:
    """Fetch as the settings say (``source_fetch``, the bus's); returns the success line."""
    wanted = given.source_fetch
    missing = [k for k, v in (("TAU_SOURCE_OBJECT", wanted.object), ("TAU_SOURCE_DIGEST", wanted.digest)) if not v]
    if missing:
        raise FetchFailed(f"source fetch misconfigured: {', '.join(missing)} not set")
    dest = wanted.dir or Path(os.getcwd())
    timeout_s = wanted.timeout_s
    bus = await _connect_within(given.bus.url, timeout_s)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                files = await fetch(bus, object_name=wanted.object, digest=wanted.digest, dest=dest)
                break
            except TemporaryError as exc:
                if time.monotonic() >= deadline:
                    raise FetchFailed(f"source snapshot {wanted.object}: {exc}") from exc
                await asyncio.sleep(1.0)
    finally:
        await bus.close()
    return f"source {wanted.digest}: {files} files in {dest}"


def _report(line: str, path: Path | None) -> None:
    print(line, file=sys.stderr, flush=True)
    if path is not None:
        with contextlib.suppress(OSError):  # not in a pod (or no writable termination log): stderr carries it
            path.write_text(line + "\n")


def main() -> int:
    try:
        given = current()
    except SettingsError as exc:
        _report(f"source fetch failed: {exc}", None)
        return 1
    try:
        print(asyncio.run(run(given)), flush=True)
    except FetchFailed as exc:
        _report(f"source fetch failed: {exc}", given.source_fetch.termination_message_path)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
