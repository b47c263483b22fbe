"""The local kubelet: runs a Kubernetes Pod manifest as host processes and reports a Kubernetes PodStatus.

It knows nothing of who uses it (the local cluster's controller, the emulated Kubernetes cluster in the tests):
it takes a Pod (``metadata`` + ``spec``), runs it under a shim (``taugrid.local.shim``) in ``<root>/<pod>/``, and
calls ``on_status`` with the pod's ``status`` whenever it changes. As Kubernetes does: init containers in order,
each to success (a failing one fails the pod, reason ``Init:<reason>``), then the containers together; ``env``
with ``secretKeyRef``/``configMapKeyRef``/``fieldRef``/``resourceFieldRef`` and ``envFrom``; ``$(VAR)`` expansion;
``workingDir``; volumes as host directories (see ``podspec``); a container's memory limit (``OOMKilled``);
``activeDeadlineSeconds`` (``DeadlineExceeded``); exit codes and reasons. The image is ignored, unless the pod is
annotated ``taugrid.io/container-engine``: then each container runs in its image through that engine
(``taugrid.local.containers``).

Missing secrets or config maps leave the pod ``Pending`` with the container waiting in
``CreateContainerConfigError`` (retried, as the kubelet retries) until they appear, the pod is stopped or its
deadline passes. Deviations, for the readers of the status: a container killed for the deadline, a hang or a
named stop reports that reason (not ``Error``), and a pod failed by an init container carries ``reason``
``Init:<reason>`` with the exit code in ``message``.

Run users: with ``run_user`` (the local cluster passes each workspace's OS user, ``taugrid.local.runas``), every
container of a pod runs as that user, with ``HOME`` a directory of the pod's own; what it must write is given to it
before the shim starts (its working directory and volumes, termination files, new claims; never a ``hostPath``),
and the pod's directory is closed to everyone but that user's group (0710). A pod run through a container engine
runs its containers as that user too (``--user uid:gid``; the engine's client stays root): the host directories it
mounts (``TAU_*`` ones included, which a researcher may name) are then opened with that user's rights only.

Restart safety: the shim outlives this process; ``start`` for a pod that already runs (same name and uid)
re-adopts it instead of running it twice, and a pod whose shim vanished is reported failed ("pod shim lost").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from taugrid.local import runas
from taugrid.local.pods import LogLine, PodRunner, read_log_file
from taugrid.local.podspec import SHARED_MEMORY, PodRun, PodSpecError, Resolver, plan, secret_volumes_dir
from taugrid.local.runas import RunAsError, RunUser
from taugrid.local.secrets import Recording, StoreResolver, seal

log = logging.getLogger("taugrid.local.kubelet")

StatusCallback = Callable[[dict[str, Any]], Awaitable[None] | None]
RunUserOf = Callable[[Mapping[str, Any]], RunUser | None]  # a pod -> the OS user its containers run as
HOST_IP = "127.0.0.1"
# What every container starts with, standing in for the image's environment.
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "TMPDIR", "USER", "PYTHONPATH", "VIRTUAL_ENV")
SHIM_LOST_AFTER_S = 10.0
CONFIG_RETRY_S = 2.0


def _none(_namespace: str, _name: str) -> Mapping[str, str] | None:
    return None


def ts(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodHandle:
    """A pod this kubelet runs: its name and uid, its last reported status, and ``wait()`` for the end."""

    def __init__(self, name: str, uid: str) -> None:
        self.name, self.uid = name, uid
        self.status: dict[str, Any] = {}
        self.done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def wait(self) -> dict[str, Any]:
        """The final PodStatus (phase Succeeded or Failed)."""
        await self.done.wait()
        return self.status


class Kubelet:
    def __init__(self, root_dir: Path, *, resolve_secret: Resolver = _none, resolve_config_map: Resolver = _none,
                 claims_dir: Path | None = None, base_env: Mapping[str, str] | None = None,
                 poll_s: float = 0.2, secret_scope: Callable[[Mapping[str, Any]], str] | None = None,
                 run_user: RunUserOf | None = None) -> None:
        self.run_user = run_user
        self.pods = PodRunner(root_dir, shared=run_user is not None)
        # what a secretKeyRef resolves in: the pod's namespace, or what ``secret_scope(pod)`` says (locally, the
        # run's workspace, so one workspace never reads another's secrets)
        self.secret_scope = secret_scope
        self.claims_dir = claims_dir or root_dir.parent / "claims"
        self.resolve_secret, self.resolve_config_map = resolve_secret, resolve_config_map
        self.base_env = dict(base_env) if base_env is not None else {
            k: v for k, v in os.environ.items() if k in BASE_ENV_KEYS}
        self.poll_s = poll_s
        self.handles: dict[str, PodHandle] = {}

    # ---------------------------------------------------------------- the face
    def workdir(self, name: str) -> Path:
        """The directory standing in for the image's working directory: what the caller puts here before
        ``start`` is what the containers find (a relative ``workingDir`` resolves under it)."""
        return self.pods.work(name)

    def volume_dir(self, name: str, volume: str) -> Path:
        """The host directory of the pod's ``emptyDir`` volume ``volume``: what the caller puts here before
        ``start`` is there when the first container starts (as if an earlier init container had put it)."""
        path = self.pods.dir(name) / "volumes" / volume
        path.mkdir(parents=True, exist_ok=True)
        return path

    def give_project(self, name: str, project: Path, user: RunUser) -> None:
        """Hand the project placed in the pod's ``project`` directory (its working directory or a volume) to
        ``user`` before anything else reads it: the pod's environment is built as that user, from it."""
        pod_dir = self.pods.dir(name)
        runas.share(pod_dir, user)
        if project.parent == pod_dir / "volumes":
            runas.share(project.parent, user)
        runas.give(project, user, recursive=True)

    async def start(self, pod: dict[str, Any], on_status: StatusCallback) -> PodHandle:
        """Run ``pod`` (or re-adopt it, if a pod of that name and uid already runs here) and report its status
        through ``on_status`` until it has finished. An ``on_status`` that raises is called again with the
        same status on the next poll."""
        meta = pod.get("metadata") or {}
        name, uid = str(meta["name"]), str(meta.get("uid") or "")
        old = self.handles.get(name)
        if old is not None and old.uid == uid and old.task is not None and not old.task.done():
            return old
        known = self.pods.manifest(name)
        if known is not None and str((known.get("metadata") or {}).get("uid") or "") != uid:
            self.pods.clear(name)  # another pod of the same name ran here before: start afresh
            known = None
        if known is None:
            self.pods.write_manifest(name, pod)
        else:
            pod = known  # re-adopted: what runs is what was started
        handle = PodHandle(name, uid)
        self.handles[name] = handle
        handle.task = asyncio.create_task(self._watch(pod, handle, on_status), name=f"kubelet-{name}")
        return handle

    async def stop(self, name: str, *, grace_s: float | None = None, reason: str = "") -> None:
        """Stop the pod: SIGTERM to every container, SIGKILL after ``grace_s`` (default: the pod's
        ``terminationGracePeriodSeconds``). With a ``reason``, killed containers report it; without, they
        report ``Error``/``Completed`` by exit code, as a deleted pod's containers do. Returns at once; the
        final status reaches ``on_status`` (and ``PodHandle.wait``)."""
        self.pods.stop(name, reason=reason, grace_s=grace_s)

    def status(self, name: str) -> dict[str, Any] | None:
        """The last status reported for a pod this kubelet watches."""
        handle = self.handles.get(name)
        return handle.status if handle and handle.status else None

    def log_path(self, name: str, container: str) -> Path:
        """The container's log file, CRI format: ``<RFC3339Nano> stdout F|P <text>`` per record."""
        return self.pods.log_path(name, container)

    def read_log(self, name: str, container: str, *, offset: int = 0, final: bool = False,
                 since_time: str | None = None) -> tuple[list[LogLine], int]:
        """Complete lines (with their timestamps) from byte ``offset`` of the container's log, and the offset
        to continue from; ``final`` also returns a last partial line (the container has finished).
        ``since_time`` (RFC3339) drops lines stamped before it."""
        lines, nxt = read_log_file(self.log_path(name, container), offset, final=final)
        if since_time:
            cut = _parse_time(since_time)
            lines = [ln for ln in lines if _parse_time(ln.time) >= cut]
        return lines, nxt

    async def follow_log(self, name: str, container: str, *, since_time: str | None = None,
                         timestamps: bool = False) -> AsyncIterator[str]:
        """The container's log as Kubernetes' log endpoint serves it with ``follow=true``: every line so far,
        then new ones as they come, until the container has terminated. ``timestamps`` prefixes each line
        with its RFC3339 time and a space."""
        offset = 0
        while True:
            finished = self._terminated(name, container)
            while True:
                lines, nxt = self.read_log(name, container, offset=offset, final=finished, since_time=since_time)
                for ln in lines:
                    yield f"{ln.time} {ln.text}" if timestamps else ln.text
                if nxt == offset:
                    break
                offset = nxt
            if finished:
                return
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        """Stop watching (the pods keep running under their shims, to be re-adopted by ``start``)."""
        tasks = [h.task for h in self.handles.values() if h.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- the watch loop
    def _terminated(self, name: str, container: str) -> bool:
        state = self.pods.state(name)
        if state is None:
            return False
        if state.get("done"):
            return True
        # A container's log is complete once it has terminated; the shim may still append to the first
        # container's log after that (its scratch report), so containers count as finished with the pod.
        return any(s.get("name") == container and "terminated" in s for s in state.get("init", []))

    async def _watch(self, pod: dict[str, Any], handle: PodHandle, on_status: StatusCallback) -> None:
        name = handle.name
        created = time.time()
        config_error: PodSpecError | None = None
        next_try = 0.0
        conditions: dict[str, dict[str, Any]] = {}
        delivered: dict[str, Any] | None = None
        ran = False
        while True:
            now = time.time()
            state = self.pods.state(name)
            if state is None and not self.pods.launched(name):
                stop = self.pods.stop_requested(name)
                deadline = float((pod.get("spec") or {}).get("activeDeadlineSeconds") or 0)
                if stop is not None or (deadline and now - created > deadline):
                    state = _never_started(pod, stop, config_error, deadline)
                    self.pods.write_state(name, state)
                elif now >= next_try:
                    config_error = self._launch(pod)
                    next_try = now + CONFIG_RETRY_S
                    state = self.pods.state(name)
            elif state is not None and not state.get("done") and not self.pods.shim_alive(name):
                state = self._lost(name, state)
            elif state is None and self.pods.launched(name) and not self.pods.shim_alive(name):
                started = (self.pods.dir(name) / "shim.pid").stat().st_mtime
                if now - started > SHIM_LOST_AFTER_S:
                    state = {"phase": "Pending", "startTime": started, "init": [], "containers": [], "done": False}
                    state = self._lost(name, state)
            if not ran and state is not None and _ran_unseen(state):
                state = _as_running(state)  # a pod that ran is reported Running once, however short its run
            status = pod_status(pod, state, config_error=config_error, conditions=conditions)
            if status != delivered:
                try:
                    result = on_status(status)
                    if inspect.isawaitable(result):
                        await result
                    delivered = status
                    handle.status = status
                    ran = ran or status["phase"] == "Running"
                except Exception as exc:  # the caller's trouble (a bus timeout): report again next poll
                    log.warning("pod %s: status callback failed, retrying: %r", name, exc)
                    await asyncio.sleep(self.poll_s)
                    continue
                if status["phase"] == "Running" and state is not None and state.get("_interim"):
                    continue  # now the real (finished) state
            if state is not None and state.get("done") and delivered == status:
                handle.done.set()
                return
            await asyncio.sleep(self.poll_s)

    def _launch(self, pod: dict[str, Any]) -> PodSpecError | None:
        name = str(pod["metadata"]["name"])
        seen: list[str] = []  # every secret value the pod's spec holds: kept off disk, redacted from its logs
        scope = self.secret_scope(pod) if self.secret_scope is not None else None

        def resolve_secret(namespace: str, secret: str) -> Mapping[str, str] | None:
            data = self.resolve_secret(scope or namespace, secret)
            return None if data is None else Recording(data, seen, secret)

        try:
            user = self.run_user(pod) if self.run_user is not None else None
            run = plan(pod, pod_dir=self.pods.dir(name), claims_dir=self.claims_dir, base_env=self.base_env,
                       resolve_secret=resolve_secret, resolve_config_map=self.resolve_config_map)
            if user is not None:
                self._hand_over(pod, run, user)
        except RunAsError as exc:
            error = PodSpecError("CreateContainerError", str(exc))
            self.pods.write_state(name, _failed_to_create(pod, error))
            return error
        except PodSpecError as exc:
            if exc.reason != "CreateContainerConfigError":
                self.pods.write_state(name, _failed_to_create(pod, exc))
            return exc
        if isinstance(self.resolve_secret, StoreResolver) and scope:  # the workspace's values, under any name
            seen += [v for v in self.resolve_secret.values(scope) if v not in seen]
        self.pods.launch(name, seal(run.to_json(), seen), run.volume_dirs, secrets=seen)
        return None

    def _hand_over(self, pod: Mapping[str, Any], run: PodRun, user: RunUser) -> None:
        """Make ``run``'s containers start as ``user``, and give it what it must write: the pod's working directory
        and ``emptyDir`` volumes (recursively, once: the project placed there by root), a home, claims this pod
        creates, one termination file per container. What root writes again on a later launch stays root's and is
        only readable by ``user``'s group: config-map and secret volumes (read-only in Kubernetes too), the
        termination folder. The pod's directory stays root's, passable by that group only (0710)."""
        pod_dir = self.pods.dir(str(pod["metadata"]["name"]))
        home = pod_dir / "home"
        secrets = secret_volumes_dir(pod_dir)
        volumes = (pod.get("spec") or {}).get("volumes") or []
        read_only = [*(pod_dir / "volumes" / str(v.get("name")) for v in volumes if "configMap" in v),
                     *(secrets / str(v.get("name")) for v in volumes if "secret" in v)]
        termination = pod_dir / "termination"
        dirs = list(dict.fromkeys([*(Path(p) for p in run.volume_dirs), home]))
        fresh_claims = [d for d in dirs if d.is_relative_to(self.claims_dir) and not d.exists()]
        for d in dirs:
            if d not in fresh_claims and not d.exists():
                d.mkdir(parents=True)
        runas.share(pod_dir, user)
        if (pod_dir / "volumes").is_dir():
            runas.share(pod_dir / "volumes", user)
        if secrets.is_relative_to(SHARED_MEMORY) and secrets.is_dir():
            os.chmod(secrets.parent, 0o711)  # /dev/shm/taugrid-secrets-<uid>: every pod's, listed by none
            runas.share(secrets, user)
        for d in dirs:
            if any(d.is_relative_to(r) for r in read_only):
                runas.share(next(r for r in read_only if d.is_relative_to(r)), user, mode=0o750)
            elif d == termination:
                runas.share(d, user)
            elif d.is_relative_to(pod_dir) and d.is_dir():
                runas.give(d, user, recursive=True)
            elif d in fresh_claims:
                runas.make_private_dirs(d, user)
        for c in [*run.init, *run.containers]:
            if c.engine:  # the engine's client stays root (and keeps its HOME); the container runs as the user
                c.command = [*c.command[:2], "--user", f"{user.uid}:{user.gid}", *c.command[2:]]
            else:
                c.uid, c.gid = user.uid, user.gid
                for key, value in (("HOME", str(home)), ("USER", user.name), ("LOGNAME", user.name)):
                    if c.env.get(key) == self.base_env.get(key):  # the stack's own, not one the pod chose
                        c.env[key] = value
            # the container writes its message into a file of its own, in a folder it cannot change: the shim
            # (root) reads it back, so it must never be a link the run chose
            fd = os.open(c.termination_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.fchown(fd, user.uid, user.gid)
            finally:
                os.close(fd)

    def _lost(self, name: str, state: dict[str, Any]) -> dict[str, Any]:
        self.pods.kill_leftovers(state)
        now = time.time()
        for group in ("init", "containers"):
            for i, s in enumerate(state.get(group, [])):
                if "running" in s:
                    state[group][i] = {"name": s["name"], "terminated": {
                        "exitCode": 255, "reason": "Error", "message": "pod shim lost",
                        "startedAt": s["running"]["startedAt"], "finishedAt": now}}
        state.update(phase="Failed", reason=state.get("reason") or "", done=True, finished=now,
                     message=state.get("message") or "pod shim lost")
        self.pods.write_state(name, state)
        return state


def _ran_unseen(state: Mapping[str, Any]) -> bool:
    """Finished, with containers that started, before a Running status was ever reported."""
    return state.get("phase") in ("Succeeded", "Failed") and any(
        (s.get("terminated") or {}).get("reason") != "StartError" and "terminated" in s
        for s in state.get("containers") or [])


def _as_running(state: Mapping[str, Any]) -> dict[str, Any]:
    """The moment between the containers' start and their end, which a poll may have missed."""
    containers = [{"name": s["name"], "running": {"startedAt": s["terminated"]["startedAt"]}}
                  if "terminated" in s else dict(s) for s in state.get("containers") or []]
    return {**state, "phase": "Running", "reason": "", "message": "", "done": False, "containers": containers,
            "_interim": True}


def _never_started(pod: dict[str, Any], stop: dict[str, Any] | None, config_error: PodSpecError | None,
                   deadline: float) -> dict[str, Any]:
    spec = pod.get("spec") or {}
    reason = "DeadlineExceeded" if stop is None else str(stop.get("reason") or "Stopped")
    message = (f"Pod was active on the node longer than the specified deadline ({deadline:.0f}s)" if stop is None
               else config_error.message if config_error else "stopped before its containers started")
    waiting = {"reason": config_error.reason, "message": config_error.message} if config_error else {
        "reason": "ContainerCreating"}
    return {"phase": "Failed", "startTime": time.time(), "reason": reason, "message": message, "done": True,
            "init": [{"name": c.get("name"), "waiting": waiting} for c in spec.get("initContainers") or []],
            "containers": [{"name": c.get("name"), "waiting": waiting} for c in spec.get("containers") or []]}


def _failed_to_create(pod: dict[str, Any], exc: PodSpecError) -> dict[str, Any]:
    """A spec that can never run here (not a missing secret): the pod fails at once, naming the field."""
    state = _never_started(pod, {"reason": exc.reason}, exc, 0)
    state["message"] = exc.message
    return state


# ---------------------------------------------------------------- PodStatus


def pod_status(pod: Mapping[str, Any], state: Mapping[str, Any] | None, *, config_error: PodSpecError | None,
               conditions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Kubernetes PodStatus for the shim's ``state`` (``None``: not started). ``conditions`` carries the
    conditions between calls, so that ``lastTransitionTime`` changes only on a transition."""
    spec = pod.get("spec") or {}
    images = {c.get("name"): c.get("image", "") for c in [*(spec.get("initContainers") or []),
                                                           *(spec.get("containers") or [])]}
    if state is None:
        waiting = ({"reason": config_error.reason, "message": config_error.message} if config_error
                   else {"reason": "ContainerCreating"})
        state = {"phase": "Pending", "startTime": 0,
                 "init": [{"name": c.get("name"), "waiting": waiting} for c in spec.get("initContainers") or []],
                 "containers": [{"name": c.get("name"), "waiting": waiting} for c in spec.get("containers") or []]}
    phase = str(state.get("phase") or "Pending")
    inits, mains = list(state.get("init") or []), list(state.get("containers") or [])
    terminal = phase in ("Succeeded", "Failed")
    not_init = [s["name"] for s in inits if (s.get("terminated") or {}).get("exitCode") != 0]
    unready = [s["name"] for s in mains if "running" not in s]
    now = time.time()

    def cond(ctype: str, ok: bool, reason: str, message: str) -> None:
        prev = conditions.get(ctype)
        status = "True" if ok else "False"
        if prev is None or prev["status"] != status:
            prev = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": ts(now)}
        prev = {k: v for k, v in prev.items() if k not in ("reason", "message")}
        if not ok:
            prev.update({k: v for k, v in (("reason", reason), ("message", message)) if v})
        conditions[ctype] = prev

    cond("PodScheduled", True, "", "")
    cond("Initialized", not not_init, "ContainersNotInitialized",
         f"containers with incomplete status: [{' '.join(not_init)}]")
    ready = phase == "Running" and not unready
    why = "PodCompleted" if terminal else "ContainersNotReady"
    msg = "" if terminal else f"containers with unready status: [{' '.join(unready)}]"
    cond("ContainersReady", ready, why, msg)
    cond("Ready", ready, why, msg)
    out: dict[str, Any] = {"phase": phase, "conditions": [conditions[t] for t in (
        "PodScheduled", "Initialized", "ContainersReady", "Ready")], "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}], "podIP": HOST_IP, "podIPs": [{"ip": HOST_IP}]}
    if state.get("startTime"):
        out["startTime"] = ts(float(state["startTime"]))
    if state.get("reason"):
        out["reason"] = state["reason"]
    if state.get("message"):
        out["message"] = state["message"]
    if inits:
        out["initContainerStatuses"] = [_container_status(s, images.get(s["name"], "")) for s in inits]
    out["containerStatuses"] = [_container_status(s, images.get(s["name"], "")) for s in mains]
    return out


def _container_status(s: Mapping[str, Any], image: str) -> dict[str, Any]:
    if "running" in s:
        st: dict[str, Any] = {"running": {"startedAt": ts(float(s["running"]["startedAt"]))}}
    elif "terminated" in s:
        t = s["terminated"]
        st = {"terminated": {"exitCode": int(t["exitCode"]), "reason": t.get("reason", ""),
                             "startedAt": ts(float(t["startedAt"])), "finishedAt": ts(float(t["finishedAt"]))}}
        if t.get("message"):
            st["terminated"]["message"] = t["message"]
    else:
        st = {"waiting": dict(s.get("waiting") or {"reason": "ContainerCreating"})}
    return {"name": s["name"], "image": image, "imageID": "", "ready": "running" in st, "started": "running" in st,
            "restartCount": 0, "state": st}


def _parse_time(text: str) -> dt.datetime:
    """RFC3339 with up to nanoseconds (Python parses microseconds: the rest is cut)."""
    head, dot, frac = text.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(head + (("." + frac[:6]) if dot else "") + "+00:00")

