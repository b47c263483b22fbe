"""Pod directories on this machine and the shims that run them (``taugrid.local.shim``): files only, no policy.

``<root>/<pod>/`` holds ``pod.json`` (the manifest as given), ``spec.json`` (what the shim runs), ``shim.pid``,
``state.json`` (the shim's progress; ``done`` once finished), ``stop`` (a stop request), ``work/`` (the stand-in
for the image's working directory), ``volumes/<name>/`` (``emptyDir``, ``configMap`` and ``secret`` volumes) and
``logs/<container>.log`` (CRI log format). Everything needed to re-adopt a pod after a restart is on disk.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

MAX_LOG_CHUNK = 256 * 1024


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists and is not a zombie (signal 0 probes without signalling)."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class LogLine:
    time: str  # RFC3339 with nanoseconds, when the shim read the line
    text: str


def read_log_file(path: Path, offset: int, *, final: bool = False) -> tuple[list[LogLine], int]:
    """Complete lines of a CRI-format log from byte ``offset``: partial (P) records are joined with the record that
    completes them and wait for it unless ``final`` (the container has finished). Returns the lines and the offset
    to read from next."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(MAX_LOG_CHUNK)
    except OSError:
        return [], offset
    lines: list[LogLine] = []
    pending: list[bytes] = []
    pending_time = ""
    consumed = 0
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        record = data[pos:nl]
        pos = nl + 1
        when, _, rest = record.partition(b" ")
        _stream, _, rest = rest.partition(b" ")
        tag, _, text = rest.partition(b" ")
        pending_time = pending_time or when.decode()
        pending.append(text)
        if tag == b"P":
            continue
        lines.append(LogLine(pending_time, b"".join(pending).decode(errors="replace")))
        pending, pending_time, consumed = [], "", pos
    if final and pending:
        lines.append(LogLine(pending_time, b"".join(pending).decode(errors="replace")))
        consumed = pos
    return lines, offset + consumed


class PodRunner:
    def __init__(self, root: Path, *, shared: bool = False) -> None:
        """``shared``: pods run as other OS users (``runas``), who must pass through ``root`` to their own pod's
        directory: it is then traverse-only (0711), each pod directory closed to other workspaces by the kubelet."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o711 if shared else 0o700)  # pods of every workspace live here: nobody else may list it
        self._shims: dict[str, subprocess.Popen[bytes]] = {}

    def dir(self, pod: str) -> Path:
        return self.root / pod

    def work(self, pod: str) -> Path:
        work = self.dir(pod) / "work"
        work.mkdir(parents=True, exist_ok=True)
        return work

    def unpack(self, pod: str, tar: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(tar), mode="r:*") as archive:
            archive.extractall(self.work(pod), filter="data")

    def manifest(self, pod: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir(pod) / "pod.json").read_text())
        except (OSError, ValueError):
            return None

    def write_manifest(self, pod: str, manifest: dict[str, Any]) -> None:
        d = self.dir(pod)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        (d / "pod.json").write_text(json.dumps(manifest))

    def clear(self, pod: str) -> None:
        shutil.rmtree(self.dir(pod), ignore_errors=True)
        self._shims.pop(pod, None)

    def launch(self, pod: str, spec: dict[str, Any], dirs: list[str], *, secrets: list[str] | None = None) -> None:
        """Start the pod's shim on ``spec`` (sealed: secret values replaced by placeholders); the ``secrets``
        go to the shim on its stdin, never to disk nor to its environment."""
        d = self.dir(pod)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in dirs:
            Path(path).mkdir(parents=True, exist_ok=True)
        (d / "spec.json").write_text(json.dumps(spec))
        shim = subprocess.Popen([sys.executable, "-m", "taugrid.local.shim", str(d)], start_new_session=True,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=open(d / "shim.log", "ab"))  # noqa: SIM115 - owned by the child
        assert shim.stdin is not None
        try:
            shim.stdin.write(json.dumps(secrets or []).encode())
            shim.stdin.close()
        except BrokenPipeError:
            pass  # the shim died at once: it is reported lost like any other
        self._shims[pod] = shim
        (d / "shim.pid").write_text(str(shim.pid))

    def launched(self, pod: str) -> bool:
        return (self.dir(pod) / "shim.pid").exists()

    def state(self, pod: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir(pod) / "state.json").read_text())
        except (OSError, ValueError):
            return None

    def write_state(self, pod: str, state: dict[str, Any]) -> None:
        tmp = self.dir(pod) / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.dir(pod) / "state.json")

    def shim_alive(self, pod: str) -> bool:
        shim = self._shims.get(pod)
        if shim is not None:
            return shim.poll() is None  # also reaps it
        try:
            return pid_alive(int((self.dir(pod) / "shim.pid").read_text()))
        except (OSError, ValueError):
            return False

    def stop(self, pod: str, *, reason: str, grace_s: float | None) -> None:
        d = self.dir(pod)
        if d.exists() and not (d / "stop").exists():
            (d / "stop").write_text(json.dumps({"reason": reason, "grace_s": grace_s}))

    def stop_requested(self, pod: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir(pod) / "stop").read_text() or "{}")
        except (OSError, ValueError):
            return None

    def kill_leftovers(self, state: dict[str, Any]) -> None:
        """A shim died: its containers' process groups must not outlive it."""
        for s in [*state.get("init", []), *state.get("containers", [])]:
            if "running" in s and s.get("pid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(s["pid"]), signal.SIGKILL)
            if "running" in s and s.get("engine_remove"):  # the engine's container outlives its client
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    subprocess.run(s["engine_remove"], capture_output=True, timeout=30, check=False)

    def log_path(self, pod: str, container: str) -> Path:
        return self.dir(pod) / "logs" / f"{container}.log"
