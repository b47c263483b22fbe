"""Pods as OS processes on this machine, each under its own shim (``taugrid.local.shim``).

A pod directory holds ``spec.json``, ``work/`` (the snapshot of the submitted project), ``output.log``,
``pid`` and, once finished, ``status.json``. Everything needed to re-adopt a pod after a restart is on disk.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

MAX_LOG_CHUNK = 256 * 1024


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (signal 0 probes without signalling)."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class PodRunner:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def dir(self, pod: str) -> Path:
        return self.root / pod

    def prepare(self, pod: str, source_tar: bytes | None) -> Path:
        work = self.dir(pod) / "work"
        work.mkdir(parents=True, exist_ok=True)
        if source_tar:
            with tarfile.open(fileobj=io.BytesIO(source_tar), mode="r:*") as tar:
                tar.extractall(work, filter="data")
        return work

    def start(self, pod: str, *, command: list[str], env: dict[str, str], cwd: Path, memory_limit: int,
              deadline_s: float | None, grace_s: float, hang_s: float = 0.0) -> None:
        d = self.dir(pod)
        for stale in ("status.json", "stop", "pid", "scratch.json"):
            (d / stale).unlink(missing_ok=True)
        (d / "spec.json").write_text(json.dumps({
            "command": command, "env": env, "cwd": str(cwd), "memory_limit": memory_limit,
            "deadline_s": deadline_s, "grace_s": grace_s, "hang_s": hang_s,
        }))
        subprocess.Popen([sys.executable, "-m", "taugrid.local.shim", str(d)], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(d / "shim.log", "ab"))

    def pid(self, pod: str) -> int | None:
        try:
            return int((self.dir(pod) / "pid").read_text())
        except (OSError, ValueError):
            return None

    def status(self, pod: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir(pod) / "status.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def stop(self, pod: str, reason: str) -> None:
        d = self.dir(pod)
        if d.exists() and not (d / "stop").exists():
            (d / "stop").write_text(reason)

    def alive(self, pod: str) -> bool:
        return pid_alive(self.pid(pod))

    def read_log(self, pod: str, offset: int) -> tuple[list[str], int]:
        """Complete lines written since ``offset``; a partial last line waits for its newline."""
        path = self.dir(pod) / "output.log"
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(MAX_LOG_CHUNK)
        except OSError:
            return [], offset
        cut = data.rfind(b"\n")
        if cut < 0:
            return [], offset
        chunk = data[: cut + 1]
        return chunk.decode(errors="replace").splitlines(), offset + len(chunk)

    def read_rest(self, pod: str, offset: int) -> tuple[list[str], int]:
        """Everything left, including a last line without a newline (the pod has finished)."""
        lines, offset = self.read_log(pod, offset)
        path = self.dir(pod) / "output.log"
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                tail = f.read()
        except OSError:
            tail = b""
        if tail:
            lines.extend(tail.decode(errors="replace").splitlines())
            offset += len(tail)
        return lines, offset
