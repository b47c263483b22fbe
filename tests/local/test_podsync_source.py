"""A pod's source snapshot is fetched once per snapshot and digest (issue 30, item 2): the next pods of the same
runs get the verified bytes without a fetch, on a real nats-server."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from taugrid.bus import Bus
from taugrid.local.kubelet import Kubelet
from taugrid.local.lanelock import LaneLock
from taugrid.local.podspec import PodSpecError
from taugrid.local.podsync import PodSync
from taugrid.sources import snapshots
from taugrid.sources.archive import snapshot, source_object
from taugrid.sources.snapshots import SOURCES_STORE


async def _nothing(*_: Any) -> None:
    return None


async def test_a_snapshot_is_fetched_once_and_a_wrong_digest_is_still_refused(bus: Bus, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(f"print({tmp_path.name!r})\n")  # a snapshot of its own
    data, digest = snapshot(project)
    name = source_object(digest)
    await snapshots.upload(bus, name, data)
    assert await snapshots.promote(bus, name, digest, max_bytes=1 << 20) == digest
    sync = PodSync(bus, Kubelet(tmp_path / "pods"), node="n", gpu_memory_mb=0, lock=LaneLock(),
                   publish=_nothing, save=_nothing)
    assert await sync.source(name, digest) == data
    await (await bus.objects(SOURCES_STORE)).delete(name)  # a second fetch would now find nothing
    assert await sync.source(name, digest) == data  # the bytes verified by the first
    other = "sha256:" + hashlib.sha256(b"another").hexdigest()
    with pytest.raises(PodSpecError) as refused:
        await sync.source(name, other)
    assert refused.value.reason == "SourceMismatch"
