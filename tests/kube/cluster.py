"""An emulated Kubernetes cluster for the tests: Kueue admission and the Job controller over ``FakeKube``,
with the real local kubelet (``taugrid.local.kubelet``) running every pod as host processes.

What happens to a suspended Job (or RayJob) of ours, as on a cluster with Kueue and KubeRay:

* **Kueue**: a Workload named as Kueue names it (``job-<job>-<hash>``, label ``kueue.x-k8s.io/job-uid``, an
  ownerReference, ``spec.queueName``, one PodSet per pod group), first pending (``QuotaReserved=False``) then
  admitted (``QuotaReserved``/``Admitted``, ``status.admission`` with podSetAssignments); then the Job is
  unsuspended. No quota arithmetic, queue order, preemption or admission checks: everything is admitted.
* **Job controller**: one Pod per completion (Indexed Jobs: ``<job>-<index>-<rand>`` with the completion-index
  annotation and label, ``JOB_COMPLETION_INDEX`` in every container, ``hostname`` ``<job>-<index>`` when the
  template names a ``subdomain``), labels and ownerReference as the real controller sets them. The Job's
  ``status`` (``active``/``succeeded``/``failed``, ``startTime``, ``Complete`` or ``Failed`` with
  ``BackoffLimitExceeded``) follows its pods; a failed Job's other pods are stopped. Only ``backoffLimit: 0``
  (what taugrid renders: retries are recovery's) is modelled.
* **KubeRay** (RayJob): a head pod from ``headGroupSpec`` whose first container runs the RayJob's
  ``entrypoint`` through ``/bin/sh -c`` (without Ray installed, the entrypoint is a plain script), and
  ``replicas`` worker pods per worker group that stay up (standing in for ``ray start --block``) until the head
  ends, when they are deleted with the cluster (``shutdownAfterJobFinishes``). As on a real cluster, where the
  driver runs on the head and its output goes to Ray's job log (tailed by KubeRay's submitter pod, which carries
  no tau labels), the entrypoint's output goes to a driver log file (``ray_driver_log``), not to the head
  container's log. ``status.jobStatus`` / ``jobDeploymentStatus`` follow the head pod.
* **kubelet**: each pod goes to ``taugrid.local.kubelet.Kubelet`` (init containers, then containers, env with
  ``fieldRef``/``secretKeyRef`` resolved from FakeKube's Secrets and ConfigMaps, volumes as directories). Its
  status callback PATCHes ``pods/<pod>/status`` over real HTTP; the pod log endpoint streams the kubelet's
  own log files (with their timestamps) through ``FakeLogs.sources``. The image is ignored.
* **Cluster DNS**: there is none on the host, so a multi-node rendezvous endpoint ``<job>-0.<subdomain>``
  is pointed at ``127.0.0.1:<free port>`` (``taugrid.local.rendezvous.local_command``), and ``MASTER_ADDR`` /
  ``MASTER_PORT`` are set to the same, as torchrun's agent would export them.
* **Garbage collection**: a deleted Job or RayJob takes its pods (stopped by the kubelet) and Workload along.

Before each transition that another kind's watch must not overtake (admission, then running, then the Job's
end), the controller waits until the previous step shows as a run event when it is given the bus: a real cluster
takes seconds between those steps, here all writes would land in one millisecond and the bridge's per-kind
watches would race each other (cross-kind order is not something the bridge promises).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from taugrid import runrecord
from taugrid.bus import Bus
from taugrid.local.controller import excluded_nodes
from taugrid.local.kubelet import Kubelet
from taugrid.local.rendezvous import local_command
from taugrid.ports import free_port
from tests.kube.conftest import FakeKube

log = logging.getLogger("tests.kube.cluster")

JOBS, PODS, NODES = ("batch", "v1", "jobs"), ("", "v1", "pods"), ("", "v1", "nodes")
RAYJOBS = ("ray.io", "v1", "rayjobs")
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")
SECRETS, CONFIGMAPS = ("", "v1", "secrets"), ("", "v1", "configmaps")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def image_env() -> dict[str, str]:
    """What every container starts with, standing in for the image: the host's PATH with this interpreter's
    directory first (the taugrid image has ``python`` with taugrid installed, which the fetch needs)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "USER")}
    return {**keep, "PATH": path, "PYTHONUNBUFFERED": "1"}


class EmulatedCluster:
    """``await cluster.start()`` … ``await cluster.stop()``. ``base_url``: the FakeKube server's URL (pod
    status goes over HTTP, as a kubelet's does); ``bus``: to pace transitions on run events (None: no pacing)."""

    def __init__(self, fake: FakeKube, base_url: str, root: Path, *, bus: Bus | None = None,
                 poll_s: float = 0.05, nodes: list[str] | None = None) -> None:
        """``nodes``: schedule pods onto these Node objects (in order: the first that is not cordoned —
        ``spec.unschedulable`` or an untolerated NoSchedule taint — and not excluded by the pod's required
        ``kubernetes.io/hostname NotIn`` affinity; a pod with none waits); None: every pod on ``node-1``."""
        self.fake, self.base_url, self.bus, self.poll_s = fake, base_url.rstrip("/"), bus, poll_s
        self.nodes = nodes
        self.root = root
        self.kubelet = Kubelet(root / "kubelet", resolve_secret=self._secret, resolve_config_map=self._config_map,
                               claims_dir=root / "claims", base_env=image_env(), poll_s=0.1)
        self.drop_after_writes = False  # cut every open watch right after each write (resume tests)
        self.seen: set[tuple[str, str, str]] = set()  # (kind, namespace, name) handled
        self.tasks: list[asyncio.Task[None]] = []
        self.pod_status: dict[tuple[str, str], dict[str, Any]] = {}  # (ns, pod) → last status patched
        self.status_patches = 0
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.Task[None] | None = None
        fake.logs.sources = self._log_source  # the pod log endpoint serves the kubelet's files

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        self._loop = asyncio.create_task(self._run(), name="emulated-cluster")

    async def stop(self) -> None:
        # Open log streams of pods that will never finish now would keep the API server from shutting down.
        self.fake.logs.drop()
        tasks = [t for t in [self._loop, *self.tasks] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for name in list(self.kubelet.handles):
            await self.kubelet.stop(name, grace_s=0.5, reason="ClusterStopped")
        await asyncio.sleep(0.3)
        await self.kubelet.close()
        if self._session is not None:
            await self._session.close()

    # ---------------------------------------------------------------- scripting helpers

    def ray_driver_log(self, rayjob: str) -> Path:
        """Where a RayJob's driver output goes (Ray's ``job-driver-*.log`` on the head)."""
        return self.root / "ray" / rayjob / "job-driver.log"

    def _write(self, fn: Callable[[], Any]) -> Any:
        out = fn()
        if self.drop_after_writes:
            self.fake.drop_watches()
        return out

    def _exists(self, res: tuple[str, str, str], ns: str, name: str) -> bool:
        return (res, ns, name) in self.fake.objects

    async def _shown(self, run_id: str, attempt: int, event_type: str, timeout: float = 15.0) -> None:
        """Wait until the previous transition became a run event (a real cluster is that slow anyway)."""
        if self.bus is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = await runrecord.find(self.bus, run_id)
            if record is not None and (record.evidence_digest or any(  # sealed: it has every event, no history
                h["type"] == event_type and h["attempt"] == attempt for h in record.history
            )):
                return
            await asyncio.sleep(0.05)

    def _resolve(self, res: tuple[str, str, str], ns: str, name: str) -> dict[str, str] | None:
        obj = self.fake.objects.get((res, ns, name))
        if obj is None:
            return None
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()} if res == SECRETS \
            else dict(obj.get("data") or {})
        return {**data, **(obj.get("stringData") or {})}

    def _secret(self, ns: str, name: str) -> dict[str, str] | None:
        return self._resolve(SECRETS, ns, name)

    def _config_map(self, ns: str, name: str) -> dict[str, str] | None:
        return self._resolve(CONFIGMAPS, ns, name)

    # ---------------------------------------------------------------- the controllers' loop

    async def _run(self) -> None:
        while True:
            for (res, ns, name), obj in list(self.fake.objects.items()):
                if res not in (JOBS, RAYJOBS) or not (obj.get("spec") or {}).get("suspend"):
                    continue
                key = (res[2], ns or "default", name)
                if key in self.seen:
                    continue
                self.seen.add(key)
                self.tasks.append(asyncio.create_task(self._lifecycle(res, ns or "default", name, obj),
                                                      name=f"lifecycle-{name}"))
            await asyncio.sleep(self.poll_s)

    async def _lifecycle(self, res: tuple[str, str, str], ns: str, name: str, job: dict[str, Any]) -> None:
        try:
            await self._admit_and_run(res, ns, name, job)
        except Exception:  # a broken emulator must show, not hang the test silently
            log.exception("emulated cluster: lifecycle of %s failed", name)
            raise

    async def _admit_and_run(self, res: tuple[str, str, str], ns: str, name: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        labels, uid = meta["labels"], meta["uid"]
        run_id, attempt = labels["taugrid.io/run-id"], int(labels["taugrid.io/attempt"])
        kind = job["kind"]
        owner = {"apiVersion": job["apiVersion"], "kind": kind, "name": name, "uid": uid, "controller": True}
        groups = pod_groups(job)
        prefix = "rayjob" if kind == "RayJob" else "job"
        wl_name = f"{prefix}-{name}-{hashlib.sha256(uid.encode()).hexdigest()[:5]}"
        wl = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": wl_name, "namespace": ns, "labels": {"kueue.x-k8s.io/job-uid": uid},
                         "ownerReferences": [owner]},
            "spec": {"queueName": labels["kueue.x-k8s.io/queue-name"],
                     "podSets": [{"name": g, "count": n, "template": t} for g, n, t in groups]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                       "message": "waiting for the scheduler", "lastTransitionTime": now()}]},
        }
        self._write(lambda: self.fake.put(WORKLOADS, wl))
        await self._shown(run_id, attempt, "admission.queued")
        if not self._exists(res, ns, name):
            return await self._collect(ns, wl_name, [])

        def admit(o: dict[str, Any]) -> None:
            t = now()
            o["status"] = {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "lastTransitionTime": t},
                    {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": t},
                ],
                "admission": {"clusterQueue": "lab", "podSetAssignments": [
                    {"name": g, "count": n, "flavors": {"cpu": "default", "memory": "default"}}
                    for g, n, _ in groups]},
            }

        self._write(lambda: self.fake.modify(WORKLOADS, ns, wl_name, admit))
        await self._shown(run_id, attempt, "admission.admitted")
        if not self._exists(res, ns, name):
            return await self._collect(ns, wl_name, [])

        start = now()

        def unsuspend(o: dict[str, Any]) -> None:
            o["spec"]["suspend"] = False
            if kind == "RayJob":
                o["status"] = {"jobDeploymentStatus": "Initializing", "startTime": start}
            else:
                o["status"] = {"startTime": start, "active": sum(n for _, n, _ in groups)}

        self._write(lambda: self.fake.modify(res, ns, name, unsuspend))
        pods = self._pods(job, owner)
        for pod in pods:
            pod["spec"]["nodeName"] = await self._schedule(pod["spec"])
        finals: dict[str, asyncio.Future[dict[str, Any]]] = {}
        for pod in pods:
            created = self._write(lambda pod=pod: self.fake.put(PODS, pod))
            finals[pod["metadata"]["name"]] = asyncio.get_running_loop().create_future()
            await self.kubelet.start(copy.deepcopy(created), self._reporter(ns, pod["metadata"]["name"],
                                                                            finals))
        if kind == "RayJob":
            await self._ray_status(ns, name, "Running", "RUNNING")
        await self._follow(res, ns, name, wl_name, job, pods, finals, run_id, attempt, start)

    def _reporter(self, ns: str, pod: str, finals: dict[str, asyncio.Future[dict[str, Any]]],
                  ) -> Callable[[dict[str, Any]], Any]:
        async def on_status(status: dict[str, Any]) -> None:
            await self._patch_pod_status(ns, pod, status)
            if status.get("phase") in ("Succeeded", "Failed") and not finals[pod].done():
                finals[pod].set_result(status)
        return on_status

    async def _patch_pod_status(self, ns: str, pod: str, status: dict[str, Any]) -> None:
        """PATCH pods/<pod>/status over HTTP, as the kubelet does; a pod deleted meanwhile is no error."""
        assert self._session is not None
        url = f"{self.base_url}/api/v1/namespaces/{ns}/pods/{pod}/status"
        async with self._session.patch(url, json={"status": status},
                                       headers={"Content-Type": "application/merge-patch+json"}) as resp:
            if resp.status == 404:
                return
            resp.raise_for_status()
        self.pod_status[(ns, pod)] = status
        self.status_patches += 1
        if self.drop_after_writes:
            self.fake.drop_watches()

    # ---------------------------------------------------------------- the Job controller's part

    def _pods(self, job: dict[str, Any], owner: dict[str, Any]) -> list[dict[str, Any]]:
        name, ns = job["metadata"]["name"], job["metadata"].get("namespace", "default")
        uid = job["metadata"]["uid"]
        out: list[dict[str, Any]] = []
        if job["kind"] == "RayJob":
            spec = job["spec"]["rayClusterSpec"]
            head = ray_pod(spec["headGroupSpec"]["template"], entrypoint=str(job["spec"].get("entrypoint", "")),
                           driver_log=self.ray_driver_log(name))
            out.append(self._pod(head, f"{name}-head-{_rand()}", ns, {"ray.io/node-type": "head",
                                                                     "ray.io/cluster": name}, owner))
            for group in spec.get("workerGroupSpecs") or []:
                for _ in range(int(group.get("replicas") or 0)):
                    worker = ray_pod(group["template"], entrypoint="", driver_log=None)
                    out.append(self._pod(worker, f"{name}-{group.get('groupName', 'worker')}-{_rand()}", ns,
                                         {"ray.io/node-type": "worker", "ray.io/cluster": name}, owner))
            return out
        spec = job["spec"]
        completions = int(spec.get("completions") or 1)
        indexed = spec.get("completionMode") == "Indexed"
        port = free_port() if completions > 1 else 0
        for index in range(completions):
            tmpl = copy.deepcopy(spec["template"])
            extra = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                     "batch.kubernetes.io/job-name": name, "job-name": name}
            pod_name = f"{name}-{index}-{_rand()}" if indexed else f"{name}-{_rand()}"
            if indexed:
                extra[COMPLETION_INDEX] = str(index)
                tmpl.setdefault("metadata", {}).setdefault("annotations", {})[COMPLETION_INDEX] = str(index)
                pspec = tmpl["spec"]
                if pspec.get("subdomain"):
                    pspec["hostname"] = f"{name}-{index}"
                for c in [*(pspec.get("initContainers") or []), *pspec["containers"]]:
                    if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in c.get("env") or []):
                        c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                            "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
                if port:
                    no_dns(pspec, job=name, port=port)
            out.append(self._pod(tmpl, pod_name, ns, extra, owner))
        return out

    @staticmethod
    def _pod(tmpl: dict[str, Any], name: str, ns: str, labels: dict[str, str], owner: dict[str, Any],
             ) -> dict[str, Any]:
        meta = tmpl.get("metadata") or {}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner],
                         "labels": {**(meta.get("labels") or {}), **labels},
                         "annotations": dict(meta.get("annotations") or {})},
            "spec": {**copy.deepcopy(tmpl["spec"]), "nodeName": ""},
            "status": {"phase": "Pending"},
        }

    async def _schedule(self, spec: dict[str, Any]) -> str:
        """The scheduler's part, for a list of nodes: a node that takes new pods and that the pod may use."""
        if self.nodes is None:
            return "node-1"
        excluded = set(excluded_nodes(spec))
        while True:
            for name in self.nodes:
                node = self.fake.objects.get((NODES, None, name))
                if node is None or name in excluded:
                    continue
                nspec = node.get("spec") or {}
                tolerated = {t.get("key") for t in spec.get("tolerations") or []}
                if nspec.get("unschedulable") or any(t.get("effect") in ("NoSchedule", "NoExecute")
                                                     and t.get("key") not in tolerated
                                                     and t.get("key") != "nvidia.com/gpu"
                                                     for t in nspec.get("taints") or []):
                    continue
                return name
            await asyncio.sleep(self.poll_s)

    async def _follow(self, res: tuple[str, str, str], ns: str, name: str, wl_name: str, job: dict[str, Any],
                      pods: list[dict[str, Any]], finals: dict[str, asyncio.Future[dict[str, Any]]],
                      run_id: str, attempt: int, start: str) -> None:
        """Until the Job (or the RayJob's head) has finished, or the Job was deleted (garbage collection)."""
        names = [p["metadata"]["name"] for p in pods]
        evicted: set[str] = set()
        decisive = names[:1] if job["kind"] == "RayJob" else names  # the head decides a RayJob
        while True:
            if not self._exists(res, ns, name):
                return await self._collect(ns, wl_name, names)
            for n in names:  # evicted (a drain): the kubelet stops it within the eviction's grace period
                if not finals[n].done() and (PODS, ns, n) not in self.fake.objects and n not in evicted:
                    evicted.add(n)
                    grace = next((float(((e.get("body") or {}).get("deleteOptions") or {}).get(
                        "gracePeriodSeconds", 30)) for e in reversed(self.fake.evictions) if e["name"] == n), None)
                    if grace is not None:
                        await self.kubelet.stop(n, grace_s=grace, reason="Evicted")
            done = {n: finals[n].result() for n in decisive if finals[n].done()}
            failed = [n for n, s in done.items() if s.get("phase") == "Failed"]
            if failed or len(done) == len(decisive):
                break
            if job["kind"] != "RayJob":
                self._job_counts(ns, name, finals, names, start)
            await asyncio.sleep(self.poll_s)
        ok = not failed
        if job["kind"] != "RayJob":
            for n in names:  # a failed Job's other pods: stopped (a RayJob's workers go with its cluster, below)
                if not finals[n].done():
                    await self.kubelet.stop(n, grace_s=1.0)
        if ok:
            await self._shown(run_id, attempt, "exec.running")
        elif job["kind"] != "RayJob":  # the Job controller reacts to the pod's failure: the pod's report first
            await self._shown(run_id, attempt, "exec.failed")
        end = now()
        if job["kind"] == "RayJob":
            await self._ray_status(ns, name, "Complete" if ok else "Failed", "SUCCEEDED" if ok else "FAILED",
                                   end=end)
        else:
            self._job_counts(ns, name, finals, names, start, end=end, ok=ok)

        def wl_finished(o: dict[str, Any]) -> None:
            o["status"]["conditions"].append({"type": "Finished", "status": "True",
                                              "reason": "Succeeded" if ok else "Failed",
                                              "lastTransitionTime": end})

        if self._exists(WORKLOADS, ns, wl_name):
            self._write(lambda: self.fake.modify(WORKLOADS, ns, wl_name, wl_finished))
        if job["kind"] == "RayJob":  # shutdownAfterJobFinishes: the RayCluster and its worker pods are deleted
            for n in names[1:]:
                if (PODS, ns, n) in self.fake.objects:
                    self._write(lambda n=n: self.fake.remove(PODS, ns, n))
                await self.kubelet.stop(n, grace_s=1.0)

    def _job_counts(self, ns: str, name: str, finals: dict[str, asyncio.Future[dict[str, Any]]],
                    names: list[str], start: str, *, end: str = "", ok: bool = True) -> None:
        phases = [finals[n].result().get("phase") if finals[n].done() else "" for n in names]
        status: dict[str, Any] = {"startTime": start, "active": sum(1 for p in phases if not p)}
        for field, phase in (("succeeded", "Succeeded"), ("failed", "Failed")):
            if phases.count(phase):
                status[field] = phases.count(phase)
        if end:
            status["active"] = 0
            status["conditions"] = [
                {"type": "Complete", "status": "True", "reason": "Completed", "lastTransitionTime": end}
                if ok else
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit", "lastTransitionTime": end}]
            if ok:
                status["completionTime"] = end
        if not self._exists(JOBS, ns, name):
            return
        if (self.fake.objects[(JOBS, ns, name)].get("status") or {}) == status:
            return

        def change(o: dict[str, Any]) -> None:
            o["status"] = status

        self._write(lambda: self.fake.modify(JOBS, ns, name, change))

    async def _ray_status(self, ns: str, name: str, deployment: str, job_status: str, *, end: str = "") -> None:
        if not self._exists(RAYJOBS, ns, name):
            return

        def change(o: dict[str, Any]) -> None:
            st = o.setdefault("status", {})
            st.update({"jobDeploymentStatus": deployment, "jobStatus": job_status, "rayClusterName": name})
            if end:
                st["endTime"] = end

        self._write(lambda: self.fake.modify(RAYJOBS, ns, name, change))

    async def _collect(self, ns: str, wl_name: str, pods: list[str]) -> None:
        """Garbage collection after the Job was deleted: its pods (stopped) and Workload go too."""
        for pod in pods:
            await self.kubelet.stop(pod, grace_s=2.0)
            if (PODS, ns, pod) in self.fake.objects:
                self._write(lambda pod=pod: self.fake.remove(PODS, ns, pod))
        if (WORKLOADS, ns, wl_name) in self.fake.objects:
            self._write(lambda: self.fake.remove(WORKLOADS, ns, wl_name))

    # ---------------------------------------------------------------- the pod log endpoint

    def _log_source(self, namespace: str | None, pod: str, container: str, params: dict[str, str],
                    ) -> Callable[[], AsyncIterator[str]] | None:
        """The kubelet's log of a container it runs (None: not ours, or the container has not started)."""
        if pod not in self.kubelet.handles or not self.kubelet.log_path(pod, container).exists():
            return None
        stamps = params.get("timestamps") == "true"
        since = params.get("sinceTime") or None
        if params.get("follow") == "true":
            return lambda: self.kubelet.follow_log(pod, container, since_time=since, timestamps=stamps)

        async def once() -> AsyncIterator[str]:
            lines, _ = self.kubelet.read_log(pod, container, final=True, since_time=since)
            for ln in lines:
                yield f"{ln.time} {ln.text}" if stamps else ln.text

        return once


def _rand() -> str:
    return uuid.uuid4().hex[:5]


def pod_groups(job: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """Kueue's PodSets: (name, count, template)."""
    if job["kind"] == "RayJob":
        spec = job["spec"]["rayClusterSpec"]
        return [("head", 1, spec["headGroupSpec"]["template"])] + [
            (g.get("groupName", "worker"), int(g.get("replicas") or 0), g["template"])
            for g in spec.get("workerGroupSpecs") or []]
    spec = job["spec"]
    return [("main", int(spec.get("parallelism") or 1), spec["template"])]


def ray_pod(tmpl: dict[str, Any], *, entrypoint: str, driver_log: Path | None) -> dict[str, Any]:
    """A Ray node's pod without Ray: the head's first container runs the entrypoint with its output going to
    ``driver_log`` (Ray's job log), a worker's idles until it is stopped (``ray start --block``)."""
    out = copy.deepcopy(tmpl)
    # KubeRay runs the entrypoint once (a submitter Job, restartPolicy Never); this kubelet runs each container
    # once too (it refuses Always), and a Ray node that dies here is not restarted either.
    out["spec"]["restartPolicy"] = "Never"
    main = out["spec"]["containers"][0]
    if driver_log is not None:
        driver_log.parent.mkdir(parents=True, exist_ok=True)
        main["command"] = ["/bin/sh", "-c", f'({entrypoint}) > "$TAU_RAY_DRIVER_LOG" 2>&1']
        main.setdefault("env", []).append({"name": "TAU_RAY_DRIVER_LOG", "value": str(driver_log)})
    else:
        main["command"] = ["/bin/sh", "-c", "exec sleep 3600"]
    main.pop("args", None)
    return out


def no_dns(spec: dict[str, Any], *, job: str, port: int) -> None:
    """Stand-in for cluster DNS: the rendezvous at ``<job>-0.<subdomain>`` goes to loopback on ``port``, in the
    command, the args and env values; ``MASTER_ADDR``/``MASTER_PORT`` say the same."""
    subdomain = str(spec.get("subdomain") or "")

    def rewrite(words: list[str]) -> list[str]:
        return local_command(words, job=job, subdomain=subdomain, port=port)

    for c in spec.get("containers") or []:
        for key in ("command", "args"):
            if c.get(key):
                c[key] = rewrite(list(c[key]))
        master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env = [e for e in c.get("env") or [] if e.get("name") not in master]
        for e in env:
            if "value" in e:
                e["value"] = rewrite([str(e["value"])])[0]
        c["env"] = [*env, *({"name": k, "value": v} for k, v in master.items())]
