"""Wire contracts: every payload that crosses the bus, as frozen msgspec Structs.

Invariants: fields are only ever added, with defaults (old readers ignore them, new readers default them);
a payload never carries secrets' values (``env_secret`` holds ``secret:key`` references only).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from taugrid.core.errors import ConfigError


class Struct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False, forbid_unknown_fields=False):
    """Base for wire structs."""


class Issue(Struct, frozen=True):
    """One problem with a config or request, phrased for the person who has to fix it."""

    field: str
    message: str
    fix: str = ""
    file: str = ""
    line: int | None = None


def issues_of(err: ConfigError, *, file: str = "") -> list[Issue]:
    """A ``ConfigError``'s problems as wire ``Issue``s (one naming the error itself when it lists none)."""
    out = []
    for i in err.issues or [{"field": "", "message": str(err)}]:
        line = i.get("line")
        out.append(Issue(field=str(i.get("field", "")), message=str(i.get("message", "")),
                         fix=str(i.get("fix", "") or ""), file=str(i.get("file", "") or file),
                         line=line if isinstance(line, int) else None))
    return out


class Resources(Struct, frozen=True):
    """Requests of one pod. ``gpu_fraction``/``gpu_memory_mb`` describe a shared (fractional) GPU."""

    cpu: float = 1.0
    memory: int = 1 << 30
    gpu: int = 0
    gpu_fraction: float = 0.0
    gpu_memory_mb: int = 0


class Resilience(Struct, frozen=True):
    max_retries: int = 0
    retry_on: list[str] = msgspec.field(default_factory=lambda: ["Preempted", "Evicted"])
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 300.0
    checkpoint_path: str = ""
    hang_timeout_s: float | None = None  # no output for this long ⇒ the pod is stopped as hung


class ResolvedRun(Struct, frozen=True):
    """A run after platform policy: everything a renderer needs, nothing it must look up.

    ``checkpoint_dir`` is ``<output_dir>/checkpoints`` and ``resilience.checkpoint_path`` the checkpoint directory
    unless the config or a resume says otherwise: stored JSON leaves them out when they are (``wire_derived``,
    ``core/wirejson``; issue 27: ~160 B of every ``policy.approved``), and decoding gives them back here, so every
    reader sees them whole. They follow from fields of the same service-signed value, never from elsewhere."""

    run_id: str
    submission_id: str
    workspace: str
    namespace: str
    name: str
    engine: str = "job"  # job | ray
    launcher: str = "python"  # python | torchrun | command | ray-train | ray-tune
    entrypoint: str = ""
    args: list[str] = msgspec.field(default_factory=list)
    command: list[str] = msgspec.field(default_factory=list)
    image: str = ""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    env_secret: dict[str, str] = msgspec.field(default_factory=dict)
    working_dir: str = ""
    local_queue: str = ""
    cluster_queue: str = ""
    priority_class: str = ""
    priority: int = 0
    preemptible: bool = True
    profile: str = ""
    resources: Resources = msgspec.field(default_factory=Resources)
    limits: Resources | None = None
    nodes: int = 1
    processes_per_node: int = 1
    workers: int = 0
    gpus_per_worker: int = 0
    pip: list[str] = msgspec.field(default_factory=list)
    resilience: Resilience = msgspec.field(default_factory=Resilience)
    output_dir: str = ""
    checkpoint_dir: str = ""
    source_object: str = ""
    source_digest: str = ""
    # run.source (TauGrid's source-image jobs): the code is already in this image, at source_path; no fetch.
    source_image: str = ""
    source_path: str = ""
    config_hash: str = ""
    platform_revision: int = 0
    active_deadline_s: int | None = None
    ttl_seconds_after_finished: int = 28800
    termination_grace_s: int = 30
    security_restricted: bool = False
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    tolerations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    placement: str = "binpack"  # binpack | spread
    gang: bool = True
    data_pvc: str = ""
    experiment: dict[str, str] = msgspec.field(default_factory=dict)
    # Ray head pod requests/limits (compute.head_*; a managed manifest's cpus/memory); None = the renderer default.
    head_resources: Resources | None = None
    head_limits: Resources | None = None
    # storage.mounts and storage.volumes: existing PVCs, each {name, claim, path, read_only, sub_path}.
    mounts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # storage.image_assets: {name, image, source_path, mount_path}, copied from the image by an init container.
    image_assets: list[dict[str, str]] = msgspec.field(default_factory=list)
    pod_priority_class: str = ""  # policy.pod_priority_class: the pods' priorityClassName
    run_as_user: int | None = None  # runtime.security.run_as_user/group: the pods' securityContext
    run_as_group: int | None = None
    gpu_resource: str = ""  # the extended resource whole GPUs are asked as ("" = nvidia.com/gpu; MIG slices)
    topology_level: str = ""  # policy.topology: Kueue TAS level every pod set stays within
    topology_required: bool = True  # policy.topology_policy: required (else preferred)
    topology_unconstrained: bool = False  # policy.topology_policy: unconstrained (no level; placed by free capacity)
    topology_slice_level: str = ""  # policy.topology_slice.level: each slice of the pod set stays within one
    topology_slice_size: int = 0  # policy.topology_slice.size: pods per slice (0: no slices)
    # policy.mode: elastic with policy.elastic: the resizable size range (torchrun nodes, Ray workers); 0 = fixed.
    elastic_min: int = 0
    elastic_max: int = 0
    elastic_step: int = 1
    elastic_cooldown_s: float = 60.0
    devices: dict[str, int] = msgspec.field(default_factory=dict)  # runtime.devices: extra extended resources
    shm_size: int = 0  # runtime.shm_size: bytes of in-memory /dev/shm (0 = the renderer's choice)
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # policy.team / policy.lane as taugrid.io/ labels
    # Variables the platform sets from the config (Tune fields, Ray Train config, checkpoint artifact, metrics
    # history); they win over runtime.env like the per-attempt TAU_* ones.
    platform_env: dict[str, str] = msgspec.field(default_factory=dict)
    # The interpreter of the environment that submitted (a host path; the local backend runs `python` with it)
    # and where the client found it: TAU_PYTHON, project .venv, VIRTUAL_ENV, CONDA_PREFIX or PATH.
    python: str = ""
    python_source: str = ""

    def __post_init__(self) -> None:
        # what stored JSON left out because it follows from output_dir (wire_derived); "" is never resolved
        if not self.checkpoint_dir and self.output_dir:
            msgspec.structs.force_setattr(self, "checkpoint_dir", checkpoints_of(self.output_dir))
        if not self.resilience.checkpoint_path and self.checkpoint_dir:
            msgspec.structs.force_setattr(self, "resilience", msgspec.structs.replace(
                self.resilience, checkpoint_path=self.checkpoint_dir))

    def wire_derived(self) -> dict[str, Any]:
        """The fields that follow from the others, with the values they then have (``core/wirejson``)."""
        return {"checkpoint_dir": checkpoints_of(self.output_dir),
                "resilience": {"checkpoint_path": self.checkpoint_dir}}


def checkpoints_of(output_dir: str) -> str:
    """A run's checkpoint directory, given its output directory (``config/resolve`` resolves it so)."""
    return f"{output_dir}/checkpoints" if output_dir else ""


# ---- run lifecycle payloads (subject run.<ws>.<run>.<stage>.<outcome>) ----


class SubmitRequested(Struct, frozen=True):
    submission_id: str
    config_text: str
    config_path: str = "tau.yaml"
    workspace: str = ""
    target: str = ""
    source_object: str = ""
    source_digest: str = ""
    user: str = ""  # what the client claims; the submitter replaces it with the verified signer's name
    resume_from: str = ""  # `tau run resume`: the checkpoint the new run starts from (TAU_RESUME_FROM)
    resumes: str = ""  # the run id this one resumes
    retries: str = ""  # `tau run retry`: the run id this one runs again (same config and code, from the start)
    reproduces: str = ""  # `tau reproduce`: the run id whose sealed evidence this one re-runs
    platform_revision: int = 0  # resolve against this platform revision, not the newest (`tau reproduce`)
    python: str = ""  # the submitting environment's interpreter (see ResolvedRun.python)
    python_source: str = ""


class SubmitAccepted(Struct, frozen=True):
    """The submitter's parse of record (``config.accepted``): later stages read it, never ``config_text``."""

    submission_id: str
    # the validated tau.yaml as JSON values, aliases folded, its fields at their defaults left out since issue 27
    # (config/accepted.rebuild gives them back; an earlier release's record, defaults written out, reads the same)
    config: dict[str, Any]
    # Empty since issue 27: the policy hashes the parse it resolves (``config_hash`` of the rebuilt model, the value
    # the submitter's parse hashes to) onto ``ResolvedRun.config_hash``; an earlier release's record carries it.
    config_hash: str = ""
    # Empty since issue 27 (the submitter no longer copies it): the evidence seals the text of the run's first
    # stored submit.requested, the request this answers; a record of an earlier release may carry it.
    config_text: str = ""
    config_path: str = "tau.yaml"
    source_object: str = ""
    source_digest: str = ""
    user: str = ""  # the verified submitter (never the client's claim)
    resume_from: str = ""
    resumes: str = ""
    retries: str = ""
    reproduces: str = ""
    platform_revision: int = 0
    python: str = ""
    python_source: str = ""
    signer: str = ""  # the public nkey whose signature the submitter verified
    # Empty since issue 27 (nothing read it): the signature is the answered request's own ``tau-signature``, which
    # the evidence seals from that request; a record of an earlier release carries a copy.
    signature: str = ""
    # (key path, line) of each key config_text spelled out, for the policy's issues (a managed workflow manifest
    # projected onto the direct config). Empty since issue 27: only a refusal names lines, and the policy then
    # reads them back from the answered request's text (services/policy/keylines); an earlier release's carries them.
    config_lines: list[tuple[tuple[str | int, ...], int]] = msgspec.field(default_factory=list)
    config_managed: bool = False
    # The platform bucket's mark the submitter asked after this request was stored (``platformread.mark_token``):
    # a policy holding its platform under the same mark resolves without asking again (issue 30: one round trip
    # of every idle run's path); any other mark, or none (an earlier release's record), is asked as before.
    platform_mark: str = ""


class Rejected(Struct, frozen=True):
    """``submit.rejected`` and ``policy.rejected``: every reason, each naming its field and fix."""

    reasons: list[Issue]
    message: str = ""


class PolicyApproved(Struct, frozen=True):
    run: ResolvedRun
    # the revision the run was resolved against: ``run.platform_revision``, so stored JSON leaves it out when it is
    # (``wire_derived``, issue 27) and decoding gives it back; an earlier release's event repeats it
    platform_revision: int = 0

    def __post_init__(self) -> None:
        if not self.platform_revision and self.run.platform_revision:
            msgspec.structs.force_setattr(self, "platform_revision", self.run.platform_revision)

    def wire_derived(self) -> dict[str, Any]:
        """The fields that follow from the others, with the values they then have (``core/wirejson``)."""
        return {"platform_revision": self.run.platform_revision}


class RenderApplied(Struct, frozen=True, kw_only=True):  # kw_only: digest stays required after manifests
    """An attempt applied to its backend. ``digest``: ``sha256:`` of the manifests' canonical JSON (sorted keys, no
    whitespace). Since issue 27 the renderer stores the manifests once, in the ``manifests`` KV bucket under
    ``run.<workspace>.<run>.<hex of digest>`` until the run is sealed, and leaves ``manifests`` empty here; the
    sealed evidence bundle holds them (its attempt's ``render``), checked against ``digest``. An earlier
    release's event carries them whole."""

    attempt: int
    backend: str
    kind: str
    object_name: str
    manifests: list[dict[str, Any]] = msgspec.field(default_factory=list)
    digest: str


class RenderFailed(Struct, frozen=True):
    attempt: int
    reason: str
    message: str
    permanent: bool = True


class AdmissionQueued(Struct, frozen=True):
    reason: str
    message: str = ""
    cluster_queue: str = ""
    position: int | None = None
    waiting_for: dict[str, Any] = msgspec.field(default_factory=dict)


class TopologyDomain(Struct, frozen=True):
    """One domain of a topology assignment: its label values (one per level, highest first) and its pod count."""

    values: list[str]
    count: int


class PodSetTopology(Struct, frozen=True):
    """Kueue's ``topologyAssignment`` of one pod set, uncompressed (``core.topologyassignment``): the levels it
    names (only ``kubernetes.io/hostname`` when that is the topology's lowest level) and its domains in the order
    pods fill them, so pod index i runs in the domain the first i+1 counts reach."""

    pod_set: str
    levels: list[str]
    domains: list[TopologyDomain]


class AdmissionAdmitted(Struct, frozen=True):
    cluster_queue: str = ""
    flavors: dict[str, str] = msgspec.field(default_factory=dict)
    node: str = ""
    # the TAS pod sets' assignments, as the Workload's admission carries them (empty: no topology-aware flavor)
    topology: list[PodSetTopology] = msgspec.field(default_factory=list)


class AdmissionPreempted(Struct, frozen=True):
    reason: str
    message: str = ""
    preemptor: str = ""


class GangPod(Struct, frozen=True):
    """One pod of a gang that started together: its name, its node and its rank (completion index)."""

    name: str
    node: str = ""
    index: int = 0


class ExecRunning(Struct, frozen=True):
    node: str = ""
    pod: str = ""
    pid: int | None = None
    gpus: list[str] = msgspec.field(default_factory=list)
    # What the process runs with, where the backend knows it (locally: python, python_version, source,
    # env = the cached environment's hash or "", container = the image when it runs in one).
    environment: dict[str, str] = msgspec.field(default_factory=dict)
    # Every pod of the run, in rank order, where they started together and one event says so (the local
    # cluster's simulated pods: their own started reports, an ``exec.progress`` a pod, are then not sent; issue 30).
    pods: list[GangPod] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        # what stored JSON left out because the first pod listed says it (wire_derived; a pod always has a name)
        if self.pods and not self.node and not self.pod:
            msgspec.structs.force_setattr(self, "node", self.pods[0].node)
            msgspec.structs.force_setattr(self, "pod", self.pods[0].name)

    def wire_derived(self) -> dict[str, Any]:
        """The fields that follow from the others (``core/wirejson``): the event's pod and node where they are the
        first listed pod's, as a gang's first pod's ``exec.running`` says (issue 27: ~50 B of a one-pod run's)."""
        first = self.pods[0] if self.pods else None
        if first is None or (self.node, self.pod) != (first.node, first.name):
            return {}
        return {"node": first.node, "pod": first.name}


class ExecResized(Struct, frozen=True):
    """``exec.resized``: an elastic run changed its number of pods while running (docs §10 Elastic workloads).

    ``cause``: ``Grown`` (quota freed, a slice of pods was added), ``ShrunkForPreemptor`` (it gave up pods to
    ``preemptor``, a higher-priority run, instead of being preempted whole) or ``Shrunk`` (asked to shrink).
    ``checkpoint_step``: the highest step among the checkpoints in the run's checkpoint directory when the resize
    was carried out (``local/checkpoints.py`` reads it from their names): the step the restarted workers resume
    from after a shrink, a lower bound after a growth (they may save another before torchrun restarts them);
    None when the backend found none."""

    old_count: int
    new_count: int
    cause: str
    preemptor: str = ""  # the run whose admission shrank this one (ShrunkForPreemptor)
    pod_set: str = ""
    message: str = ""
    checkpoint_step: int | None = None


class ExecPreparing(Struct, frozen=True):
    """``exec.preparing``: admitted, the pod is being prepared before its process starts (locally: building the
    run's Python environment). Repeated with each new progress message; a failure arrives as ``exec.failed``."""

    step: str = "environment"
    message: str = ""
    node: str = ""
    pod: str = ""


class ExecFinished(Struct, frozen=True):
    """``exec.succeeded``, ``exec.failed`` and ``exec.cancelled``."""

    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    node: str = ""
    duration_s: float | None = None


class PhaseReport(Struct, frozen=True):
    """One pod-level phase as one object shows it (``raycluster``, ``scheduling``, ``image-pull``, ``init``,
    ``container-start``); ``status`` is pending | active | done | warning | failed | skipped."""

    name: str
    status: str
    detail: str = ""
    hint: str = ""


class ContainerReport(Struct, frozen=True):
    """One container of a pod, as ``kubectl describe`` would list it."""

    name: str
    kind: str = "app"  # app | init
    state: str = ""  # waiting | running | terminated | ""
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    restarts: int = 0


class ExecProgress(Struct, frozen=True):
    """``exec.progress``: how far one pod (or the RayCluster) got towards running, from its status or an Event.

    ``source`` is ``pod`` (the pod's full status: its phases replace what was known of that pod), ``event``
    (a Kubernetes Event about the pod: adds a warning, never undoes progress) or ``rayjob``."""

    source: str = "pod"
    pod: str = ""
    node: str = ""
    pod_phase: str = ""
    phases: list[PhaseReport] = msgspec.field(default_factory=list)
    containers: list[ContainerReport] = msgspec.field(default_factory=list)


class CancelRequested(Struct, frozen=True):
    reason: str = "cancelled by user"
    requested_by: str = ""  # what the client claims; the renderer decides from the signature


class CancelDecision(Struct, frozen=True):
    """``cancel.accepted`` / ``cancel.refused``: the renderer's answer to one signed ``cancel.requested``."""

    request_id: str  # ce-id of the cancel.requested it answers
    by: str = ""  # the verified canceller ("" when the signature did not check out)
    signer: str = ""  # the public nkey that signed the request
    reason: str = ""  # accepted: the request's reason; refused: why
    field: str = ""  # refused: what was wrong (tau-signature, tau-signer, user)


class RecoveryRetrying(Struct, frozen=True):
    attempt: int  # the attempt about to start
    reason: str
    classification: str
    delay_s: float
    not_before: float  # unix seconds; the renderer holds the re-apply until then
    resume_from: str = ""
    exclude_nodes: list[str] = msgspec.field(default_factory=list)
    run: ResolvedRun | None = None


class RecoveryGaveUp(Struct, frozen=True):
    reason: str
    classification: str
    attempts: int
    message: str = ""
    hint: str = ""  # what the researcher can do about it (``classify.give_up_hint``)


class HealthDegraded(Struct, frozen=True):
    node: str
    condition: str
    message: str = ""


class DispatchStep(Struct, frozen=True):
    """A dispatcher step for a run's attempt (``dispatch.nominated`` / ``chosen`` / ``withdrawn`` / ``granted``,
    core/dispatch.py): the clusters it concerns (nominated, the one chosen, those withdrawn, the one let preempt for
    it), the nomination mode and why."""

    clusters: list[str]
    mode: str
    reason: str


class EvidenceSealed(Struct, frozen=True, kw_only=True):  # kw_only: digest stays required after the defaults
    """A run sealed; ``bundle`` "" names the run's usual bundle object, runs/<run>/bundle.json."""

    # defaults the most common seal's, so stored JSON leaves them out there (``core/wirejson``; issue 27: ~40 B
    # stored twice, RUNS and AUDIT); every reader decodes them back, an earlier release's event writes them out
    attempt: int = 1
    terminal_state: str = "succeeded"
    # "" for the usual name of the run the subject names (``bundle_of``; issue 27: ~50 B stored twice, RUNS and
    # AUDIT); an earlier release's event writes it out
    bundle: str = ""
    digest: str
    ledger_head: str
    entries: int

    def bundle_of(self, run_id: str) -> str:
        """The bundle's object name, ``run_id`` being the run the event's subject names (what the bus vouches
        for: only the run's own subject is read)."""
        return self.bundle or f"runs/{run_id}/bundle.json"  # evidence.bundle.bundle_name (core imports no evidence)


# ---- backend, Kubernetes-shaped and node payloads ----


class BackendApply(Struct, frozen=True):
    """A request to a backend to create objects (``backend.<cluster>.apply``)."""

    run_id: str
    workspace: str
    attempt: int
    manifests: list[dict[str, Any]]
    source_object: str = ""
    exclude_nodes: list[str] = msgspec.field(default_factory=list)
    # For backends that run pods on this machine: the submitter's interpreter, the image the researcher asked
    # for ("" = the platform default) and runtime.pip. A cluster backend reads the manifests instead.
    python: str = ""
    python_source: str = ""
    image: str = ""
    pip: list[str] = msgspec.field(default_factory=list)
    # The priority lane of the approval it applies (events.HIGH_LANE or ""): the local backend publishes a
    # high-lane apply on ``backend.<cluster>.apply.high``, read by the local cluster's own durable for it.
    lane: str = ""
    # The platform revision the run was resolved against: a local cluster still on an older one reads the
    # platform before it admits this (else a run submitted right after an apply could land on a removed node).
    platform_revision: int = 0
    # On a reservation (``backend.<cluster>.reserve``): the dispatcher lets this cluster preempt for the run. A
    # site's reservation preempts nothing without it (one cluster at a time may: MultiKueue's orchestrated
    # preemption, KEP-8303); sent again with it to the cluster granted.
    may_preempt: bool = False


class BackendDelete(Struct, frozen=True):
    run_id: str
    workspace: str
    attempt: int
    kind: str
    namespace: str
    name: str
    grace_s: int = 30
    reason: str = ""


class WatchEvent(Struct, frozen=True):
    """One Kubernetes watch change, as ``k8s.<cluster>.<kind>.<ns>.<name>.<added|modified|deleted>`` carries it."""

    type: str  # ADDED | MODIFIED | DELETED
    object: dict[str, Any]
    cluster: str = "local"


class GpuEvent(Struct, frozen=True):
    """One vendor's health event in the shape every vendor shares (``health.vendorcodes`` fills it from a data
    table): what happened to which device, and what it means for the node, whichever vendor's code said so."""

    vendor: str  # nvidia | amd | intel-gaudi
    gpu: int  # the device's index on its node
    pci: str = ""  # the device's PCI address where the reader knows it
    component: str = ""  # the part that reported it: umc, gfx, sdma, xgmi, hbm, sram, memory, device
    kind: str = ""  # e.g. ecc-uncorrectable, ecc-deferred, page-unreservable, bad-page-threshold, critical
    severity: int = 0  # 0..4, the scale of health.xid (0 event only, 3 drain and reset, 4 drain and reboot/RMA)
    action: str = "none"  # none | alert | reset | reboot | rma
    condition: str = ""  # the node condition it raises ("" for an event that raises none)
    code: str = ""  # the vendor's raw code, as its library names it
    message: str = ""


class GpuSample(Struct, frozen=True):
    index: int
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""  # "0000:19:00.0" where the reader knows it (a Gaudi reset names the device by it)
    memory_total_mb: int = 0
    memory_used_mb: int = 0
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_replay_count: int | None = None
    xid_events: list[int] = msgspec.field(default_factory=list)
    throttle_reasons: list[str] = msgspec.field(default_factory=list)
    # NVLink: None where the GPU has no NVLink (a PCIe card answers NotSupported: unknown, never "down").
    nvlink_links: int | None = None  # links NVML reports on this GPU
    nvlink_down: list[int] = msgspec.field(default_factory=list)  # link numbers not active
    nvlink_errors: dict[str, int] | None = None  # summed over links: replay, recovery, crc_flit, crc_data
    events: list[GpuEvent] = msgspec.field(default_factory=list)  # vendor events since the last sample


class IbPort(Struct, frozen=True):
    """One InfiniBand/RoCE port as sysfs (``/sys/class/infiniband/<hca>/ports/<port>/``) describes it."""

    hca: str
    port: int
    state: str = ""  # e.g. "ACTIVE" (from "4: ACTIVE"), "DOWN", "INIT", "ARMED"
    phys_state: str = ""  # e.g. "LinkUp", "Disabled", "Polling"
    rate_gbps: float | None = None
    link_layer: str = ""  # InfiniBand | Ethernet
    counters: dict[str, int] = msgspec.field(default_factory=dict)  # counters/ and hw_counters/ files


class NodeSample(Struct, frozen=True):
    node: str
    time: float
    cpus: int
    memory_bytes: int
    memory_available_bytes: int = 0
    load_1m: float = 0.0
    gpus: list[GpuSample] = msgspec.field(default_factory=list)
    gpu_source: str = "none"  # nvml | amd-smi | hl-smi | declared | none
    message: str = ""
    gpu_vendor: str = ""  # nvidia | amd | intel-gaudi ("" with no GPUs)
    gpu_model: str = ""  # core.devices.MODELS name where known (declared nodes), else the device's own name
    ib_ports: list[IbPort] = msgspec.field(default_factory=list)
    # Its agent publishes a sample at least this often (a heartbeat when nothing changed; ``health.change``);
    # 0: every sample it takes. Readers judge a node silent against it (``core.heartbeat``).
    heartbeat_s: float = 0.0


class NodeCondition(Struct, frozen=True):
    node: str
    type: str  # e.g. GpuXidError, GpuEccError, GpuThermal, GpuMissing
    status: str  # "True" | "False"
    reason: str
    message: str = ""
    gpu: int | None = None
    time: float = 0.0

class NodeCordon(Struct, frozen=True):
    """Stop placing new work on ``node``; with ``drain`` also move running work off it (the health monitor)."""

    node: str
    reason: str
    drain: bool = False
    conditions: list[str] = msgspec.field(default_factory=list)
    time: float = 0.0


class NodeUncordon(Struct, frozen=True):
    """``node`` takes new work again (the health monitor, after a passed validation)."""

    node: str
    reason: str
    time: float = 0.0


class NodeValidation(Struct, frozen=True):
    """The result of the active check the node's agent runs on the health monitor's request."""

    node: str
    ok: bool
    detail: str
    time: float
    gpus: int = 0


class NodeRepair(Struct, frozen=True):
    """One repair step on ``node`` and its outcome: ``gpu-reset`` and ``node-reboot`` are carried out by the
    node's agent, ``replace-node`` is the monitor's escalation once the node's repair budget is spent."""

    node: str
    step: str  # gpu-reset | node-reboot | replace-node
    ok: bool
    outcome: str
    attempt: int = 0  # the node's repair count this step was asked as (numbers the step's message id)
    gpus: list[int] = msgspec.field(default_factory=list)
    time: float = 0.0


class LogChunk(Struct, frozen=True):
    run_id: str
    attempt: int
    pod: str
    seq: int
    lines: list[str]
    stream: str = "stdout"


def encode(payload: msgspec.Struct) -> bytes:
    return msgspec.json.encode(payload)


T = TypeVar("T")


def decode(data: bytes, kind: type[T]) -> T:
    return msgspec.json.decode(data, type=kind)
