"""Every ``TAU_*`` variable a taugrid process reads, in groups: its type, default and why, in one frozen object.

A field's metadata (``parse.setting``) names its variable, its parser and one line of why; ``Settings.from_env``
reads them all at once, so a value that does not parse fails the process at its start, naming the variable and
the fix, instead of at its first use. ``HANDED_DOWN`` lists the ``TAU_*`` names taugrid sets for the processes it
starts (a run's pods, the source fetch) that no taugrid process reads as a setting: tests/test_settings.py checks
that every ``TAU_*`` name in the source is one or the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from taugrid.settings.parse import (
    COUNT,
    FLAG,
    LOG_LEVEL,
    NAMES,
    NUMBER,
    PATH,
    PORT,
    POSITIVE_SECONDS,
    QUANTITY,
    REPLICAS,
    SECONDS,
    TEXT,
    WHOLE,
    WHOLE_SECONDS,
    Parser,
    SettingsError,
    Var,
    choice,
    read,
    setting,
)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_HEARTBEAT_S = 60.0  # the node agent's heartbeat (health.change); checked against the sample interval
DEFAULT_ENGINES = ("docker", "podman")  # tried in order (taugrid.local.runtime)
DEFAULT_IB_SYSFS = "/sys/class/infiniband"  # taugrid.health.ib.SYSFS_ROOT
LOWER = Parser(str.lower, "text", "workspace")


@dataclass(frozen=True)
class BusSettings:
    url: str = setting("TAU_NATS_URL", DEFAULT_NATS_URL, TEXT,
                       "the bus: one cluster's nats:// URLs, comma separated")
    creds: Path | None = setting("TAU_NATS_CREDS", None, PATH,
                                 "a NATS credentials file (a service's or a person's); unset: connect without")
    ca: Path | None = setting("TAU_NATS_CA", None, PATH,
                              "the CA file that signed the bus's TLS certificate; unset: the system's CAs")
    ca_pem: str = setting("TAU_NATS_CA_PEM", "", TEXT,
                          "that CA as PEM text (the renderer gives it to run pods' source fetch)")
    replicas: int = setting("TAU_BUS_REPLICAS", 1, REPLICAS,
                            "servers holding each stream when the bootstrap makes them (a JetStream cluster: 3)")
    local_admin: str = setting("TAU_LOCAL_ADMIN", "", TEXT,
                               "NAME:PUBLIC_KEY of the embedded stack's person (the supervisor, the chart)")


@dataclass(frozen=True)
class IdentitySettings:
    nkey_seed: str = setting("TAU_NKEY_SEED", "", TEXT,
                             "the nkey seed a person signs requests with; before TAU_NKEY_FILE and the data dir's")
    nkey_file: Path | None = setting("TAU_NKEY_FILE", None, PATH,
                                     "a file holding that seed; before TAU_NATS_CREDS and the data dir's")


@dataclass(frozen=True)
class DataSettings:
    dir: Path | None = setting("TAU_DATA_DIR", None, PATH,
                               "the embedded stack's data dir; unset: /var/lib/taugrid for root, else ~/.tau")
    secrets_dir: Path | None = setting("TAU_SECRETS_DIR", None, PATH,
                                       "the local secrets store; unset: secrets/ in the data dir")
    operator_dir: Path | None = setting("TAU_OPERATOR_DIR", None, PATH,
                                        "the operator's folder (break-glass and anchor keys); unset: "
                                        "$XDG_CONFIG_HOME/taugrid, else ~/.config/taugrid")


@dataclass(frozen=True)
class ProcessSettings:
    log_level: str = setting("TAU_LOG_LEVEL", "INFO", LOG_LEVEL, "the lowest level a service logs")
    ready_file: Path | None = setting("TAU_READY_FILE", None, PATH,
                                      "where a service replica writes its pid once ready (`tau up` waits on it)")
    backend: str = setting("TAU_BACKEND", "local", choice("local", "kubernetes"),
                           "where runs go: the embedded local cluster or Kubernetes")
    cluster: str = setting("TAU_CLUSTER", "", TEXT,
                           "the cluster's name in subjects; unset: local (local backend), default (Kubernetes)")
    site: bool = setting("TAU_SITE", False, FLAG,
                         "the local cluster runs at a site behind a leaf node, as the cluster TAU_CLUSTER names: "
                         "it reads SITE_IN and answers the dispatcher's reservations")


@dataclass(frozen=True)
class MetricsSettings:
    port: int | None = setting("TAU_METRICS_PORT", None, PORT, "serve /metrics on this port; unset: no metrics")
    addr: str = setting("TAU_METRICS_ADDR", "127.0.0.1", TEXT,
                        "the address /metrics listens on (it has no authentication: loopback unless asked)")
    base_port: int | None = setting("TAU_METRICS_BASE_PORT", None, PORT,
                                    "`tau up`: metrics ports for every replica from here, 32 per service")


@dataclass(frozen=True)
class StackSettings:
    nats_port: int | None = setting("TAU_NATS_PORT", None, PORT,
                                    "`tau up`: the first bus server's port; unset or 0: the last stack's in this "
                                    "data dir if free, else a free one")


@dataclass(frozen=True)
class PortalSettings:
    host: str = setting("TAU_PORTAL_HOST", "127.0.0.1", TEXT, "the address the web portal listens on")
    port: int | None = setting("TAU_PORTAL_PORT", None, PORT,
                               "the web portal's port; unset: the portal's default (`tau up`: the last stack's "
                               "in this data dir if free, else a free one)")


@dataclass(frozen=True)
class AnchorSettings:
    file: Path | None = setting("TAU_ANCHOR_FILE", None, PATH,
                                "the anchor service's JSON Lines file, on a volume the operator backs up")
    key: Path | None = setting("TAU_ANCHOR_KEY", None, PATH, "the file holding the anchor signing seed")
    interval_s: float = setting("TAU_ANCHOR_INTERVAL_S", 60.0, POSITIVE_SECONDS,
                                "how often the ledger heads are signed and appended")


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str = setting("TAU_KUBECONFIG", "", TEXT,
                              "the kubeconfig file; unset: KUBECONFIG, else in-cluster credentials")
    context: str = setting("TAU_KUBE_CONTEXT", "", TEXT, "the kubeconfig context; unset: its current one")
    host: str = setting("TAU_KUBE_HOST", "", TEXT, "an explicit API server URL (tests)")
    watch_namespaces: tuple[str, ...] = setting("TAU_WATCH_NAMESPACES", (), NAMES,
                                                "namespaces kube-bridge and the log shipper watch; unset: all")
    bridge_lease_ttl_s: float = setting("TAU_BRIDGE_LEASE_TTL", 15.0, POSITIVE_SECONDS,
                                        "how long kube-bridge's lease lasts before a standby takes over")


@dataclass(frozen=True)
class LocalSettings:
    python: str = setting("TAU_LOCAL_PYTHON", "", TEXT,
                          "`tau up`: the interpreter every local run uses; unset: each run's own")
    container_engines: tuple[str, ...] = setting(
        "TAU_CONTAINER_ENGINES", DEFAULT_ENGINES, NAMES,
        "engines tried in order for a run with an image; set but empty: never run pods in containers", blank=True)
    run_as: str = setting("TAU_RUN_AS", "", LOWER,
                          "workspace or stack: which OS user local runs run as; unset: decided by `tau up`")
    simulate: bool = setting("TAU_LOCAL_SIMULATE", False, FLAG,
                             "pods complete after their declared duration, no process started (benchmarks)")
    declared_gpus: str = setting("TAU_DECLARED_GPUS", "", TEXT,
                                 "GPUs this machine declares instead of asking NVML: 2, or 2x80000 (MiB each)")
    node_name: str = setting("TAU_NODE_NAME", "", TEXT, "this node's name; unset: the host name")


@dataclass(frozen=True)
class HealthSettings:
    thermal_c: int = setting("TAU_HEALTH_THERMAL_C", 90, WHOLE, "a GPU this hot (C) raises GpuThermal")
    thermal_clear_c: int = setting("TAU_HEALTH_THERMAL_CLEAR_C", 85, WHOLE, "and this cool clears it")
    clean_samples: int = setting("TAU_HEALTH_CLEAN_SAMPLES", 3, COUNT,
                                 "clean samples in a row before a cordoned node is released")
    max_cordoned: int = setting("TAU_HEALTH_MAX_CORDONED", 3, COUNT, "at most this many nodes cordoned at once")
    max_cordoned_fraction: float = setting("TAU_HEALTH_MAX_CORDONED_FRACTION", 0.2, NUMBER,
                                           "and at most this fraction of the fleet")
    min_cordon_budget: int = setting("TAU_HEALTH_MIN_CORDON_BUDGET", 1, COUNT,
                                     "the cordon budget never falls below this many nodes")
    pcie_replays_per_min: float = setting("TAU_HEALTH_PCIE_REPLAYS_PER_MIN", 31.0, NUMBER,
                                          "PCIe replays a minute above which a GPU is degraded (DCGM Gen5 x16)")
    expected_gpus: int | None = setting("TAU_HEALTH_EXPECTED_GPUS", None, COUNT,
                                        "GPUs every node should show; unset: the most a node ever reported")
    repair_budget: int = setting("TAU_HEALTH_REPAIR_BUDGET", 3, COUNT,
                                 "repair steps per node before it is marked for replacement")
    repair_retry_s: float = setting("TAU_HEALTH_REPAIR_RETRY_S", 60.0, SECONDS,
                                    "how long clean samples get to show after a repair step")
    drain_grace_s: int = setting("TAU_HEALTH_DRAIN_GRACE_S", 30, WHOLE_SECONDS,
                                 "how long a drained pod gets to stop before it is killed")
    reboot_via: str = setting("TAU_HEALTH_REBOOT_VIA", "annotation", choice("annotation", "nodemaintenance"),
                              "how a node-reboot repair is asked for on Kubernetes: kured or medik8s")
    recovery_settle_s: float = setting("TAU_RECOVERY_HEALTH_SETTLE_S", 10.0, SECONDS,
                                       "how long recovery waits for a node's health to settle before retrying")
    sample_interval_s: float = setting("TAU_NODE_SAMPLE_INTERVAL", 5.0, POSITIVE_SECONDS,
                                       "how often the node agent samples its GPUs")
    heartbeat_interval_s: float = setting("TAU_NODE_HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_S, POSITIVE_SECONDS,
                                          "how often a node publishes a sample when nothing in it changed")
    ib_sysfs: str = setting("TAU_IB_SYSFS", DEFAULT_IB_SYSFS, TEXT,
                            "the InfiniBand ports' sysfs tree the agent reads; set but empty: none", blank=True)

    def __post_init__(self) -> None:
        # A heartbeat is one of the samples, so it cannot come more often than they are taken.
        if self.heartbeat_interval_s < self.sample_interval_s:
            default = DEFAULT_HEARTBEAT_S
            unset = f", or unset it for the default ({default})" if self.sample_interval_s <= default else ""
            raise SettingsError(
                f"TAU_NODE_HEARTBEAT_INTERVAL={self.heartbeat_interval_s:g} is below TAU_NODE_SAMPLE_INTERVAL="
                f"{self.sample_interval_s:g}: a heartbeat is a sample, so it cannot come more often than samples "
                f"are taken; set TAU_NODE_HEARTBEAT_INTERVAL to {self.sample_interval_s:g} or more{unset}")


@dataclass(frozen=True)
class EvidenceSettings:
    keep_outputs: int = setting("TAU_EVIDENCE_KEEP_OUTPUTS", 0, QUANTITY,
                                "bytes of a run's small output files copied into the object store (e.g. 64Mi)")


@dataclass(frozen=True)
class RendererSettings:
    fetch_image: str = setting("TAU_SOURCE_FETCH_IMAGE", "", TEXT,
                               "the image of run pods' source-fetch container; unset: the renderer's default")
    fetch_nats_url: str = setting("TAU_SOURCE_FETCH_NATS_URL", "", TEXT,
                                  "the bus as run pods reach it; unset: the renderer's default")
    fetch_creds_secret: str = setting("TAU_SOURCE_FETCH_CREDS_SECRET", "", TEXT,
                                      "a Secret with the source fetch's NATS credentials; unset: none")
    fetch_nats_ca: Path | None = setting("TAU_SOURCE_FETCH_NATS_CA", None, PATH,
                                         "the bus's CA file, handed to run pods as PEM text")
    crds_dir: Path | None = setting("TAUGRID_CRDS_DIR", None, PATH,
                                    "the CRD schemas rendered objects are checked with; unset: deploy/crds")


@dataclass(frozen=True)
class SourceFetchSettings:
    object: str = setting("TAU_SOURCE_OBJECT", "", TEXT, "the snapshot to fetch (the renderer sets it)")
    digest: str = setting("TAU_SOURCE_DIGEST", "", TEXT, "its digest, checked after the fetch")
    dir: Path | None = setting("TAU_SOURCE_DIR", None, PATH, "where to unpack it; unset: the working directory")
    timeout_s: float = setting("TAU_SOURCE_FETCH_TIMEOUT", 120.0, POSITIVE_SECONDS,
                               "how long the fetch waits for the bus and the snapshot")
    termination_message_path: Path | None = setting("TAU_TERMINATION_MESSAGE_PATH", None, PATH,
                                                    "where the fetch writes its last line for the pod's status")


@dataclass(frozen=True)
class ClientSettings:
    python: str = setting("TAU_PYTHON", "", TEXT,
                          "`tau run`: the run's interpreter; unset: the project's venv, VIRTUAL_ENV, conda, PATH")


G = TypeVar("G")


def _group(cls: type[G], env: Mapping[str, str]) -> G:
    values = {f.name: read(f.metadata["var"], env.get(f.metadata["var"].env), f.default)
              for f in fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass
    return cls(**values)


@dataclass(frozen=True)
class Settings:
    """Everything a taugrid process reads from its environment; ``from_env`` parses it, ``Settings()`` is
    every default."""

    bus: BusSettings = field(default_factory=BusSettings)
    identity: IdentitySettings = field(default_factory=IdentitySettings)
    data: DataSettings = field(default_factory=DataSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    stack: StackSettings = field(default_factory=StackSettings)
    portal: PortalSettings = field(default_factory=PortalSettings)
    anchor: AnchorSettings = field(default_factory=AnchorSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    local: LocalSettings = field(default_factory=LocalSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    evidence: EvidenceSettings = field(default_factory=EvidenceSettings)
    renderer: RendererSettings = field(default_factory=RendererSettings)
    source_fetch: SourceFetchSettings = field(default_factory=SourceFetchSettings)
    client: ClientSettings = field(default_factory=ClientSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Every group parsed from ``environ``; ``parse.SettingsError`` names the first value that does not parse."""
        defaults = cls()
        groups: dict[str, Any] = {f.name: _group(type(getattr(defaults, f.name)), environ) for f in fields(cls)}
        if not groups["kube"].kubeconfig and environ.get("KUBECONFIG", "").strip():  # the Kubernetes clients' own
            groups["kube"] = replace(groups["kube"], kubeconfig=environ["KUBECONFIG"].strip())
        return cls(**groups)


def variables() -> list[tuple[str, str, Var, Any]]:
    """(group, field, its variable, its default) for every setting, in declaration order."""
    out, defaults = [], Settings()
    for g in fields(Settings):
        group = getattr(defaults, g.name)
        out += [(g.name, f.name, f.metadata["var"], getattr(group, f.name)) for f in fields(group)]
    return out


# TAU_* names taugrid sets for processes it starts and never reads as settings itself: a run's environment
# (the renderer and the local cluster set them; docs §9), and what the embedded stack tells each replica.
HANDED_DOWN = {
    "TAU_RUN_ID": "the run's id",
    "TAU_OUTPUT_DIR": "where the run writes its outputs",
    "TAU_CHECKPOINT_DIR": "where the run keeps its checkpoints",
    "TAU_CHECKPOINT_ARTIFACT": "the path of the artifact the config names under storage.checkpoint",
    "TAU_RESUME_FROM": "the checkpoint a retried or requeued run resumes from",
    "TAU_RETRY_ATTEMPT": "which attempt this is, from 1",
    "TAU_RETRY_MAX": "the most attempts the run gets",
    "TAU_RETRY_REASON": "why the last attempt ended (e.g. Preempted)",
    "TAU_TUNE_METRIC": "the metric a Ray Tune run optimises",
    "TAU_TUNE_MODE": "min or max",
    "TAU_TUNE_NUM_SAMPLES": "trials to run",
    "TAU_TUNE_MAX_CONCURRENT_TRIALS": "trials at once",
    "TAU_TUNE_PARAM_SPACE": "the search space, as JSON",
    "TAU_RAY_TRAIN_CONFIG_JSON": "a Ray run's execution configs, as JSON",
    "TAU_METRICS_HISTORY": "the file the run appends its metrics to",
    "TAU_GPU_FRACTION": "the share of a GPU a fractional run was given (local)",
    "TAU_GPU_MEMORY_MB": "the GPU memory a fractional run may use (local)",
    "TAU_LOCAL": "1 when the run is on the embedded local cluster",
    "TAU_RANK_NODES": "a multi-pod local run's node of each rank, comma-separated, rank 0 first",
    "TAU_REPLICA": "which replica of its service a process is (the supervisor numbers them from 0)",
}
# Families of names, by prefix: a run's secrets (never in a service's environment: natsserver.without_secrets),
# and the local cluster's config maps (``local.envrefs``, one variable per key).
HANDED_DOWN_PREFIXES = {
    "TAU_SECRET_": "a run's secret values; stripped from every service's environment",
    "TAU_CONFIGMAP_": "TAU_CONFIGMAP_<NAME>_<KEY>: a key of a local config map",
}
