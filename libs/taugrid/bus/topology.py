"""What exists on the bus: streams, KV buckets, the object store and one durable consumer per service.

Provisioned by one bootstrap step (``tau up`` / ``python -m taugrid.bus.bootstrap``), never by services at
will, so services can run with least-privilege credentials that only bind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taugrid.core.events import HIGH_LANE, LANED_EVENTS, RUN_EVENTS, TERMINAL_EVENTS

DAY = 86400.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age: float
    duplicate_window: float = 600.0
    max_bytes: int = -1
    # direct gets (no consumer; any replica answers): the evidence reads a run's events and logs back at its seal
    allow_direct: bool = False
    # False, limits retention: kept until max_age/max_bytes, whoever read it. True, interest retention: a message
    # goes once every durable whose filter matches it has acked it (max_age still bounds what an unacked durable
    # holds), and one no durable's filter matches is not stored at all: for a stream that is only its consumers'
    # input, never a record anyone replays
    interest: bool = False


@dataclass(frozen=True)
class ConsumerSpec:
    durable: str
    stream: str
    filters: list[str]
    max_deliver: int = 8
    ack_wait: float = 60.0
    max_ack_pending: int = 2000
    description: str = ""
    extra: dict[str, object] = field(default_factory=dict)


STREAMS = [
    # Interest retention (issue 27): RUNS is the stages' input, not the record. An event goes once every durable
    # whose filter matches it acked it, the history's and AUDIT's feeds (``FEEDS``) among them, so a sealed run
    # leaves nothing here and nats-server's per-subject index does not grow with history (~9 subjects a run
    # here, where HISTORY keeps one). What a run did is read from HISTORY (``bus/history.py``).
    StreamSpec("RUNS", ["run.>"], max_age=30 * DAY, allow_direct=True, interest=True),
    # a repeat K8S drops is a watch's re-list after a bridge restart, seconds later; a later one only reaches the
    # admission watcher, whose run events are deterministic and dropped by RUNS' own window. A shorter window is
    # fewer message ids held, and fewer messages re-read at a restart to rebuild them (issue 27).
    # Interest retention (issue 27): a watch change is only the admission watcher's input (it turns them into the
    # run events RUNS and AUDIT keep; nothing replays K8S), so one is dropped once both its durables (the lanes)
    # acked it, and a finished run leaves nothing here. One a durable gave up on (max deliveries) stays for
    # `tau dlq replay` until max_age; one the watcher refused (terminated) leaves: its DLQ copy is what replays.
    StreamSpec("K8S", ["k8s.>"], max_age=7 * DAY, duplicate_window=120.0, interest=True),
    StreamSpec("NODES", ["node.>"], max_age=3 * DAY),
    StreamSpec("LOGS", ["log.>"], max_age=14 * DAY, duplicate_window=120.0, allow_direct=True),
    # Interest retention too (issue 27): a request is only its reader's input (the local cluster's lanes, the
    # dispatcher, a site's feed ``site-<cluster>-in``, whose flow-control acks say the site's SITE_IN stored it),
    # so it goes once acked. A request for a cluster with no feed would not be stored at all: the dispatcher
    # nominates no cluster before its feed exists (``sites.feed_exists``), and every feed is made before a site
    # is linked. One its reader gave up on stays for `tau dlq replay`; a refused one replays from its DLQ copy.
    StreamSpec("BACKEND", ["backend.>"], max_age=7 * DAY, interest=True),
    # Poison messages we terminated, plus the server's max-deliveries advisories, so nothing is lost silently.
    StreamSpec("DLQ", ["dlq.>", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"], max_age=30 * DAY),
]

# A stage's durable for the high priority lane (core/events.py: LANED_EVENTS), bound beside its default one.
LANE_DURABLES = {"submitter": "submitter-high", "policy": "policy-high", "renderer": "renderer-high",
                 "admission-watcher": "admission-watcher-high", "runstate": "runstate-high",
                 "local-cluster": "local-cluster-high"}

# The dispatcher's durable on each hub SITE_<CLUSTER> stream (bus/sites.py makes them; not in CONSUMERS: the streams
# are made per cluster at run time).
SITE_DISPATCHER_DURABLE = "dispatcher"
# A site's local cluster's durable on its own SITE_IN (``TAU_SITE``; made by ``sites.provision_site``).
SITE_LOCAL_DURABLE = "local-cluster"


def site_delivery(cluster: str, way: str) -> str:
    """Where the sourcing consumer of one side of ``cluster``'s link delivers (``bus/sites.py``): ``in``, the hub's
    requests to the site (its ``SITE_IN``); ``out``, the site's reports to the hub (its ``SITE_OUT``). One subject
    space per cluster, so each site's leaf user is let receive and send only its own deliveries
    (``permissions.leaf_permissions``), never another site's, as the server's default ``$JS.S.<random>`` would be."""
    return f"sitelink.{cluster}.{way}"


def site_in_durable(cluster: str) -> str:
    """The hub's durable on BACKEND that feeds ``cluster``'s ``SITE_IN`` (``bus/sites.py``): made by the hub's
    bootstrap identity, filtered to the cluster's requests and delivering to its ``site_delivery(…, "in")``, so a
    site only resets it across its link and never creates a consumer on the hub (one it made could name any
    delivery subject: another link's, whose source would take its deliveries for its own)."""
    return f"site-{cluster}-in"


# Run history keyed by run (issue 27: nats-server keeps an index entry per subject of every stream, and RUNS held
# a run's 9 events under 9 subjects for 30 days: ~210 MB of the server's heap over 100,000 runs). HISTORY keeps
# every run event under one subject a run, ``h.<ws>.<run>``, AUDIT what verification needs under ``a.<ws>.<run>``.
# Neither has subjects of its own: each sources RUNS through durables of RUNS (``FEEDS``) whose flow-control acks
# say it stored them (RUNS, an interest stream, lets an event go only then), with a subject transform. The server
# writes each copy's origin in its ``Nats-Stream-Source`` header (``RUNS:C=<consumer> <seq> <filter> <dest>
# <subject> <id>``), which a publish may not carry (nats-server refuses it, error 10227) and sourcing replaces, so
# an event read back keeps the subject, hence the workspace, run and type, that RUNS stored it under, and its RUNS
# sequence (``envelope.from_message``).
HISTORY_STREAM = "HISTORY"
HISTORY_PREFIX = "h"
AUDIT_PREFIX = "a"


def history_subject(workspace: str, run_id: str) -> str:
    """The one subject HISTORY keeps run ``run_id``'s events under."""
    return f"{HISTORY_PREFIX}.{workspace}.{run_id}"


def audit_subject(workspace: str, run_id: str) -> str:
    """The one subject AUDIT keeps run ``run_id``'s kept events under (an earlier release's AUDIT kept them under
    RUNS' own subjects)."""
    return f"{AUDIT_PREFIX}.{workspace}.{run_id}"


AUDIT_STREAM = "AUDIT"
AUDIT_MAX_AGE = 365 * DAY
# What AUDIT keeps of RUNS (issue 27: it held every event a second time, ~10 KB and ~10 subjects a run): what an
# auditor needs to verify a run without trusting the service that sealed it. The bundle holds every event and is
# chained by the ledger; AUDIT, append-only, pins what no service may forge or rewrite after the fact.
AUDIT_KEPT_EVENTS: dict[str, str] = {
    "submit.requested": "the person's signed submission: `tau verify` re-checks the sealed signature against it",
    "cancel.requested": "a person's signed cancellation: who stopped the run, as they signed it",
    **{t: "the run's end: the event that claimed the seal, and what a run's replay stops at"
       for t in sorted(TERMINAL_EVENTS)},
    "evidence.sealed": "the bundle's digest and ledger head: a bundle or ledger rewritten after the seal fails",
}
# A person's laned request carries the lane's token (core/events.LANED_EVENTS): its own filter.
AUDIT_FILTERS: tuple[str, ...] = tuple(
    f"run.*.*.{t}{suffix}" for t in AUDIT_KEPT_EVENTS
    for suffix in ("", f".{HIGH_LANE}") if not suffix or t == "submit.requested"
)
# AUDIT sources RUNS (through its feeds, ``FEEDS``) rather than mirroring it: a mirror answers its origin's direct gets
# (the server makes it inherit RUNS' allow_direct as mirror_direct and adds it to their queue group), and a
# filtered one answers "not found" for every event it skipped, the evidence's reads by sequence among them.
# Sourced messages carry no message id the bus relies on (RUNS deduplicated them), so a minimal window: 1 s.
AUDIT_DUPLICATE_WINDOW_S = 1.0


@dataclass(frozen=True)
class FeedSpec:
    """A push durable of RUNS that feeds a stream sourcing it (``HISTORY``, ``AUDIT``): flow-control acks, so RUNS
    keeps an event until the stream stored it. ``tokens``: how many tokens its subjects have (5, a run event; 6, a
    laned one), the one transform its source applies (a subject the transform does not match would be stored
    under its own subject, so a feed's filters have exactly that many tokens)."""

    durable: str
    into: str
    filters: tuple[str, ...]
    tokens: int

    @property
    def deliver(self) -> str:
        """Where the server delivers it. No identity may publish there (``permissions.STREAM_GUARD``): a message
        published on it would be taken by the source as RUNS' own."""
        return f"feed.{self.durable}"

    @property
    def transform(self) -> tuple[str, str]:
        """(src, dest) of its source's subject transform: the run's workspace and id, its own prefix."""
        prefix = HISTORY_PREFIX if self.into == HISTORY_STREAM else AUDIT_PREFIX
        return ".".join(["run"] + ["*"] * (self.tokens - 1)), f"{prefix}.$1.$2"


# HISTORY keeps every kind of run event AUDIT does not: for the kinds AUDIT keeps, AUDIT's copy is the run's
# history (it keeps them at least as long, ``retention.audit`` ≥ ``retention.runs``), and a second copy in HISTORY
# was ~1.9 KB of a trivial run's ~10.8 KB stored (the request, its end and its seal; issue 27). A kind no feed copies
# would not be kept at all (RUNS stores nothing no durable's filter matches), so the two feeds' filters together
# name every kind of ``events.RUN_EVENTS``, each once (``tests/bus/test_history.py``), and a service may publish no
# other (``publishing.SERVICE_PUBLISH``, the servers' permissions).
HISTORY_KINDS: tuple[str, ...] = tuple(t for t in RUN_EVENTS if t not in AUDIT_KEPT_EVENTS)
FEEDS: tuple[FeedSpec, ...] = (
    FeedSpec("history", HISTORY_STREAM, tuple(f"run.*.*.{t}" for t in HISTORY_KINDS), 5),
    FeedSpec("history-high", HISTORY_STREAM,
             tuple(f"run.*.*.{t}.{HIGH_LANE}" for t in sorted(LANED_EVENTS) if t not in AUDIT_KEPT_EVENTS), 6),
    FeedSpec("audit", AUDIT_STREAM, tuple(f for f in AUDIT_FILTERS if f.count(".") == 4), 5),
    FeedSpec("audit-high", AUDIT_STREAM, tuple(f for f in AUDIT_FILTERS if f.count(".") == 5), 6),
)

KV_BUCKETS = {
    # bucket → history depth. run_state keeps one revision: every write is a compare-and-set against the latest
    # and nothing reads an older revision (the record carries its run's event history itself), so each older
    # revision of a ~2-5 KB record was dead weight, kept forever (issue 27: 5 revisions were 26 KB per run).
    "run_state": 1,
    "platform": 64,
    "node_state": 5,
    "local_cluster": 1,
    "bridge": 1,
    "submissions": 1,
    "ledger": 1,  # evidence: one hash-chained ledger per run, compare-and-set updates
    # renderer: each attempt's manifests by digest, until the evidence seals them and purges the run's keys
    # (bus/manifests.py; issue 27: render.applied carried them in RUNS for 30 days)
    "manifests": 1,
    "log_shipper": 1,  # log-shipper: per-pod log position (container, last timestamp, chunk seq)
    "dispatch": 1,  # dispatcher: per run attempt, the clusters nominated and the one chosen (written once, CAS)
    "site_leases": 1,  # many clusters: one lease per site, renewed by the site, declared lost by the dispatcher
    "service_keys": 1,  # each service's public nkey, written by the bootstrap identity only (bus/authors.py)
}
# Many clusters: each site's capacity and usage, one record per cluster (bus/sitecapacity.py). Made by
# ``sites.provision_hub``, not the bootstrap: its presence says this stack's sites were provisioned. Read as one of
# "every bucket" by the roles that read them all (the portal's queues page on a hub).
SITE_CAPACITY_BUCKET = "site_capacity"
# KV buckets and object stores: no write to them carries a message id (a compare-and-set, a create-once and an
# object's rollup do that work), so their duplicate window dedups nothing; the server's 2 min default only made it
# re-read each one's last 2 min of messages at a restart (issue 27). The server takes no 0 (that is its default).
STORE_DUPLICATE_WINDOW_S = 1.0
OBJECT_STORE = "evidence"  # sealed bundles, large attempt logs, kept outputs: written by the evidence service only
SOURCES_STORE = "sources"  # content-addressed project snapshots (sources/snapshots.py): the submitter writes, pods read
UPLOADS_STORE = "uploads"  # people put snapshots here; the submitter verifies and promotes them into SOURCES_STORE
UPLOADS_TTL_S = 24 * 3600  # an upload is needed only until its submission is accepted

CONSUMERS = {
    c.durable: c
    for c in [
        ConsumerSpec("submitter", "RUNS", ["run.*.*.submit.requested"], description="create-once run records"),
        ConsumerSpec("submitter-high", "RUNS", [f"run.*.*.submit.requested.{HIGH_LANE}"],
                     description="the high priority lane of the submitter"),
        # exactly five tokens: a high-lane run's laned events (a sixth token) are projected by runstate-high, so its
        # record (its verified user, which the stages after it read) is not written behind a backlog
        ConsumerSpec("runstate", "RUNS", ["run.*.*.*.*"], description="projects RUNS into the run_state KV"),
        ConsumerSpec("runstate-high", "RUNS", [f"run.*.*.*.*.{HIGH_LANE}"],
                     description="the high priority lane of the run_state projection"),
        ConsumerSpec("policy", "RUNS", ["run.*.*.submit.accepted"]),
        ConsumerSpec("policy-high", "RUNS", [f"run.*.*.submit.accepted.{HIGH_LANE}"],
                     description="the high priority lane of the policy"),
        ConsumerSpec(
            "renderer", "RUNS",
            ["run.*.*.policy.approved", "run.*.*.recovery.retrying", "run.*.*.cancel.requested"],
            max_deliver=50,  # retries wait out their backoff by nak(delay), which counts as a delivery
        ),
        ConsumerSpec("renderer-high", "RUNS", [f"run.*.*.policy.approved.{HIGH_LANE}"], max_deliver=50,
                     description="the high priority lane of the renderer"),
        # exactly the six tokens of a watch change: a high-lane run's (a seventh token) go to the lane's durable
        ConsumerSpec("admission-watcher", "K8S", ["k8s.*.*.*.*.*"]),
        ConsumerSpec("admission-watcher-high", "K8S", [f"k8s.*.*.*.*.*.{HIGH_LANE}"],
                     description="the high priority lane of the admission watcher (the local cluster's objects)"),
        ConsumerSpec(
            "recovery", "RUNS",
            ["run.*.*.exec.failed", "run.*.*.admission.preempted", "run.*.*.render.failed",
             "run.*.*.health.degraded"],
        ),
        # only what seals a run (never laned: core/events.py LANED_EVENTS); the run's other events are read back
        # from HISTORY at the seal (evidence/store.py run_history)
        ConsumerSpec("evidence", "RUNS", [f"run.*.*.{t}" for t in sorted(TERMINAL_EVENTS)],
                     description="seals a run at its terminal event"),
        ConsumerSpec("health-monitor", "NODES", ["node.*.sample"]),
        # exactly three tokens: a high-lane run's apply (backend.local.apply.high) goes to local-cluster-high
        ConsumerSpec("local-cluster", "BACKEND", ["backend.local.*"], max_deliver=20),
        # the renderer's requests when the platform names clusters (TAU_CLUSTER=dispatch), docs §13d
        ConsumerSpec("dispatcher", "BACKEND", ["backend.dispatch.>"], max_deliver=20),
        ConsumerSpec("local-cluster-high", "BACKEND", [f"backend.local.*.{HIGH_LANE}"], max_deliver=20,
                     description="the high priority lane of the local cluster's applies"),
        ConsumerSpec("local-cluster-nodes", "NODES", ["node.*.cordon", "node.*.uncordon"],
                     description="the health monitor's cordon decisions for this machine"),
        ConsumerSpec(
            "health-actuator", "NODES", ["node.*.cordon", "node.*.uncordon", "node.*.condition.>", "node.*.repair"],
            max_deliver=50,  # a drain blocked by a PodDisruptionBudget waits it out by nak(delay)
            description="cordon/drain/conditions on Kubernetes nodes (TAU_BACKEND=kubernetes)",
        ),
    ]
}
