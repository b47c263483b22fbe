"""The pod shim: one per pod, like containerd's shim, so a pod outlives a restart of whoever started it.

``python -m taugrid.local.shim POD_DIR`` reads ``spec.json`` (a :class:`taugrid.local.podspec.PodRun`), runs the
init containers one after another, each to success, then all containers together, each in its own session. It
enforces what a kubelet and the cgroup would: a container's memory limit (its process tree is SIGKILLed and
reported ``OOMKilled``), the pod's ``activeDeadlineSeconds`` (``DeadlineExceeded``), a stop request (file
``stop``: SIGTERM, then SIGKILL after the grace period) and, as a local extension, ``resilience.hang_timeout``
(no output from any container for that long: ``Hang``). A container whose spec names a ``uid`` runs as that OS
user with its group only (``taugrid.local.runas``); the shim itself keeps its own.

Output: each container's stdout and stderr, merged in arrival order, go to ``logs/<container>.log`` in the CRI
log format (``<RFC3339Nano> stdout F|P <text>``), so every line carries its timestamp. ``state.json`` is
rewritten atomically on every transition; ``"done": true`` in it means the pod has finished. Files the containers
wrote under the first container's working directory, when that is the pod's own scratch copy of the project,
are reported in ``scratch.json`` and as a last log line (``taugrid.local.scratch``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import psutil

from taugrid.core.quantity import human_bytes
from taugrid.core.redaction import Redactor
from taugrid.local import containers, scratch
from taugrid.local.sealing import redactor, unseal

POLL_S = 0.1
MAX_LINE = 16 * 1024  # longer lines are split into partial (P) records, as the CRI does
START_ERROR_EXIT = 128
ENGINE_COMMAND_TIMEOUT_S = 30.0


def rfc3339(at_ns: int) -> str:
    secs, nanos = divmod(at_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{nanos:09d}Z"


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
    except psutil.Error:
        return 0
    return total


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _pump(src: IO[bytes], log: IO[bytes], redact: Redactor) -> None:
    """Copy a container's output into its log, one timestamped record per line, secret values redacted.
    A line longer than ``MAX_LINE`` is cut into partial records; the last ``longest - 1`` bytes of each piece
    are carried into the next one, so a secret value that straddles a cut is still seen whole."""
    carry = b""
    while True:
        raw = src.readline(MAX_LINE)
        if not raw:
            if carry:
                _record(log, redact(carry), full=False)
            return
        full = raw.endswith(b"\n")
        text = redact(carry + (raw[:-1] if full else raw))
        carry = b""
        if not full and redact.longest > 1:
            keep = min(redact.longest - 1, len(text))
            text, carry = text[:len(text) - keep], text[len(text) - keep:]
        if text or full:
            _record(log, text, full=full)


def _record(log: IO[bytes], text: bytes, *, full: bool) -> None:
    log.write(f"{rfc3339(time.time_ns())} stdout {'F' if full else 'P'} ".encode() + text + b"\n")


class Container:
    def __init__(self, pod_dir: Path, spec: dict[str, Any], redact: Redactor) -> None:
        self.spec, self.name, self.redact = spec, str(spec["name"]), redact
        self.log_path = pod_dir / "logs" / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None
        self.pump: threading.Thread | None = None
        self.started = 0.0
        self.oom_message = ""

    @property
    def in_engine(self) -> bool:
        return bool(self.spec.get("engine"))

    def _engine(self, argv: list[str], *, wait: bool) -> None:
        _engine(argv, self.spec["env"], wait=wait)

    def start(self) -> str:
        """Start the process; '' or the reason it could not start."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.in_engine:  # a container of this name left by a shim that died
            self._engine(containers.remove_argv(self.spec["engine"], self.spec["engine_name"]), wait=True)
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - closed by the pump's owner at exit
        self.started = time.time()
        uid, gid = int(self.spec.get("uid", -1)), int(self.spec.get("gid", -1))
        as_user: dict[str, Any] = {"user": uid, "group": gid, "extra_groups": []} if uid >= 0 else {}
        try:
            # the workspace's own OS user (``runas``), with none of the shim's groups: the shim stays root to
            # write the pod's state and logs, the researcher's code does not
            self.proc = subprocess.Popen(self.spec["command"], cwd=self.spec["cwd"], env=self.spec["env"],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, **as_user)
        except OSError as exc:
            log.write(f"{rfc3339(time.time_ns())} stderr F failed to start {self.spec['command'][0]}: {exc}\n"
                      .encode())
            return str(exc)
        assert self.proc.stdout is not None
        self.ps = psutil.Process(self.proc.pid)
        self.pump = threading.Thread(target=_pump, args=(self.proc.stdout, log, self.redact), daemon=True)
        self.pump.start()
        return ""

    def terminate(self, grace_s: float) -> None:
        """SIGTERM: to the process group, or ``<engine> stop`` (which sends SIGKILL itself after the grace)."""
        assert self.proc is not None
        if self.in_engine:
            self._engine(containers.stop_argv(self.spec["engine"], self.spec["engine_name"], grace_s), wait=False)
        else:
            kill_group(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        assert self.proc is not None
        if self.in_engine:
            self._engine(containers.kill_argv(self.spec["engine"], self.spec["engine_name"]), wait=False)
        kill_group(self.proc.pid, signal.SIGKILL)

    def over_memory(self) -> bool:
        limit = int(self.spec.get("memory_limit") or 0)
        if not limit or self.ps is None or self.oom_message:
            return False
        rss = _tree_rss(self.ps)
        if rss <= limit:
            return False
        self.oom_message = f"memory {human_bytes(rss)} exceeded the limit {human_bytes(limit)}"
        return True


class Shim:
    def __init__(self, pod_dir: Path, secrets: list[str] | None = None) -> None:
        self.dir = pod_dir
        # spec.json is sealed (secret values replaced by placeholders); the values came on stdin
        self.spec = unseal(json.loads((pod_dir / "spec.json").read_text()), secrets or [])
        redact = redactor(secrets or [])
        self.init = [Container(pod_dir, c, redact) for c in self.spec["init"]]
        self.main = [Container(pod_dir, c, redact) for c in self.spec["containers"]]
        self.started = time.time()
        self.deadline = float(self.spec.get("deadline_s") or 0)
        self.grace = float(self.spec.get("grace_s") if self.spec.get("grace_s") is not None else 30)
        self.hang = float(self.spec.get("hang_s") or 0)
        self.reason, self.message, self.stop_at = "", "", 0.0  # a pod-level stop, once decided
        self.named = False  # the stop names a reason the killed containers report (else Error/Completed)
        waiting = "PodInitializing" if self.init else "ContainerCreating"
        self.state: dict[str, Any] = {
            "phase": "Pending", "startTime": self.started, "reason": "", "message": "", "done": False,
            "init": [_waiting(c.name, "PodInitializing") for c in self.init],
            "containers": [_waiting(c.name, waiting) for c in self.main],
        }

    def write(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.dir / "state.json")

    def run(self) -> None:
        self.write()
        for i, c in enumerate(self.init):
            self._group([c], self.state["init"], offset=i)
            term = self.state["init"][i]["terminated"]
            if term["exitCode"] != 0 or self.reason:
                self._finish("Failed", f"Init:{term['reason']}",
                             f"init container {c.name} failed: {term['reason']} (exit code {term['exitCode']})"
                             + (f": {term['message']}" if term.get("message") else ""))
                return
        if self.reason:
            self._finish("Failed", self.reason, self.message)
            return
        self.state["phase"] = "Running"
        first = self.main[0]
        work = Path(first.spec["cwd"])
        watch_scratch = work.is_relative_to(self.dir)  # the pod's copy of the project, not a host directory
        before = scratch.inventory(work) if watch_scratch else {}
        self._group(self.main, self.state["containers"], offset=0)
        if any("terminated" not in st for st in self.state["containers"]):  # stopped before they started
            self._finish("Failed", self.reason or "Error", self.message)
            return
        if watch_scratch:
            warning = scratch.report(self.dir, work, scratch.written(before, work),
                                     first.spec["env"].get("TAU_OUTPUT_DIR", ""))
            if warning:
                with open(first.log_path, "ab") as log:
                    log.write(f"{rfc3339(time.time_ns())} stdout F {warning}\n".encode())
        ok = all(s["terminated"]["exitCode"] == 0 for s in self.state["containers"])
        deadline = self._stopped_for() == "DeadlineExceeded"  # a stop decided while the containers ran
        self._finish("Succeeded" if ok else "Failed", "DeadlineExceeded" if deadline else "",
                     self.message if deadline else "")

    def _stopped_for(self) -> str:
        return self.reason

    def _finish(self, phase: str, reason: str, message: str) -> None:
        self.state.update(phase=phase, reason=reason, message=message, done=True, finished=time.time())
        self.write()

    def _group(self, group: list[Container], states: list[dict[str, Any]], *, offset: int) -> None:
        """Run these containers together until every one has exited."""
        if self._pod_stop(time.time()):
            return  # stopped before they started: they stay waiting
        for j, c in enumerate(group):
            problem = c.start()
            if problem:
                states[offset + j] = _terminated(c.name, START_ERROR_EXIT, "StartError", problem, c.started)
            else:
                states[offset + j] = {"name": c.name, "running": {"startedAt": c.started},
                                      "pid": c.proc.pid if c.proc else 0}
                if c.in_engine:  # whoever finds this shim dead clears its container too
                    states[offset + j]["engine_remove"] = containers.remove_argv(c.spec["engine"],
                                                                                 c.spec["engine_name"])
        self.write()
        live = [c for c in group if c.proc is not None]
        last_size, last_progress, last_mem = -1, time.time(), 0.0
        while live:
            now = time.time()
            if self.hang and not self.reason:
                size = sum(c.log_path.stat().st_size for c in group if c.log_path.exists())
                if size != last_size:
                    last_size, last_progress = size, now
                elif now - last_progress > self.hang:
                    self.reason, self.named = "Hang", True
                    self.message = f"no output for {self.hang:.0f}s (resilience.hang_timeout)"
            if self._pod_stop(now):
                if not self.stop_at:
                    self.stop_at = now + self.grace
                    for c in live:
                        c.terminate(self.grace)
                elif now >= self.stop_at:
                    for c in live:
                        c.kill()
            if now - last_mem > 0.25:
                last_mem = now
                for c in live:
                    if c.over_memory():
                        c.kill()
            for c in list(live):
                assert c.proc is not None
                code = c.proc.poll()
                if code is None:
                    continue
                live.remove(c)
                kill_group(c.proc.pid, signal.SIGKILL)  # leftovers of its process group
                if c.pump is not None:
                    c.pump.join(timeout=5)
                states[offset + group.index(c)] = self._exited(c, code)
                self.write()
            time.sleep(POLL_S)

    def _pod_stop(self, now: float) -> bool:
        """Has the pod been told to stop (stop file, deadline, hang)? Decided once."""
        if self.reason:
            return True
        stop_file = self.dir / "stop"
        if stop_file.exists():
            try:
                req = json.loads(stop_file.read_text() or "{}")
            except ValueError:
                req = {}
            self.reason = str(req.get("reason") or "Stopped")
            self.message = f"stopped: {self.reason}"
            if req.get("grace_s") is not None:
                self.grace = float(req["grace_s"])
            self.named = bool(req.get("reason"))
        elif self.deadline and now - self.started > self.deadline:
            self.reason, self.named = "DeadlineExceeded", True
            self.message = f"Pod was active on the node longer than the specified deadline ({self.deadline:.0f}s)"
        return bool(self.reason)

    def _exited(self, c: Container, code: int) -> dict[str, Any]:
        out = self._exit_reason(c, code)
        said = c.redact(_termination_message(c, failed=code != 0).encode()).decode(errors="replace")
        if said:
            out["terminated"]["message"] = said
        return out

    def _exit_reason(self, c: Container, code: int) -> dict[str, Any]:
        exit_code = 128 - code if code < 0 else code  # shell convention: 137 = SIGKILL, 143 = SIGTERM
        engine_says = containers.exit_reason(code, stopped=bool(self.reason),
                                             memory_limit=int(c.spec.get("memory_limit") or 0)) if c.in_engine else None
        if engine_says is not None:
            return _terminated(c.name, exit_code, *engine_says, c.started)
        if c.oom_message:
            return _terminated(c.name, exit_code, "OOMKilled", c.oom_message, c.started)
        if self.named and code != 0:
            return _terminated(c.name, exit_code, self.reason, self.message, c.started)
        if code == -signal.SIGKILL and not self.reason:
            return _terminated(c.name, exit_code, "OOMKilled", "killed by SIGKILL (the kernel OOM killer)", c.started)
        return _terminated(c.name, exit_code, "Completed" if code == 0 else "Error", "", c.started)


def _engine(argv: list[str], env: dict[str, str], *, wait: bool) -> None:
    """Run a container engine command (stop, kill, rm) beside the container; its failure changes nothing (the
    container has gone already, or the process-group signal and the exit code tell the rest)."""
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        if wait:
            proc.wait(timeout=ENGINE_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _termination_message(c: Container, *, failed: bool) -> str:
    """What the container wrote to its terminationMessagePath (at most 4 KiB), else, with the policy
    FallbackToLogsOnError and a failure, the tail of its log (80 lines, 2 KiB), as the kubelet reports."""
    path = c.spec.get("termination_path")
    text = _read_own_file(path, int(c.spec.get("uid", -1)))[:4096].decode(errors="replace") if path else ""
    if text or not failed or c.spec.get("termination_policy") != "FallbackToLogsOnError":
        return text
    try:
        records = c.log_path.read_bytes().splitlines()[-80:]
    except OSError:
        return ""
    lines = [r.split(b" ", 3)[3] if r.count(b" ") >= 3 else b"" for r in records]
    return b"\n".join(lines)[-2048:].decode(errors="replace")


def _read_own_file(path: str, uid: int) -> bytes:
    """The file's bytes when it is a regular file (never through a link) and, for a container run as ``uid``,
    that user's own: the shim is root, and the container could have put a link to any file there; else b""."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid >= 0 and st.st_uid != uid):
            return b""
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _waiting(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "waiting": {"reason": reason}}


def _terminated(name: str, exit_code: int, reason: str, message: str, started: float) -> dict[str, Any]:
    return {"name": name, "terminated": {"exitCode": exit_code, "reason": reason, "message": message,
                                         "startedAt": started, "finishedAt": time.time()}}


def run(pod_dir: Path) -> int:
    (pod_dir / "shim.pid").write_text(str(os.getpid()))
    secrets: list[str] = []
    if sys.stdin is not None and not sys.stdin.isatty():
        raw = sys.stdin.read()
        secrets = [str(v) for v in json.loads(raw)] if raw.strip() else []
    Shim(pod_dir, secrets).run()
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
