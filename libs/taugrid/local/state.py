"""Persistent per-workload state of the local cluster's controller (KV ``local_cluster``, key ``wl.<name>``).

A workload's admission request (``admit.Request``) is derived from it, never stored apart, so the two cannot
disagree after a restart."""

from __future__ import annotations

from typing import Any

import msgspec

# a LocalWorkload's decoded Job and Workload, outside its fields (``LocalWorkload.job``, ``LocalWorkload.workload``),
# and a LocalPod's decoded Pod (``LocalPod.obj``)
_KEPT_JOB, _KEPT_WORKLOAD, _KEPT_POD = "_job", "_workload", "_obj"
_UNSYNCED = msgspec.Raw(b"null")  # a new pod's JSON until its workload's next ``sync`` writes it


class LocalPod(msgspec.Struct, kw_only=True, dict=True):
    """``obj``: the Pod as a dict, held as its JSON (``obj_json``, the record's ``obj``) while its workload is
    packed (``LocalWorkload.pack``: a started simulated Job's pods, which nothing reads until they end), decoded on
    its first use after that. A running workload's pod was its biggest part (about 8 KB of Python objects a pod,
    the template's spec copied in, against 2 KB of JSON), and what a burst's running workloads held stayed resident
    after it (Python's allocator keeps an arena while any block in it lives)."""

    name: str
    index: int
    obj_json: msgspec.Raw = msgspec.field(name="obj")  # the Pod as JSON; current except while ``obj`` is kept
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed | Deleted
    added: bool = False  # the Pod's ADDED event has been published
    gpus: list[int] = msgspec.field(default_factory=list)
    started: float = 0.0
    log_offsets: dict[str, int] = msgspec.field(default_factory=dict)  # per container: bytes of its log shipped
    log_seq: int = 0
    sim_end: float = 0.0  # simulated pool: the pod "completes" at this time, no process
    node: str = ""  # the pool node it was placed on ("" in records from before the pool: the machine)
    # its pod set: "" for a workload's one pod set (a Job's pods, a fixed RayJob's pod); an elastic RayJob's Ray
    # cluster has a ``head`` pod and ``workers`` pods (``raycluster``), each pod set indexed from 0
    pod_set: str = ""

    @classmethod
    def holding(cls, obj: dict[str, Any], **fields: Any) -> LocalPod:
        """A new pod holding ``obj`` as its Pod (its JSON is written by its workload's next ``sync``)."""
        pod = cls(obj_json=_UNSYNCED, **fields)
        pod.__dict__[_KEPT_POD] = obj
        return pod

    @property
    def obj(self) -> dict[str, Any]:
        """The Pod as a dict, the one every change is made to: decoded from ``obj_json`` on first use and kept
        until ``pack``."""
        kept: dict[str, Any] | None = self.__dict__.get(_KEPT_POD)
        if kept is None:
            kept = self.__dict__[_KEPT_POD] = msgspec.json.decode(self.obj_json)
        return kept

    @property
    def obj_decoded(self) -> bool:
        return _KEPT_POD in self.__dict__

    def sync(self) -> None:
        obj = self.__dict__.get(_KEPT_POD)
        if obj is not None:
            self.obj_json = msgspec.Raw(msgspec.json.encode(obj))

    def pack(self) -> None:
        self.sync()
        self.drop()

    def drop(self) -> None:
        """Forget the dict, its JSON being current (``sync`` just ran)."""
        _forget(self.__dict__, _KEPT_POD)


class LocalWorkload(msgspec.Struct, kw_only=True, dict=True):
    """``job`` and ``workload``: the Job (or RayJob) and the Kueue Workload as dicts. Each is held as its JSON
    (``job_json``, ``workload_json``: the record's ``job`` and ``workload``) while the workload waits, and decoded
    on its first use after that, until ``pack``: waiting workloads are most of what the local cluster holds in a
    burst (Kueue's TAS scenario at fraction 0.2: 1,285 waiting at once; the Job was 11 KB of Python objects each,
    the Workload 4 KB, against 3 KB and 1 KB of JSON), and Python's allocator keeps the arenas such a peak filled
    once they are freed, so the peak stayed resident after the burst."""

    name: str
    namespace: str
    uid: str
    run_id: str
    workspace: str
    attempt: int
    job_json: msgspec.Raw = msgspec.field(name="job")  # the Job as JSON; current except while ``job`` is kept
    workload_json: msgspec.Raw = msgspec.field(name="workload")  # likewise the Workload
    cluster_queue: str
    priority: int
    created: float
    pods_wanted: int
    per_pod: dict[str, float]  # each pod's requests (a Ray cluster's: each worker's)
    head_per_pod: dict[str, float] = msgspec.field(default_factory=dict)  # a Ray cluster's head pod's requests
    gpu_fraction: float = 0.0
    gpu_memory_mb: int = 0
    memory_limit: int = 0
    preemptible: bool = True
    placement: str = "binpack"
    excluded_nodes: list[str] = msgspec.field(default_factory=list)  # the pod template's hostname NotIn affinity
    hang_timeout_s: float = 0.0
    source_object: str = ""
    # What the submission asked the pods to run with (BackendApply): the interpreter, runtime.pip, runtime.image.
    python: str = ""
    python_source: str = ""
    pip: list[str] = msgspec.field(default_factory=list)
    image: str = ""
    traceparent: str = ""  # the trace of the apply, continued by every event this workload causes
    lane: str = ""  # the priority lane its watch changes travel in (events.HIGH_LANE or ""), fixed at apply
    user: str = ""  # the run's verified submitter, as the apply request carried it: its watch changes carry it on
    state: str = "pending"  # pending | reserved | running | finished | deleted
    # Reserved for the dispatcher (``backend.<cluster>.reserve``, a site's local cluster): admission reserves its
    # quota and reports it (state ``reserved``) but starts no pod until its ``apply`` clears ``held``; the devices
    # and nodes the engine chose are kept for that start.
    held: bool = False
    held_gpus: list[list[int]] = msgspec.field(default_factory=list)
    held_nodes: list[str] = msgspec.field(default_factory=list)
    # A held reservation preempts nothing until the dispatcher lets it (a reserve with ``may_preempt``): one cluster
    # at a time may preempt for a run (MultiKueue's orchestrated preemption, docs §13d); cleared when it is preempted
    preempt_granted: bool = False
    pods: list[LocalPod] = msgspec.field(default_factory=list)
    requeues: int = 0
    admitted_at: float = 0.0  # when this admission started the pods: activeDeadlineSeconds counts from here
    announced: bool = True  # the admission (Workload + Job) has been published; False while it still must be
    rdzv_port: int = 0  # multi-node torchrun: the loopback rendezvous port of this workload
    last_pending: str = ""
    last_pending_at: float = 0.0
    # Kueue's waitForPodsReady (``readiness``): whether this admission's pods all became ready; how many times it
    # was requeued for not becoming ready in time (Kueue's requeueState.count, apart from preemptions); when its
    # backoff ends (0: not backing off, it is in the admission queue); its place in the queue once requeued (0:
    # ``created``); why its pods restart (TAU_RETRY_REASON; "" after a preemption: "Preempted").
    ready: bool = False
    ready_requeues: int = 0
    requeue_at: float = 0.0
    queued_at: float = 0.0
    retry_reason: str = ""

    @property
    def job(self) -> dict[str, Any]:
        """The Job as a dict, the one every change is made to: decoded from ``job_json`` on first use and kept
        until ``pack``."""
        return self._kept(_KEPT_JOB, self.job_json)

    @property
    def workload(self) -> dict[str, Any]:
        """The Workload as a dict, as ``job`` is the Job."""
        return self._kept(_KEPT_WORKLOAD, self.workload_json)

    @property
    def job_decoded(self) -> bool:
        """Whether the Job is held as a dict (from its first use until ``pack``), not as JSON alone."""
        return _KEPT_JOB in self.__dict__

    @property
    def workload_decoded(self) -> bool:
        return _KEPT_WORKLOAD in self.__dict__

    def keep(self, *, job: dict[str, Any], workload: dict[str, Any]) -> None:
        """Hold these as the workload's Job and Workload (their JSON is written by the next ``sync``)."""
        self.__dict__[_KEPT_JOB], self.__dict__[_KEPT_WORKLOAD] = job, workload

    def job_view(self) -> dict[str, Any]:
        """The Job to read, not to change: the kept dict, else decoded from ``job_json`` and not kept."""
        kept: dict[str, Any] | None = self.__dict__.get(_KEPT_JOB)
        return kept if kept is not None else msgspec.json.decode(self.job_json)

    def workload_view(self) -> dict[str, Any]:
        """The Workload to read, not to change, as ``job_view``."""
        kept: dict[str, Any] | None = self.__dict__.get(_KEPT_WORKLOAD)
        return kept if kept is not None else msgspec.json.decode(self.workload_json)

    @property
    def decoded(self) -> bool:
        """Whether any of its Job, Workload or pods is held as a dict (not as JSON alone)."""
        return self.job_decoded or self.workload_decoded or any(p.obj_decoded for p in self.pods)

    def sync(self) -> None:
        """Bring ``job_json``, ``workload_json`` and each pod's ``obj_json`` up to date with the kept dicts (before
        the record is encoded)."""
        job, workload = self.__dict__.get(_KEPT_JOB), self.__dict__.get(_KEPT_WORKLOAD)
        if job is not None:
            self.job_json = msgspec.Raw(msgspec.json.encode(job))
        if workload is not None:
            self.workload_json = msgspec.Raw(msgspec.json.encode(workload))
        for p in self.pods:
            p.sync()

    def pack(self) -> None:
        """Hold the Job, the Workload and the pods as JSON only (a waiting workload, a started simulated Job):
        ``sync``, then drop the dicts. Only where no one else holds a dict to change it: a change made to it
        afterwards would be lost."""
        self.sync()
        _forget(self.__dict__, _KEPT_JOB, _KEPT_WORKLOAD)
        for p in self.pods:
            p.drop()  # encoded by the ``sync`` above: not again

    def _kept(self, key: str, doc: msgspec.Raw) -> dict[str, Any]:
        kept: dict[str, Any] | None = self.__dict__.get(key)
        if kept is None:
            kept = self.__dict__[key] = msgspec.json.decode(doc)
        return kept


def _forget(kept: dict[str, Any], *keys: str) -> None:
    """Drop ``keys`` from a struct's ``__dict__``, and its table once empty: an emptied dict keeps the table its
    keys had (184 bytes, where an empty one is 64), one per waiting workload and one per running pod (issue 27)."""
    for key in keys:
        kept.pop(key, None)
    if not kept:
        kept.clear()
