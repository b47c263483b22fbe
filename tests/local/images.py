"""A tiny container image built from this machine's own files, for tests that run pods through a real container
engine without a registry: ``podman import`` / ``docker import`` of a root filesystem holding the named programs and
the shared libraries they link (``ldd``), plus whole directories (a Python's standard library)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from taugrid.local.runtime import ENGINES


def _libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    return [w for line in out.splitlines() for w in line.split() if w.startswith("/")]


def rootfs_tar(programs: list[str], trees: tuple[str, ...] = ()) -> bytes:
    """A tar of a root filesystem: each program at its own path and as /bin/<name>, its libraries, the trees."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        added: set[str] = set()

        def add(path: str, arcname: str) -> None:
            if arcname not in added:
                added.add(arcname)
                tar.add(str(Path(path).resolve()), arcname=arcname.lstrip("/"), recursive=True)

        for name in programs:
            path = shutil.which(name) or name
            add(path, f"/bin/{Path(name).name}")
            for lib in _libs(str(Path(path).resolve())):
                add(lib, lib)
        for tree in trees:
            add(tree, tree)
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
    return buf.getvalue()


def working_engine(candidates: tuple[str, ...] = ENGINES) -> tuple[str, str]:
    """(engine, "") for the first engine that answers ``info``, else ("", why none does)."""
    for engine in candidates:
        if shutil.which(engine) is None:
            continue
        probe = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=60, check=False)
        if probe.returncode == 0:
            return engine, ""
    return "", f"no container engine answers `info` ({', '.join(candidates)})"


def build(engine: str, tag: str, programs: list[str], trees: tuple[str, ...] = ()) -> str:
    """Import the image and check that it runs (``sh -c 'exit 0'``); "" if it does, else the engine's words."""
    imported = subprocess.run([engine, "import", "-", tag], input=rootfs_tar(programs, trees),
                              capture_output=True, timeout=300, check=False)
    if imported.returncode != 0:
        return f"`{engine} import` failed: {imported.stderr.decode(errors='replace').strip()}"
    ran = subprocess.run([engine, "run", "--rm", tag, "/bin/sh", "-c", "exit 0"], capture_output=True, text=True,
                         timeout=120, check=False)
    return "" if ran.returncode == 0 else f"`{engine} run` of a local image fails here: {ran.stderr.strip()}"
