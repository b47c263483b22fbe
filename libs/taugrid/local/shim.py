"""The pod shim: one per pod, like containerd's shim, so a pod outlives a restart of the local cluster.

``python -m taugrid.local.shim POD_DIR`` reads ``spec.json``, runs the command in its own session with stdout and
stderr merged into ``output.log``, and enforces what a kubelet would: the memory limit (the process tree is
SIGKILLed and reported OOMKilled, as the cgroup OOM killer does), ``activeDeadlineSeconds`` (DeadlineExceeded),
and a stop request (file ``stop``: SIGTERM, then SIGKILL after the grace period). It writes ``status.json`` last;
its presence means the pod is finished.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from taugrid.local import scratch

POLL_S = 0.1


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


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(pod_dir: Path) -> int:
    spec = json.loads((pod_dir / "spec.json").read_text())
    log = open(pod_dir / "output.log", "ab", buffering=0)  # noqa: SIM115 - the child writes into it
    started = time.time()
    work = pod_dir / "work"
    before = scratch.inventory(work)
    try:
        child = subprocess.Popen(spec["command"], cwd=spec["cwd"], env=spec["env"], stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        log.write(f"failed to start {spec['command'][:1]}: {exc}\n".encode())
        _write_status(pod_dir, exit_code=127, reason="StartError", message=str(exc), started=started)
        return 0
    (pod_dir / "pid").write_text(str(child.pid))
    ps = psutil.Process(child.pid)
    memory_limit = int(spec.get("memory_limit") or 0)
    deadline = float(spec.get("deadline_s") or 0)
    grace = float(spec.get("grace_s") or 30)
    hang = float(spec.get("hang_s") or 0)
    log_path = pod_dir / "output.log"
    last_size, last_progress = -1, started
    reason, message, stop_at = "", "", 0.0
    last_mem_check = 0.0
    while child.poll() is None:
        now = time.time()
        if not reason:
            stop_file = pod_dir / "stop"
            if stop_file.exists():
                reason = stop_file.read_text().strip() or "Stopped"
                message = f"stopped: {reason}"
            elif deadline and now - started > deadline:
                reason, message = "DeadlineExceeded", f"active deadline of {deadline:.0f}s exceeded"
            elif hang:
                size = log_path.stat().st_size if log_path.exists() else 0
                if size != last_size:
                    last_size, last_progress = size, now
                elif now - last_progress > hang:
                    reason, message = "Hang", f"no output for {hang:.0f}s (resilience.hang_timeout)"
            if reason:
                _kill_group(child.pid, signal.SIGTERM)
                stop_at = now + grace
        elif now >= stop_at:
            _kill_group(child.pid, signal.SIGKILL)
        if memory_limit and not reason and now - last_mem_check > 0.25:
            last_mem_check = now
            rss = _tree_rss(ps)
            if rss > memory_limit:
                _kill_group(child.pid, signal.SIGKILL)
                reason = "OOMKilled"
                message = f"memory {rss >> 20} MiB exceeded the limit {memory_limit >> 20} MiB"
        time.sleep(POLL_S)
    code = child.returncode
    _kill_group(child.pid, signal.SIGKILL)  # leftovers of the process group
    exit_code = 128 - code if code < 0 else code  # shell convention: 137 = SIGKILL, 143 = SIGTERM
    if not reason and code == -signal.SIGKILL:
        reason, message = "OOMKilled", "killed by SIGKILL (the kernel OOM killer)"
    if not reason:
        reason = "Completed" if code == 0 else "Error"
    warning = scratch.report(pod_dir, work, scratch.written(before, work), spec["env"].get("TAU_OUTPUT_DIR", ""))
    if warning:
        log.write(f"{warning}\n".encode())
    _write_status(pod_dir, exit_code=exit_code, reason=reason, message=message, started=started)
    return 0


def _write_status(pod_dir: Path, **status: object) -> None:
    tmp = pod_dir / "status.json.tmp"
    tmp.write_text(json.dumps({**status, "finished": time.time()}))
    tmp.replace(pod_dir / "status.json")


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
