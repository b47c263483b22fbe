"""Accounting from the event history (``tau usage``); pure.

Per run: time queued (from submission, or from a retry's decision, to each admission), time running (each
attempt's ``exec.running`` to its end), GPU-seconds (GPUs held × running time; a fractional GPU counts by its
fraction, Ray workers' GPUs included; an elastic run's ``exec.resized`` changes the GPUs held from then on, within
its attempt, across a preemption too: it is requeued at that size) and an estimated cost (GPU-hours × the compute
profile's ``gpu_hour_price`` from platform.yaml, 0 when it names none). A run still queued or running counts up
to ``now``. A run with GPUs is also accounted by their vendor (its GPU resource's, ``core.devices``) and model (its
compute profile's ``gpu_model``, else that of the node it last ran on, where known).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from taugrid.core import devices
from taugrid.core.contracts import ExecResized, ExecRunning, PolicyApproved, ResolvedRun

QUEUE_START = ("submit.requested", "recovery.retrying")
RUN_END = ("exec.succeeded", "exec.failed", "exec.cancelled", "admission.preempted", "admission.evicted")


@dataclass(frozen=True)
class Seen:
    """What accounting needs of one event."""

    type: str
    run_id: str
    workspace: str
    at: float
    user: str = ""
    resolved: ResolvedRun | None = None  # on policy.approved
    pods: int = 0  # on exec.resized: the run's pods from then on
    node: str = ""  # on exec.running: where the attempt runs


class Observed(Protocol):
    """What ``seen_of`` reads of an event (``taugrid.bus.envelope.Event`` is one)."""

    type: str
    subject: str
    workspace: str
    user: str

    @property
    def happened(self) -> float: ...

    def payload(self, kind: builtins.type[Any]) -> Any: ...  # builtins: the field ``type`` shadows it


def seen_of(ev: Observed) -> Seen | None:
    """The event as accounting sees it; None for a ``policy.approved`` whose payload does not decode (hostile
    nesting): it approved nothing, so it costs nothing."""
    resolved, pods, node = None, 0, ""
    if ev.type == "policy.approved":
        try:
            resolved = ev.payload(PolicyApproved).run
        except msgspec.DecodeError:
            return None
    elif ev.type == "exec.resized":
        try:
            pods = ev.payload(ExecResized).new_count
        except msgspec.DecodeError:
            return None  # a resize nobody can read changes no count
    elif ev.type == "exec.running":
        try:
            node = ev.payload(ExecRunning).node
        except msgspec.DecodeError:
            node = ""  # where it ran is unknown; its time still counts
    return Seen(ev.type, ev.subject, ev.workspace, ev.happened, ev.user, resolved, pods, node)


@dataclass
class RunUsage:
    run_id: str
    workspace: str
    user: str = ""
    queue: str = ""
    profile: str = ""
    vendor: str = ""  # its GPUs' vendor ("" without GPUs)
    model: str = ""  # its GPUs' model where known
    node: str = ""  # the node its last attempt ran on
    gpus: float = 0.0
    queued_s: float = 0.0
    running_s: float = 0.0
    gpu_seconds: float = 0.0
    cost: float = 0.0
    _queued_since: float | None = field(default=None, repr=False)
    _running_since: float | None = field(default=None, repr=False)
    # An elastic run once resized: GPU-seconds are summed per stretch of constant size, not gpus × running_s.
    _per_pod: float = field(default=0.0, repr=False)
    _held: float = field(default=0.0, repr=False)  # GPUs held since ``_mark``
    _mark: float = field(default=0.0, repr=False)
    _summed: float = field(default=0.0, repr=False)  # GPU-seconds of the stretches before ``_mark``
    _resized: bool = field(default=False, repr=False)
    _pods: int = field(default=0, repr=False)  # the attempt's size after its last resize; 0: as written

    def _close(self, at: float) -> None:
        self._summed += self._held * max(0.0, at - self._mark)
        self._mark = at


def gpus_per_pod(run: ResolvedRun) -> float:
    """A pod's GPUs: a Job's pod's, a Ray worker's (``resources`` are a Ray run's worker requests)."""
    return run.resources.gpu_fraction or float(run.resources.gpu)


def gpus_held(run: ResolvedRun) -> float:
    """The run's GPUs as written: a Job's pods', or a Ray run's workers' (its head is CPU-only, ``render.rayjob``;
    counting ``resources`` once more for it gave a Ray run of 3 one-GPU workers 4 GPUs)."""
    if run.engine == "ray":
        return float(run.workers * run.gpus_per_worker)
    return gpus_per_pod(run) * max(1, run.nodes)


def gpu_vendor(run: ResolvedRun) -> str:
    """Whose GPUs the run holds ("" for none): its GPU resource's vendor ("" resource: NVIDIA's)."""
    if not gpus_held(run):
        return ""
    found = devices.vendor_of_resource(run.gpu_resource or devices.DEFAULT_VENDOR.resource)
    return found.name if found is not None else run.gpu_resource


def fold(events: Iterable[Seen], *, prices: dict[str, float], now: float, models: dict[str, str] | None = None,
         node_models: dict[str, str] | None = None) -> list[RunUsage]:
    """Each run's usage from its events in stream order; ``prices``: compute profile → price per GPU-hour;
    ``models``: compute profile → its ``gpu_model``; ``node_models``: node → the model of its GPUs."""
    models, node_models = models or {}, node_models or {}
    runs: dict[str, RunUsage] = {}
    for ev in events:
        u = runs.setdefault(ev.run_id, RunUsage(ev.run_id, ev.workspace))
        u.user = u.user or ev.user
        if ev.resolved is not None:
            u.queue, u.profile, u.gpus = ev.resolved.cluster_queue, ev.resolved.profile, gpus_held(ev.resolved)
            u.vendor, u.model = gpu_vendor(ev.resolved), models.get(ev.resolved.profile, "")
            u._per_pod = gpus_per_pod(ev.resolved)
        if ev.type == "recovery.retrying":
            u._pods = 0  # a new attempt: a new Job at the written size
        if ev.type in QUEUE_START and u._queued_since is None:
            u._queued_since = ev.at
        elif ev.type == "admission.admitted" and u._queued_since is not None:
            u.queued_s += max(0.0, ev.at - u._queued_since)
            u._queued_since = None
        elif ev.type == "exec.running" and u._running_since is None:
            u._running_since = u._mark = ev.at
            u.node = ev.node or u.node
            u._held = u._per_pod * u._pods if u._pods else u.gpus  # a requeued elastic run keeps its size
        elif ev.type == "exec.resized" and u._running_since is not None and ev.pods > 0:
            u._close(ev.at)
            u._held, u._resized, u._pods = u._per_pod * ev.pods, True, ev.pods
        elif ev.type in RUN_END and u._running_since is not None:
            u.running_s += max(0.0, ev.at - u._running_since)
            u._running_since = None
            u._close(ev.at)
        if ev.type in ("exec.succeeded", "exec.failed", "exec.cancelled", "submit.rejected", "policy.rejected",
                       "recovery.gave_up"):
            u._queued_since = None  # ended without (another) admission
    for u in runs.values():
        if u.vendor and not u.model:
            u.model = node_models.get(u.node, "")
        if u._queued_since is not None:
            u.queued_s += max(0.0, now - u._queued_since)
        if u._running_since is not None:
            u.running_s += max(0.0, now - u._running_since)
            u._close(now)
        # Times to the millisecond, as shown; GPU-seconds from the shown time, so a row's figures agree with each
        # other (0.5 GPU × 2.409 s is 1.2045 s, not the 1.205 that the unrounded 2.4095 s would give).
        u.queued_s, u.running_s = round(u.queued_s, 3), round(u.running_s, 3)
        u.gpu_seconds = round(u._summed, 3) if u._resized else u.gpus * u.running_s
        u.cost = u.gpu_seconds / 3600 * prices.get(u.profile, 0.0)
    return list(runs.values())


def roll_up(usages: Iterable[RunUsage], by: str) -> list[dict[str, float | str | int]]:
    """Totals per ``by`` (user | workspace | queue | run | vendor | model), largest GPU-seconds first; a run
    without GPUs counts under vendor and model "-"."""
    totals: dict[str, dict[str, float | str | int]] = {}
    for u in usages:
        key = u.run_id if by == "run" else str(getattr(u, by) or "-")
        t = totals.setdefault(key, {by: key, "runs": 0, "queued_s": 0.0, "running_s": 0.0, "gpu_seconds": 0.0,
                                    "cost": 0.0})
        t["runs"] = int(t["runs"]) + 1
        for name in ("queued_s", "running_s", "gpu_seconds", "cost"):
            t[name] = round(float(t[name]) + getattr(u, name), 3)
    return sorted(totals.values(), key=lambda t: (-float(t["gpu_seconds"]), str(t[by])))
