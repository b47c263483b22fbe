"""The source-fetch init container (`python -m taugrid.sources.fetch`), run as the pod would run it, against a
real nats-server: the submitted snapshot unpacks; a wrong digest or a missing object fails with its reason on
stderr and in the termination message."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

from taugrid.bus import Bus
from taugrid.bus.topology import SOURCES_STORE
from taugrid.sources.archive import snapshot, source_object


def _project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("import pkg.util\nprint('hello')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text("VALUE = 42\n")
    return root


async def _stored(bus: Bus, root: Path) -> tuple[str, str]:
    data, digest = snapshot(root)
    name = source_object(digest)
    await (await bus.objects(SOURCES_STORE)).put(name, data)
    return name, digest


async def _fetch(nats_url: str, *, obj: str, digest: str, dest: Path, term: Path) -> tuple[int, str, str]:
    """As the init container runs: in the volume (its workingDir), with the pod's env."""
    env = {
        "PATH": "/usr/bin:/bin",
        "TAU_NATS_URL": nats_url,
        "TAU_SOURCE_OBJECT": obj,
        "TAU_SOURCE_DIGEST": digest,
        "TAU_TERMINATION_MESSAGE_PATH": str(term),
        "TAU_SOURCE_FETCH_TIMEOUT": "5",
    }
    dest.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "taugrid.sources.fetch", env=env, cwd=dest,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return int(proc.returncode or 0), out.decode(), err.decode()


async def test_the_submitted_snapshot_unpacks_into_the_source_dir(bus: Bus, nats_url: str, tmp_path: Path) -> None:
    name, digest = await _stored(bus, _project(tmp_path / "project"))
    dest = tmp_path / "pod" / "source"
    rc, out, err = await _fetch(nats_url, obj=name, digest=digest, dest=dest, term=tmp_path / "term")
    assert (rc, err) == (0, "")
    assert out.strip() == f"source {digest}: 3 files in {dest}"
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["pkg/__init__.py", "pkg/util.py", "train.py"]
    assert (dest / "pkg" / "util.py").read_text() == "VALUE = 42\n"
    assert not (tmp_path / "term").exists()


async def test_a_digest_mismatch_fails_with_the_reason_and_unpacks_nothing(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    name, digest = await _stored(bus, _project(tmp_path / "project"))
    expected = "sha256:" + "0" * 64
    dest, term = tmp_path / "pod" / "source", tmp_path / "term"
    rc, out, err = await _fetch(nats_url, obj=name, digest=expected, dest=dest, term=term)
    line = (
        f"source fetch failed: source snapshot {name} has digest {digest}, but this pod expects {expected}; "
        "refusing to run code that is not what was submitted"
    )
    assert (rc, out, err) == (1, "", line + "\n")
    assert term.read_text() == line + "\n"
    assert list(dest.iterdir()) == []


async def test_a_replaced_object_fails_with_the_reason_and_unpacks_nothing(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    name, digest = await _stored(bus, _project(tmp_path / "project"))
    forged = b"someone else's code"
    await (await bus.objects(SOURCES_STORE)).put(name, forged)  # the same name, other bytes
    dest, term = tmp_path / "pod" / "source", tmp_path / "term"
    rc, out, err = await _fetch(nats_url, obj=name, digest=digest, dest=dest, term=term)
    line = (
        f"source fetch failed: source snapshot {name} has digest sha256:{hashlib.sha256(forged).hexdigest()}, "
        f"but this pod expects {digest}; refusing to run code that is not what was submitted"
    )
    assert (rc, out, err) == (1, "", line + "\n")
    assert list(dest.iterdir()) == []


async def test_a_missing_object_fails_with_the_reason(bus: Bus, nats_url: str, tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    name = source_object(digest)
    term = tmp_path / "term"
    rc, out, err = await _fetch(nats_url, obj=name, digest=digest, dest=tmp_path / "src", term=term)
    line = (
        f"source fetch failed: source snapshot {name} not found in the object store "
        f"(object {name!r} is not in the object store); submit the run again"
    )
    assert (rc, out, err) == (1, "", line + "\n")
    assert term.read_text() == line + "\n"
