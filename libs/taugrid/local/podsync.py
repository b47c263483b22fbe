"""The controller's side of an admitted workload's pods: started through the kubelet, their status published,
their logs shipped. Knows the workload records and the bus, not the controller (it is handed ``publish`` and
``save``), and the kubelet only through its face.

Invariants: a pod is saved as ``Running`` once the kubelet has it, so a restart re-adopts it (``kubelet.start`` of
a pod that runs is idempotent) and never runs it twice; a pod's last log lines reach the bus before its terminal
status does (the evidence of a run that ends on that status must carry them); log chunks are keyed by
``<pod>.<container>.<byte offset>``.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import os
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from taugrid.bus.connection import Bus
from taugrid.core import devices
from taugrid.core.contracts import LogChunk
from taugrid.core.errors import NotFound
from taugrid.core.events import log_subject
from taugrid.core.manifestkeys import FETCH_CONTAINER, SOURCE_DIGEST_ANNOTATION, SOURCE_VOLUME
from taugrid.local import envrefs, objects, runas
from taugrid.local.containers import ENGINE_ANNOTATION
from taugrid.local.jobpods import main_container, pod_manifest, replace_python, template
from taugrid.local.kubelet import Kubelet
from taugrid.local.lanelock import LaneLock
from taugrid.local.podspec import PodSpecError, kubernetes_only
from taugrid.local.raycluster import WORKERS
from taugrid.local.runas import RunAsError, WorkspaceUsers
from taugrid.local.runtime import Failed, PodRuntimes, Preparing, Ready, RuntimeRequest
from taugrid.local.secrets import SecretStore
from taugrid.local.state import LocalPod, LocalWorkload
from taugrid.ports import free_port
from taugrid.settings import LocalSettings, current
from taugrid.sources import snapshots

log = logging.getLogger("taugrid.local")

Publish = Callable[[LocalWorkload, str, dict[str, Any], str], Awaitable[None]]
Save = Callable[[LocalWorkload], Awaitable[None]]
TERMINAL = ("Succeeded", "Failed")
PREPARING_REFRESH_S = 1.0  # preparation progress is republished at most this often
SOURCE_PLACED = ".source-placed"
SOURCES_KEPT_BYTES = 64 * 1024 * 1024  # snapshots kept in memory for the next pods of the same runs


class PodRuntime(Protocol):
    """The one place that decides which interpreter runs ``python``/``python3`` in a workload's pods, or the
    container engine that runs them in their image. Asked on every tick while the pod waits to start, with the
    workload, the pod's name and its project directory (the snapshot is already there); it must not block:
    ``Preparing(message)``
    while it works (published as the pod's ``PreparingEnvironment`` waiting message), then ``Ready(python,
    environment[, engine, image])`` (``environment`` becomes ``environment.taugrid.io/<key>`` pod annotations;
    with an ``engine`` the pod carries ``taugrid.io/container-engine`` and its python is the image's) or
    ``Failed(reason, message)``, which fails the pod. Either may carry ``progress``, the last ``Preparing``
    message of the work that led to it: said once if it was not yet (work that began and ended between two
    looks is still a step of the run's story: its ``environment`` phase)."""

    def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing | Ready | Failed: ...

    def forget(self, pod: str) -> None:
        """The pod started, failed or went away: drop what was prepared for it."""


def host_python(local: LocalSettings | None = None) -> str:
    """``TAU_LOCAL_PYTHON`` (``local.python``; default this process's settings) if set, else the interpreter
    running the local cluster."""
    return (local if local is not None else current().local).python or sys.executable


class HostPython:
    """:func:`host_python` for every pod, at once (for tests and simple embeddings)."""

    def __init__(self, local: LocalSettings | None = None) -> None:
        self.local = local

    def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing | Ready | Failed:
        return Ready(python=host_python(self.local), environment={})

    def forget(self, pod: str) -> None:
        return None


class PreparedRuntimes:
    """The local cluster's default: ``runtime.PodRuntimes`` (the researcher's interpreter or a per-run uv
    environment, prepared in a thread, or the container engine that runs ``runtime.image``) asked from the
    control loop."""

    def __init__(self, runtimes: PodRuntimes, users: WorkspaceUsers | None = None) -> None:
        self.runtimes, self.users = runtimes, users

    def prepare(self, wl: LocalWorkload, pod: str, project: Path) -> Preparing | Ready | Failed:
        outcome = self.runtimes.poll(pod)
        if outcome is None:
            try:
                user = self.users.user(wl.workspace) if self.users is not None else None
            except RunAsError as exc:
                return Failed("CreateContainerError", str(exc))
            self.runtimes.begin(pod, work=project, request=RuntimeRequest(
                python=wl.python, python_source=wl.python_source, pip=tuple(wl.pip), image=wl.image), user=user,
                source=wl.source_object)
            return self.runtimes.poll(pod) or Preparing("")  # a snapshot prepared before is ready at once
        return outcome

    def forget(self, pod: str) -> None:
        self.runtimes.forget(pod)


class PodSync:
    def __init__(self, bus: Bus, kubelet: Kubelet, *, node: str, gpu_memory_mb: int, lock: LaneLock,
                 publish: Publish, save: Save, runtime: PodRuntime | None = None,
                 users: WorkspaceUsers | None = None, secrets_dir: Path | None = None,
                 local: LocalSettings | None = None) -> None:
        """``users``: each workspace's OS user (``runas``), when pods run as those; the output and checkpoint
        directories are then that user's (0700) under parents nobody may list (0711). ``secrets_dir``: the
        secrets store a pod's hints name (``TAU_SECRETS_DIR``, else ``secrets/`` beside the pods' root);
        ``local``: the local cluster's settings (``TAU_LOCAL_PYTHON``); each defaults to this process's."""
        self.users = users
        self.secrets_dir = secrets_dir or current().data.secrets_dir or kubelet.pods.root.parent / "secrets"
        self.local = local if local is not None else current().local
        self.bus, self.kubelet, self.node, self.gpu_memory_mb = bus, kubelet, node, gpu_memory_mb
        self.lock, self.publish, self.save = lock, publish, save
        self.runtime: PodRuntime = runtime or HostPython(self.local)
        self._sources: dict[tuple[str, str], bytes] = {}  # (snapshot, digest) -> its bytes, verified (``source``)
        self._said: dict[str, tuple[str, float]] = {}  # pod -> the last PreparingEnvironment message, when
        self.tas = False  # the platform declares topologies: a pod's Kueue TAS request was honoured by admission

    async def launch(self, wl: LocalWorkload, p: LocalPod) -> None:
        """One step towards starting a Pending pod: announce it, place the project, let the runtime prepare,
        then hand it to the kubelet and record it as Running. A pod the host cannot start fails here."""
        now = time.time()
        if not p.added:
            await self.publish(wl, "Pod", p.obj, "added")
            p.added = True
        deadline = float(wl.job["spec"].get("activeDeadlineSeconds") or 0)
        spent = now - wl.admitted_at if wl.admitted_at else 0.0
        if deadline and spent >= deadline:  # the deadline counts from admission, preparation included
            self.forget(p)
            await self._failed_to_start(wl, p, "DeadlineExceeded",
                                        f"Job was active longer than specified deadline ({deadline:g}s) before its "
                                        "pod could start", now)
            return
        try:
            manifest = self._manifest(wl, p)
            project = await self._place_source(wl, p, manifest)
            if self.users is not None:  # its environment is built as the workspace's user, from the project
                self.kubelet.give_project(p.name, project, self.users.user(wl.workspace))
        except RunAsError as exc:
            await self._failed_to_start(wl, p, "CreateContainerError", str(exc), now)
            return
        except PodSpecError as exc:
            await self._failed_to_start(wl, p, exc.reason, exc.message, now)
            return
        if deadline:  # what is left of it once the pod starts
            manifest["spec"]["activeDeadlineSeconds"] = max(1, math.ceil(deadline - spent))
        outcome = self.runtime.prepare(wl, p.name, project)
        if isinstance(outcome, Preparing):
            await self._say_preparing(wl, p, outcome.message)
            return
        # the runtime's last progress, unless already said: a build that began (and ended) between two looks
        await self._say_preparing(wl, p, outcome.progress, force=True)
        self.forget(p)
        if isinstance(outcome, Failed):
            await self._failed_to_start(wl, p, outcome.reason, outcome.message, now)
            return
        ignored = kubernetes_only(manifest, in_engine=bool(outcome.engine), tas=self.tas)  # said, like an ignored image
        warning = "; ".join(w for w in (outcome.warning, ignored) if w)
        if warning and warning != outcome.progress:  # an ignored image's warning is the runtime's progress too
            await self._preparing(wl, p, warning)
        for key, value in outcome.environment.items():
            p.obj["metadata"].setdefault("annotations", {})[f"environment.taugrid.io/{key}"] = str(value)
        if outcome.engine:  # the image is the environment: its own python, run by the engine (see containers)
            manifest["metadata"].setdefault("annotations", {})[ENGINE_ANNOTATION] = outcome.engine
        else:
            manifest = replace_python(_activated(manifest, outcome.python), outcome.python)
        p.phase, p.started = "Running", now
        try:
            await self.save(wl)  # the kubelet has it now: a restart re-adopts it, never launches it twice
        except BaseException:
            # Not recorded (the bus failed, e.g. its only server restarting): the pod stays Pending, so the next
            # tick launches it again. Left Running in memory it would never be handed to the kubelet, and its run
            # would wait at `admitted` for good. The kubelet has nothing yet, so nothing can run twice.
            p.phase, p.started = "Pending", 0.0
            raise
        await self.kubelet.start(manifest, lambda status: self._on_status(wl, p, status))

    async def _place_source(self, wl: LocalWorkload, p: LocalPod, manifest: dict[str, Any]) -> Path:
        """Put the submitted project where the pod's containers look for it, once: the source volume that the
        rendered fetch init container would fill (locally the controller is the fetcher), else the pod's
        working directory. Returns that directory."""
        volumes = {v.get("name") for v in manifest["spec"].get("volumes") or []}
        project = (self.kubelet.volume_dir(p.name, SOURCE_VOLUME) if SOURCE_VOLUME in volumes
                   else self.kubelet.workdir(p.name))
        marker = self.kubelet.pods.dir(p.name) / SOURCE_PLACED
        if wl.source_object and not marker.exists():
            digest = str((manifest["metadata"].get("annotations") or {}).get(SOURCE_DIGEST_ANNOTATION, ""))
            data = await self.source(wl.source_object, digest)
            if data:
                try:
                    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
                        archive.extractall(project, filter="data")
                except (tarfile.TarError, OSError) as exc:
                    raise PodSpecError("CreateContainerError",
                                       f"source snapshot {wl.source_object} cannot be unpacked: {exc}") from exc
            marker.write_text(wl.source_object)
        return project

    async def adopt(self, wl: LocalWorkload, p: LocalPod) -> None:
        """After a restart: watch a pod that was started before (the kubelet re-adopts it by name and uid and runs
        what it stored; the manifest built here only matters if the restart came before the kubelet stored it)."""
        try:
            manifest = self._manifest(wl, p)
        except PodSpecError:
            manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": p.obj["metadata"], "spec": p.obj["spec"]}
        manifest = replace_python(manifest, host_python(self.local))
        await self.kubelet.start(manifest, lambda status: self._on_status(wl, p, status))

    async def stop(self, p: LocalPod, reason: str) -> None:
        await self.kubelet.stop(p.name, reason=reason)

    async def take_down(self, wl: LocalWorkload, pods: list[LocalPod], reason: str, *, final: bool = False) -> None:
        """Pods taken away from a workload that lives on (a preemption, a PodsReady timeout, a shrink): each is
        forgotten, a running one has its logs shipped (``final``: its last) and is stopped (SIGTERM, then SIGKILL
        after its grace), and each is announced deleted. The caller drops them from ``wl.pods``."""
        for p in pods:
            self.forget(p)
            if p.phase == "Running" and not p.sim_end:
                await self.ship_logs(wl, p, final=final)
                await self.stop(p, reason)
            p.phase = "Deleted"
            await self.publish(wl, "Pod", p.obj, "deleted")

    def _manifest(self, wl: LocalWorkload, p: LocalPod) -> dict[str, Any]:
        # the visibility variables of the vendor whose GPUs admission gave the pod (a GPU share is NVIDIA's)
        vendor = devices.vendor_of_resources(r for r, v in wl.per_pod.items() if v > 0)
        env = {**devices.visibility_env(vendor or (devices.DEFAULT_VENDOR if p.gpus else None), p.gpus),
               "TAU_LOCAL": "1", "TAU_NODE_NAME": p.node or self.node, "PYTHONUNBUFFERED": "1"}
        if wl.gpu_fraction or wl.gpu_memory_mb:
            fraction = wl.gpu_fraction or min(1.0, wl.gpu_memory_mb / (self.gpu_memory_mb or 81920))
            env["TAU_GPU_FRACTION"] = f"{fraction:g}"
            mem = wl.gpu_memory_mb or int(fraction * self.gpu_memory_mb)
            if mem:
                env["TAU_GPU_MEMORY_MB"] = str(mem)
        literal = _literal_env(wl)
        if wl.requeues:  # restarted after a preemption or a PodsReady timeout: same attempt, resume from checkpoint
            env["TAU_RETRY_REASON"] = wl.retry_reason or "Preempted"
            env["TAU_RESUME_FROM"] = literal.get("TAU_RESUME_FROM") or literal.get("TAU_CHECKPOINT_DIR", "")
        if not p.pod_set and (wl.pods_wanted > 1 or wl.rdzv_port):  # multi-node, or elastic (it may grow from one)
            env["MASTER_ADDR"] = literal.get("MASTER_ADDR", "127.0.0.1")
            env["MASTER_PORT"] = str(wl.rdzv_port)
            # rank i's node, as admission placed it (rank 0's first: where MASTER_ADDR's rendezvous runs); a
            # topology request's domains fill in rank order, so consecutive ranks share the lowest domain
            env["TAU_RANK_NODES"] = ",".join(q.node or self.node for q in sorted(wl.pods, key=lambda q: q.index))
        for key in ("TAU_OUTPUT_DIR", "TAU_CHECKPOINT_DIR"):  # the platform's host directories
            if literal.get(key):
                try:
                    if self.users is not None:
                        runas.make_private_dirs(Path(literal[key]), self.users.user(wl.workspace))
                    else:
                        Path(literal[key]).mkdir(parents=True, exist_ok=True)
                except (OSError, RunAsError) as exc:
                    raise PodSpecError("CreateContainerError", f"cannot create {key}={literal[key]}: {exc}") from exc
        return pod_manifest(wl.job, p.obj, index=p.index, pods=wl.pods_wanted, env=env, rdzv_port=wl.rdzv_port,
                            memory_limit=wl.memory_limit, hang_timeout_s=wl.hang_timeout_s, role=p.pod_set,
                            agent_port=free_port() if p.pod_set else 0, gpus=len(p.gpus))

    def forget(self, p: LocalPod) -> None:
        self.runtime.forget(p.name)
        self._said.pop(p.name, None)

    async def _say_preparing(self, wl: LocalWorkload, p: LocalPod, message: str, *, force: bool = False) -> None:
        """The pod's preparation progress (``exec.preparing`` downstream), at most once a second."""
        said, at = self._said.get(p.name, ("", 0.0))
        now = time.time()
        if not message or message == said or (not force and now - at < PREPARING_REFRESH_S):
            return
        await self._preparing(wl, p, message)
        self._said[p.name] = (message, now)  # once published: one the bus did not take is said again

    async def _preparing(self, wl: LocalWorkload, p: LocalPod, message: str) -> None:
        waiting = {"waiting": {"reason": "PreparingEnvironment", "message": message}}
        p.obj["status"]["containerStatuses"] = [{"name": "main", "ready": False, "restartCount": 0, "state": waiting}]
        await self.publish(wl, "Pod", p.obj, "modified")

    async def _failed_to_start(self, wl: LocalWorkload, p: LocalPod, reason: str, message: str, now: float) -> None:
        objects.pod_terminated(p.obj, exit_code=128, reason=reason, message=message, started=now, at=now)
        p.phase = "Failed"
        await self.save(wl)
        await self.publish(wl, "Pod", p.obj, "modified")

    async def _on_status(self, wl: LocalWorkload, p: LocalPod, status: dict[str, Any]) -> None:
        """The kubelet's report: publish the Pod as it now is (last logs first, when it has finished)."""
        async with self.lock:
            if not any(q is p for q in wl.pods) or p.phase in (*TERMINAL, "Deleted"):
                return  # a pod of an earlier admission (preempted), or one already settled
            terminal = status.get("phase") in TERMINAL
            if terminal:
                await self.ship_logs(wl, p, final=True)
            status = _with_hint(copy.deepcopy(status), self.kubelet.pods.manifest(p.name), self.secrets_dir)
            p.obj["status"] = _with_fetch(status, p.obj["spec"])
            if wl.state != "deleted":
                await self.publish(wl, "Pod", p.obj, "modified")
            if _config_error(status) and not terminal:
                await self.kubelet.stop(p.name, reason="CreateContainerConfigError")  # locally it cannot appear
            if (status.get("phase") == "Running" and wl.job["kind"] == "RayJob" and p.pod_set != WORKERS
                    and objects.rayjob_running(wl.job)):
                # The RayJob speaks for a Ray run's process (its pods are head/workers): it carries the environment.
                # Its entrypoint runs in its one pod, or a Ray cluster's head pod (not a worker that started first).
                wl.job["metadata"].setdefault("annotations", {}).update(
                    {k: v for k, v in p.obj["metadata"].get("annotations", {}).items()
                     if k.startswith("environment.taugrid.io/")})
                await self.publish(wl, "RayJob", wl.job, "modified")
            if terminal:
                p.phase = str(status["phase"])
                await self.save(wl)

    async def ship_logs(self, wl: LocalWorkload, p: LocalPod, *, final: bool) -> None:
        """New complete lines of every container, init containers first, in chunks; all that is left if final."""
        manifest = self.kubelet.pods.manifest(p.name) or {"spec": {}}
        names = [str(c.get("name")) for c in [*(manifest["spec"].get("initContainers") or []),
                                              *(manifest["spec"].get("containers") or [])]]
        for container in names:
            while True:
                start = p.log_offsets.get(container, 0)
                lines, offset = self.kubelet.read_log(p.name, container, offset=start, final=final)
                if not lines:
                    break
                chunk = LogChunk(run_id=wl.run_id, attempt=wl.attempt, pod=p.name, seq=p.log_seq,
                                 lines=[ln.text for ln in lines])
                await self.bus.publish(log_subject(wl.workspace, wl.run_id, wl.attempt), chunk, event_type="chunk",
                                       ce_subject=wl.run_id, msg_id=f"{p.name}.{container}.{start}",
                                       workspace=wl.workspace, attempt=wl.attempt, family="log",
                                       traceparent=wl.traceparent)
                p.log_offsets[container], p.log_seq = offset, p.log_seq + 1
                if not final:
                    break

    async def source(self, name: str, digest: str = "") -> bytes | None:
        """The snapshot's bytes, checked against its content address and the pod's digest annotation, as the
        Kubernetes init container checks them; a mismatch fails the pod (``SourceMismatch``, never retried).
        Fetched once per snapshot and digest while it stays among the last ``SOURCES_KEPT_BYTES`` fetched: the
        name is the content's address, so a later pod of the same snapshot gets what a fetch would give."""
        if not name:
            return None
        kept = self._sources.get((name, digest))
        if kept is not None:
            self._sources[(name, digest)] = self._sources.pop((name, digest))  # the most recently used last
            return kept
        try:
            data = await snapshots.fetch(self.bus, name, digest)
        except snapshots.SourceMismatch as bad:
            raise PodSpecError("SourceMismatch", str(bad)) from bad
        except NotFound:
            log.warning("source snapshot %s not found; the pod starts in an empty directory", name)
            return None
        if len(data) <= SOURCES_KEPT_BYTES:
            self._sources[(name, digest)] = data
            while sum(len(v) for v in self._sources.values()) > SOURCES_KEPT_BYTES:
                self._sources.pop(next(iter(self._sources)))  # the least recently used first
        return data


def failure(p: LocalPod) -> tuple[str, str]:
    """(reason, message) of a failed pod for its Job: the main container's termination, else the pod's own."""
    status = p.obj.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode") != 0:
            return str(term.get("reason") or "Error"), f"pod {p.name} failed: {term.get('reason')} " \
                                                       f"(exit code {term.get('exitCode')})"
    reason = str(status.get("reason") or "Error")
    return reason, f"pod {p.name} failed: {status.get('message') or reason}"


def _literal_env(wl: LocalWorkload) -> dict[str, str]:
    c = main_container(template(wl.job).get("spec") or {})
    return {e["name"]: str(e["value"]) for e in c.get("env") or [] if "value" in e}


def _activated(manifest: dict[str, Any], python: str) -> dict[str, Any]:
    """As if the researcher's environment were activated: its bin directory first on PATH, its VIRTUAL_ENV."""
    if python == sys.executable:
        return manifest
    out = copy.deepcopy(manifest)
    root = Path(python).parent.parent
    env = {"PATH": os.pathsep.join(filter(None, [str(Path(python).parent), os.environ.get("PATH", "")])),
           "VIRTUAL_ENV": str(root) if (root / "pyvenv.cfg").exists() else ""}
    for c in [*(out["spec"].get("initContainers") or []), *(out["spec"].get("containers") or [])]:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()] + [
            e for e in c.get("env") or [] if e.get("name") not in env]
    return out


def _config_error(status: dict[str, Any]) -> bool:
    return any(((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CreateContainerConfigError"
               for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])])


def _with_fetch(status: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The published Pod keeps the rendered source-fetch init container, which the controller did in its place
    before the kubelet started the pod: report it done, first, as a kubelet that ran it would."""
    fetch = next((c for c in spec.get("initContainers") or [] if c.get("name") == FETCH_CONTAINER), None)
    if fetch is None or status.get("phase") == "Pending" and not status.get("startTime"):
        return status
    at = status.get("startTime", "")
    done = {"name": FETCH_CONTAINER, "image": fetch.get("image", ""), "imageID": "", "ready": False,
            "started": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at, "finishedAt": at}}}
    status["initContainerStatuses"] = [done, *(status.get("initContainerStatuses") or [])]
    return status


def _with_hint(status: dict[str, Any], manifest: dict[str, Any] | None, secrets_dir: Path) -> dict[str, Any]:
    """Say what to add for a missing secret or config map (there is no API server locally): the config-map
    variable to export, or the entry of the workspace's secrets file."""
    if not _config_error(status):
        return status
    scope = objects.workspace_of(manifest or {})
    store = SecretStore(secrets_dir)
    try:
        known = store.load(scope)
    except PodSpecError:
        known = {}
    missing = envrefs.missing(manifest or {}, secrets=known)
    if not missing:
        return status
    entries = [m for m in missing if not m.startswith("TAU_CONFIGMAP_")]
    hint = (f"locally, add {', '.join(entries)} (secret.key) to {store.path(scope)} (mode 0600)"
            if entries else "")
    exports = [m for m in missing if m.startswith("TAU_CONFIGMAP_")]
    if exports:
        hint = "; ".join(h for h in (hint, f"locally, export {', '.join(exports)}") if h)
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError" and "locally," not in waiting.get("message", ""):
            waiting["message"] = f"{waiting.get('message', '')}: {hint}"
    return status
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError" and "export" not in waiting.get("message", ""):
            waiting["message"] = f"{waiting.get('message', '')}: locally, export {', '.join(missing)}"
    return status
