"""Carry out the admission engine's resizes of an elastic run on the local pool (``core/admission/elastic.py``).

Role: a grown run gets pods for the new indices (placed where the engine put them, started like any admitted pod);
a shrunk run has its highest-index pods stopped (SIGTERM, then SIGKILL after the grace) and deleted, and only once
their processes have exited does the engine free their quota and devices (``release_removed``, from a task that
waits for the kubelet's last status of each), so nothing is admitted onto capacity still in use (Kueue #15661:
quota freed before the pods stopped). A Ray worker told to stop drains for up to 30 s; a torchrun agent
finishes its step: the higher-priority run that asked for the shrink waits for that, as on Kubernetes.
torchrun's elastic agents (``--nnodes=MIN:MAX``, c10d rendezvous on pod 0, which a shrink never removes)
restart the workers at the new world size; the script resumes from its last checkpoint. An elastic RayJob's pod set
that resizes is its Ray cluster's workers (``raycluster``): a new worker pod joins the head, a stopped one leaves
the cluster, and the head pod (the entrypoint) stays.

Invariant: runs under the controller's lock, from its admission pass; a run that is no longer running has nothing to
start or stop, and a shrink of it is released at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from taugrid.core.admission import Resize
from taugrid.core.admission import results as R
from taugrid.local import checkpoints, objects, raycluster
from taugrid.local.admit import LocalAdmitter, job_elastic
from taugrid.local.kubelet import PodHandle
from taugrid.local.lanelock import LaneLock
from taugrid.local.podsync import PodSync
from taugrid.local.state import LocalPod, LocalWorkload

log = logging.getLogger(__name__)

# How long a stopped pod may take to exit before its quota is freed regardless (its grace, SIGKILL, then the
# kubelet's report): a pod whose end is never reported (its shim lost) must not hold quota for ever.
STOP_WAIT_S = 120.0


class LocalCluster(Protocol):
    """What a resize uses of ``controller.LocalCluster`` (a protocol: the controller imports this module)."""

    wls: dict[str, LocalWorkload]
    admitter: LocalAdmitter
    podsync: PodSync
    lock: LaneLock
    node: str
    simulate: bool
    releases: set[asyncio.Task[None]]  # shrinks waiting for their removed pods to exit (``_release_when_gone``)

    def wake(self) -> None: ...
    async def save(self, wl: LocalWorkload) -> None: ...
    async def publish(self, wl: LocalWorkload, kind: str, obj: dict[str, Any], change: str) -> None: ...
    def _sim_start(self, wl: LocalWorkload, p: LocalPod, now: float) -> None: ...
    async def _launch_pending(self, wl: LocalWorkload) -> None: ...


async def apply(c: LocalCluster, r: Resize, message: str = "") -> None:
    wl = c.wls.get(r.workload)
    if wl is None or wl.state != "running":
        if r.cause != R.GROWN:
            c.admitter.release_removed(r.workload)
        return
    if r.cause == R.GROWN:
        await _grow(c, wl, r)
    else:
        await _shrink(c, wl, r)
    await _record(c, wl, r, message)
    c.wake()  # a shrink freed capacity; a growth may be followed by another once its cooldown passes


async def shrink_off(c: LocalCluster, wl: LocalWorkload, node: str, reason: str) -> bool:
    """A drain of ``node`` under a running elastic run: when its pods there are its highest indices (never pod 0,
    torchrun's rendezvous host) and the others keep it at or above its minimum, it gives those pods up (``Shrunk``,
    the message naming the node and why) and runs on; the engine grows it back once there is room on a healthy
    node. Whether it did; False leaves the drain to fail the run, as for any other."""
    el = job_elastic(wl.job)
    if any(p.pod_set == raycluster.HEAD and (p.node or c.node) == node for p in wl.pods):
        return False  # a Ray cluster's head (the entrypoint) cannot go
    live = [p for p in _resizable(wl) if p.phase in ("Running", "Pending")]
    if el is None or wl.state != "running" or {p.index for p in live} != set(range(wl.pods_wanted)):
        return False
    there = sorted(p.index for p in live if (p.node or c.node) == node)
    keep = wl.pods_wanted - len(there)
    if not there or there != list(range(keep, wl.pods_wanted)) or keep < max(1, el.min_count):
        return False
    await apply(c, c.admitter.shrink(wl.name, keep, time.time()), message=f"node {node} drained: {reason}")
    return True


async def _grow(c: LocalCluster, wl: LocalWorkload, r: Resize) -> None:
    now = time.time()
    stamp = f"g{int(now * 1000) % 100_000_000}"  # an index may come back after a shrink: a new pod, a new name
    pod_set = raycluster.WORKERS if wl.head_per_pod else ""
    for pl in r.placements:
        name = f"{wl.name}-{pl.index}-{stamp}"
        node = pl.node or c.node
        wl.pods.append(LocalPod.holding(objects.pod(wl.job, name=name, node=node, index=pl.index, at=now,
                                                    pod_set=pod_set),
                                        name=name, index=pl.index, gpus=list(pl.gpus), node=node, pod_set=pod_set))
    wl.pods_wanted = r.new_count
    if c.simulate:
        for p in wl.pods:
            if p.phase == "Pending":
                c._sim_start(wl, p, now)
    await c.save(wl)
    await c._launch_pending(wl)


async def _shrink(c: LocalCluster, wl: LocalWorkload, r: Resize) -> None:
    removed = {pl.index for pl in r.placements}
    gone = [p for p in _resizable(wl) if p.index in removed]
    # the real processes still running: the quota they hold is freed once they have exited, not when told to stop
    stopping = [h for p in gone if p.phase == "Running" and not p.sim_end
                and (h := c.podsync.kubelet.handles.get(p.name)) is not None and not h.done.is_set()]
    await c.podsync.take_down(wl, gone, "Resized", final=True)
    wl.pods = [p for p in wl.pods if not any(p is q for q in gone)]
    wl.pods_wanted = r.new_count
    await c.save(wl)
    if not stopping:
        c.admitter.release_removed(wl.name)
        return
    task = asyncio.create_task(_release_when_gone(c, wl.name, stopping), name=f"release-{wl.name}")
    c.releases.add(task)
    task.add_done_callback(c.releases.discard)


async def _release_when_gone(c: LocalCluster, name: str, stopping: list[PodHandle]) -> None:
    """Free a shrink's held quota once every removed pod's process has exited (or ``STOP_WAIT_S`` passed)."""
    try:
        await asyncio.wait_for(asyncio.gather(*(h.wait() for h in stopping)), STOP_WAIT_S)
    except TimeoutError:
        log.warning("workload %s: %d pod(s) a shrink stopped did not report their end within %.0f s; their quota "
                    "is freed anyway", name, sum(not h.done.is_set() for h in stopping), STOP_WAIT_S)
    async with c.lock:
        c.admitter.release_removed(name)
    c.wake()


def _resizable(wl: LocalWorkload) -> list[LocalPod]:
    """The pods of the pod set that resizes: all of a Job's, a Ray cluster's workers (not its head)."""
    return [p for p in wl.pods if p.pod_set != raycluster.HEAD]


async def _record(c: LocalCluster, wl: LocalWorkload, r: Resize, message: str) -> None:
    """Say what changed as Kubernetes would show it: the Workload's admitted count for the pod set (Kueue's
    in-place update), the Job's parallelism and active pods, and the resize on the Job (``exec.resized``), with the
    newest checkpoint's step: after a shrink the stopped pods are gone, so no later step completes before the
    others restart from it; after a growth the workers run on until torchrun's agents see the new pod (its monitor
    interval, 5 s by default), so they may resume from a later checkpoint than the one named."""
    now = time.time()
    for psa in (wl.workload.get("status") or {}).get("admission", {}).get("podSetAssignments") or []:
        if psa.get("name") == r.pod_set:
            psa["count"] = r.new_count
    by = c.wls.get(r.preemptor) if r.preemptor else None
    objects.job_resized(wl.job, old_count=r.old_count, new_count=r.new_count, cause=r.cause, at=now,
                        pod_set=r.pod_set, preemptor=by.run_id if by else r.preemptor, message=message,
                        checkpoint_step=checkpoints.latest_step(checkpoints.checkpoint_dir(wl.job)))
    await c.save(wl)
    await c.publish(wl, "Workload", wl.workload, "modified")
    await c.publish(wl, wl.job["kind"], wl.job, "modified")
