"""Who may publish and subscribe to what on the bus: one table, rendered into nats-server's configuration.

Invariants:
- Everything not allowed is refused by the server (allow lists; deny lists only carve holes out of them).
- Each service publishes only its own stage's events, binds only its own durables, writes only the KV buckets
  it owns; only ``policy`` publishes ``run.*.*.policy.*``, only ``recovery`` ``run.*.*.recovery.*``, only the
  ``renderer`` ``backend.*.apply``; only the bootstrap identity creates or changes streams, consumers and
  buckets.
- Every identity receives replies only on its own inbox ``_INBOX.<its public key>.>`` (clients must set that
  inbox prefix, see ``inbox_prefix``), so nobody can listen to another identity's replies or deliveries.
  Nobody subscribes to stream subjects directly: streams are read through consumers, whose create subjects
  name the filter (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which is what lets people's
  permissions confine reads to their workspaces' subjects.

``authorization_conf`` renders the nats-server ``authorization`` block; ``markdown_table`` renders the table
in docs/architecture.md (a test keeps the doc current).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from taugrid.bus.topology import (
    AUDIT_PREFIX,
    CONSUMERS,
    FEEDS,
    HISTORY_PREFIX,
    KV_BUCKETS,
    OBJECT_STORE,
    SITE_CAPACITY_BUCKET,
    SITE_DISPATCHER_DURABLE,
    SITE_LOCAL_DURABLE,
    SOURCES_STORE,
    UPLOADS_STORE,
    site_delivery,
    site_in_durable,
)
from taugrid.core.events import HIGH_LANE
from taugrid.core.ids import token
from taugrid.core.publishing import SERVICE_PUBLISH

API = "$JS.API"
# the streams people read, confined to their workspaces by the subjects' workspace token (``READ_PREFIXES``)
READ_STREAMS = ("RUNS", "HISTORY", "AUDIT", "LOGS")
# Each read stream's subject prefixes: ``<prefix>.<ws>.>``. HISTORY and AUDIT keep a run's events under one
# subject a run (``topology.FEEDS``); an AUDIT an earlier release made holds them under RUNS' own subjects too.
READ_PREFIXES = {"RUNS": ("run",), "HISTORY": (HISTORY_PREFIX,), "AUDIT": (AUDIT_PREFIX, "run"), "LOGS": ("log",)}
PEOPLE_KV_READ = ("run_state", "platform", "local_cluster", "node_state", "ledger", "site_leases",
                  SITE_CAPACITY_BUCKET)
# Buckets whose keys are ``run.<workspace>.<run>``: people read only their workspaces' keys there.
WORKSPACE_KV = ("run_state", "ledger")


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix an identity must use; its permissions let it receive only there."""
    return f"_INBOX.{public_key}"


@dataclass(frozen=True)
class ServiceRole:
    """One service's grant, in the platform's own terms (turned into subjects by ``service_permissions``).
    What it publishes is ``publishing.SERVICE_PUBLISH`` (the same table the consumers' ce-source check uses)."""

    name: str  # the service's module (taugrid_services.<name>) and its credentials' name
    durables: tuple[str, ...] = ()  # the durable consumers it binds (topology.CONSUMERS)
    kv_writes: tuple[str, ...] = ()  # KV buckets it owns
    objects: str = "none"  # the evidence object store (bundles, logs, kept outputs): none | read | write
    sources: str = "none"  # the sources object store (content-addressed project snapshots): none | read | promote
    # (promote: read the people's uploads, write sources; the submitter only)
    replays: tuple[str, ...] = ()  # streams it reads with short-lived consumers (any subject)
    why: str = ""
    kv_reads: tuple[str, ...] | None = None  # KV buckets it reads; None: all of them
    # a durable of this name it binds on streams made at run time (the hub's SITE_<CLUSTER>, bus/sites.py)
    site_durable: str = ""
    # reads whether each cluster's feed exists on BACKEND (``sites.feed_exists``): the dispatcher nominates no
    # cluster before (BACKEND, an interest-retention stream, stores no request no durable's filter matches)
    feeds: bool = False

    @property
    def emits(self) -> tuple[str, ...]:
        return SERVICE_PUBLISH.get(self.name.replace("_", "-"), ())


SERVICE_ROLES: dict[str, ServiceRole] = {
    r.name: r
    for r in [
        ServiceRole("submitter", ("submitter", "submitter-high"), ("submissions",), sources="promote",
                    why="accepts submissions (verifies their uploaded snapshot and promotes it into `sources`, "
                        "which only it writes)"),
        ServiceRole("run_record", ("runstate", "runstate-high"), ("run_state",),
                    # a run's record is rebuilt from its events when one arrives late (HISTORY, AUDIT: bus/history)
                    replays=("RUNS", "HISTORY", "AUDIT"),
                    why="projects RUNS into run_state, the record every other stage reads; publishes nothing"),
        ServiceRole("policy", ("policy", "policy-high"),
                    # a refusal's key lines: the answered request, which AUDIT keeps, read back (keylines)
                    replays=("HISTORY", "AUDIT"),
                    why="the only source of policy decisions"),
        ServiceRole("renderer", ("renderer", "renderer-high"), ("manifests",),
                    why="the only identity that applies to a backend"),
        ServiceRole("admission_watcher", ("admission-watcher", "admission-watcher-high"), ("bridge",),
                    why="translates watch events into run events"),
        ServiceRole("recovery", ("recovery",), why="the only source of retries"),
        ServiceRole("dispatcher", ("dispatcher",), ("dispatch", "site_leases"), site_durable=SITE_DISPATCHER_DURABLE,
                    feeds=True,
                    why="many clusters: sends a run's copies to the clusters nominated, withdraws the losers' (§13d)"),
        # manifests: it purges a sealed run's (bus/manifests.py); it reads them only checked against their digest
        ServiceRole("evidence", ("evidence",), ("ledger", "manifests"), "write",
                    replays=("RUNS", "HISTORY", "AUDIT", "LOGS"), why="ledger, sealed bundles"),
        ServiceRole("health_monitor", ("health-monitor", "health-actuator"), ("node_state",),
                    why="node health decisions"),
        ServiceRole("node_agent", why="samples this node"),
        ServiceRole("local_cluster", ("local-cluster", "local-cluster-high", "local-cluster-nodes"), ("local_cluster",),
                    sources="read",
                    why="the embedded cluster: runs pods, ships their logs"),
        ServiceRole("kube_bridge", (), ("bridge", "local_cluster"),
                    why="mirrors Kubernetes watch events; the queue snapshot for `tau queue`"),
        ServiceRole("log_shipper", (), ("log_shipper",), why="ships Kubernetes pod logs"),
        ServiceRole("source_fetch", sources="read", kv_reads=(),
                    why="the run pod's init container: fetches the source snapshot, nothing else"),
        ServiceRole("anchor", replays=("AUDIT",), kv_reads=("ledger", "platform"),  # platform: AUDIT's max age
                    why="Kubernetes: signs the ledger heads and AUDIT's position to a file outside the bus"),
        ServiceRole("portal", (), (), "read", replays=("RUNS", "HISTORY", "AUDIT", "LOGS", "NODES"),
                    why="the web portal: reads for each signed-in person (filtered by the portal), cancels for them"),
        ServiceRole("auth_sync", kv_reads=("platform",),
                    why="Kubernetes: renders the server's users from the platform and reloads it"),
    ]
}
BOOTSTRAP = "bootstrap"
BREAK_GLASS = "breakglass"
# What even the bootstrap identity may not do, so no routine credential can rewrite the audit trail: change or
# delete a stream's configuration (``update_stream(AUDIT, max_msgs=1)`` would empty it), purge AUDIT or RUNS,
# delete single messages from them. Only the break-glass identity (kept offline by the operator) may.
# The feeds' delivery subjects too (``topology.FEEDS``): HISTORY and AUDIT take what arrives there as RUNS' events.
STREAM_GUARD = (f"{API}.STREAM.UPDATE.>", f"{API}.STREAM.DELETE.>", f"{API}.STREAM.PURGE.AUDIT",
                f"{API}.STREAM.PURGE.RUNS", f"{API}.STREAM.MSG.DELETE.AUDIT", f"{API}.STREAM.MSG.DELETE.RUNS",
                f"{API}.STREAM.PURGE.HISTORY", f"{API}.STREAM.MSG.DELETE.HISTORY", "feed.>")


def bootstrap_permissions() -> Permissions:
    """Everything but ``STREAM_GUARD``: it creates streams, consumers and buckets, never changes them."""
    return Permissions(publish=(">",), subscribe=(">",), deny_publish=STREAM_GUARD)


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()

    def as_conf(self) -> dict[str, object]:
        pub: dict[str, object] = {"allow": list(self.publish)}
        if self.deny_publish:
            pub["deny"] = list(self.deny_publish)
        return {"publish": pub, "subscribe": {"allow": list(self.subscribe)}}


@dataclass(frozen=True)
class Person:
    """A person as the bus sees them: their key, role and the workspaces they belong to."""

    name: str
    public_key: str
    role: str = "researcher"  # researcher | platform-admin
    workspaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Account:
    name: str
    public_key: str
    permissions: Permissions | None  # None: everything (the bootstrap identity)
    comment: str = ""


def _kv_read(bucket: str) -> list[str]:
    stream = f"KV_{bucket}"
    return [f"{API}.STREAM.INFO.{stream}", f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>",
            f"{API}.STREAM.MSG.GET.{stream}", f"{API}.CONSUMER.CREATE.{stream}", f"{API}.CONSUMER.CREATE.{stream}.>",
            f"{API}.CONSUMER.INFO.{stream}.*", f"{API}.CONSUMER.DELETE.{stream}.*"]


def _kv_read_workspace(bucket: str, ws: str) -> list[str]:
    """Reads of one workspace's keys (``run.<ws>.>``) only: direct gets name the key in their subject, and
    listing goes through a named consumer whose create subject names the filter (``kv.filtered_values``). The
    forms that carry the key in the request body (``DIRECT.GET.<stream>`` alone, ``STREAM.MSG.GET``, an unnamed
    consumer create) are not granted, since the server cannot see what they read."""
    stream, keys = f"KV_{bucket}", f"$KV.{bucket}.run.{ws}.>"
    return [f"{API}.DIRECT.GET.{stream}.{keys}", f"{API}.CONSUMER.CREATE.{stream}.*.{keys}",
            f"{API}.CONSUMER.INFO.{stream}.*", f"{API}.CONSUMER.DELETE.{stream}.*"]


def _objects_read(store: str = OBJECT_STORE) -> list[str]:
    stream = f"OBJ_{store}"
    return [f"{API}.STREAM.INFO.{stream}", f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>",
            f"{API}.STREAM.MSG.GET.{stream}", f"{API}.CONSUMER.CREATE.{stream}", f"{API}.CONSUMER.CREATE.{stream}.>",
            f"{API}.CONSUMER.INFO.{stream}.*", f"{API}.CONSUMER.DELETE.{stream}.*"]


def _objects_read_workspace(ws: str) -> list[str]:
    """The evidence objects of one workspace: any object's metadata by a direct get that names it, and only
    chunks under ``$O.evidence.C.<ws>.>`` (``objects.write`` puts them there) through named consumers."""
    stream = f"OBJ_{OBJECT_STORE}"
    return [f"{API}.DIRECT.GET.{stream}.$O.{OBJECT_STORE}.M.*",
            f"{API}.CONSUMER.CREATE.{stream}.*.$O.{OBJECT_STORE}.C.{ws}.>",
            f"{API}.CONSUMER.INFO.{stream}.*", f"{API}.CONSUMER.DELETE.{stream}.*"]


def _objects_write() -> list[str]:
    return [f"$O.{OBJECT_STORE}.>", f"{API}.STREAM.PURGE.OBJ_{OBJECT_STORE}"]


def _durable(stream: str, durable: str) -> list[str]:
    return [f"{API}.CONSUMER.INFO.{stream}.{durable}", f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>", f"dlq.{stream}.{durable}"]


def _common(public_key: str) -> tuple[list[str], list[str]]:
    """What every identity needs: account info, stream metadata, flow control, its own inbox."""
    return ([f"{API}.INFO", f"{API}.STREAM.INFO.*", f"{API}.STREAM.NAMES", "$JS.FC.>"],
            [f"{inbox_prefix(public_key)}.>"])


# The services that act for a site at its own leaf server (``site_grants``): a Kubernetes cluster's kube-bridge
# (docs §13d "A Kubernetes site"); a local site's local cluster has its own server's every permission.
AT_SITE = ("kube_bridge",)
SITE_IN_STREAM = "SITE_IN"  # bus/sites.SITE_IN


def site_grants(cluster: str, *, hub_domain: str = "hub") -> list[str]:
    """What a service in ``AT_SITE`` may do besides its role's at site ``cluster``'s leaf server: pull the site's
    requests from its ``SITE_IN`` (durable ``local-cluster``; its refusals into the site's DLQ), and across the
    link (the hub domain's API; the hub's leaf grant bounds it again) read and compare-and-set its own lease, put
    its own ``site_capacity`` record and read the ``dispatch`` records (a returning site's orphans)."""
    api = f"$JS.{hub_domain}.API"
    return [*_durable(SITE_IN_STREAM, SITE_LOCAL_DURABLE),
            f"{api}.STREAM.INFO.KV_site_leases", f"{api}.DIRECT.GET.KV_site_leases.$KV.site_leases.{cluster}",
            f"{api}.$KV.site_leases.{cluster}", f"{api}.$KV.{SITE_CAPACITY_BUCKET}.{cluster}",
            f"{api}.STREAM.INFO.KV_dispatch", f"{api}.DIRECT.GET.KV_dispatch.$KV.dispatch.>"]


def service_permissions(role: ServiceRole, public_key: str, *, site: str = "") -> Permissions:
    """``site``: the cluster whose own leaf server this identity is admitted by (``chartauth render --site``)."""
    pub, sub = _common(public_key)
    pub += list(role.emits)
    if site and role.name in AT_SITE:
        pub += site_grants(site)
    if any(subject.startswith("run.") for subject in role.emits):
        # a duplicate ack into RUNS is checked against the subject the id was stored on (``Bus.publish``), read
        # from the run's history once RUNS let it go (interest retention, issue 27)
        pub += [f"{API}.STREAM.MSG.GET.RUNS", f"{API}.DIRECT.GET.HISTORY", f"{API}.DIRECT.GET.AUDIT"]
    for durable in role.durables:
        pub += _durable(CONSUMERS[durable].stream, durable)
    if role.site_durable:
        pub += _durable("*", role.site_durable)
    if role.feeds:
        # whether each cluster's feed (``site-<cluster>-in``) exists; a wildcard takes a whole token, and
        # ``durable_guard`` still refuses the other services' BACKEND durables' info
        pub.append(f"{API}.CONSUMER.INFO.BACKEND.*")
    for stream in role.replays:
        pub += [f"{API}.CONSUMER.CREATE.{stream}.*.>", f"{API}.CONSUMER.INFO.{stream}.*",
                f"{API}.CONSUMER.MSG.NEXT.{stream}.*", f"{API}.CONSUMER.DELETE.{stream}.*",
                f"{API}.STREAM.MSG.GET.{stream}", f"{API}.DIRECT.GET.{stream}", f"{API}.DIRECT.GET.{stream}.>"]
    for bucket in (*KV_BUCKETS, SITE_CAPACITY_BUCKET) if role.kv_reads is None else role.kv_reads:
        pub += _kv_read(bucket)
    pub += [f"$KV.{bucket}.>" for bucket in role.kv_writes]
    if role.objects in ("read", "write"):
        pub += _objects_read()
    if role.objects == "write":
        pub += _objects_write()
    if role.sources in ("read", "promote"):
        pub += _objects_read(SOURCES_STORE)
    if role.sources == "promote":
        pub += _objects_read(UPLOADS_STORE)
        pub += [f"$O.{SOURCES_STORE}.>", f"{API}.STREAM.PURGE.OBJ_{SOURCES_STORE}"]
    return Permissions(publish=tuple(dict.fromkeys(pub)), subscribe=tuple(sub),
                       deny_publish=durable_guard(own=role.durables))


def durable_guard(*, own: Iterable[str] = ()) -> tuple[str, ...]:
    """What no identity but the bootstrap may do to the services' durable consumers, which are part of the
    services (trust.md §5): create one (a create naming an existing durable *updates* it: a researcher changed
    the evidence durable's filter so another workspace's runs were never sealed), delete one, and, but for the
    service that owns it (``own``), pull from it, read its state or ack for it (a researcher pulled another
    workspace's submissions from ``runstate`` and held them unacked for a minute). The legacy durable create
    subject is refused outright: short-lived consumers are made with ``CONSUMER.CREATE``."""
    mine = set(own)
    out = [f"{API}.CONSUMER.DURABLE.CREATE.>"]
    durables = [(spec.stream, spec.durable) for spec in CONSUMERS.values()]
    durables += [("RUNS", feed.durable) for feed in FEEDS]  # HISTORY's and AUDIT's: no service owns them
    for stream, name in durables:
        out += [f"{API}.CONSUMER.CREATE.{stream}.{name}", f"{API}.CONSUMER.CREATE.{stream}.{name}.>",
                f"{API}.CONSUMER.DELETE.{stream}.{name}"]
        if name not in mine:
            out += [f"{API}.CONSUMER.MSG.NEXT.{stream}.{name}", f"{API}.CONSUMER.INFO.{stream}.{name}",
                    f"$JS.ACK.{stream}.{name}.>"]
    # A feed's name on any stream: a push consumer delivers wherever its creator says, and the sourcing stream
    # knows its feed's deliveries by the consumer name in their ack subject (nats-server's sourcing compares the
    # name; 2.15.1 was seen to ignore another stream's consumer of that name, tests/security/test_history_feeds.py),
    # so no one but the bootstrap makes a consumer that could pass for one.
    for feed in FEEDS:
        out += [f"{API}.CONSUMER.CREATE.*.{feed.durable}", f"{API}.CONSUMER.CREATE.*.{feed.durable}.>"]
    return tuple(out)


def person_permissions(person: Person) -> Permissions:
    """A researcher submits and cancels only in their workspaces and reads only their workspaces' events and
    logs; a platform admin does this everywhere and may also apply the platform (the ``platform`` KV)."""
    pub, sub = _common(person.public_key)
    admin = person.role == "platform-admin"
    spaces = ["*"] if admin else [token(ws) for ws in person.workspaces]
    for ws in spaces:
        pub += [f"run.{ws}.*.submit.requested", f"run.{ws}.*.submit.requested.{HIGH_LANE}",
                f"run.{ws}.*.cancel.requested"]
        for stream in READ_STREAMS:
            pub += [f"{API}.CONSUMER.CREATE.{stream}.*.{prefix}.{ws}.>" for prefix in READ_PREFIXES[stream]]
    if admin:  # all events of every workspace (`tau events` with no filter)
        pub += [f"{API}.CONSUMER.CREATE.{stream}.*.>" for stream in READ_STREAMS]
        pub.append("$KV.platform.>")
        # `tau dlq list`: the dead letters and the subjects of their originals (replay needs the bootstrap identity)
        pub += [f"{API}.STREAM.MSG.GET.{stream}" for stream in ("DLQ", *READ_STREAMS)]
    for stream in READ_STREAMS:
        pub += [f"{API}.CONSUMER.INFO.{stream}.*", f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
                f"{API}.CONSUMER.DELETE.{stream}.*"]
    for bucket in PEOPLE_KV_READ:
        if admin or bucket not in WORKSPACE_KV:
            pub += _kv_read(bucket)
        else:
            for ws in spaces:
                pub += _kv_read_workspace(bucket, ws)
    if admin:
        pub += _objects_read()
    else:
        for ws in spaces:
            pub += _objects_read_workspace(ws)
    pub += _objects_read(SOURCES_STORE)  # what runs: written by the submitter only, so never replaced by anyone
    pub += _objects_read(UPLOADS_STORE)  # a put reads the name's metadata first
    pub += [f"$O.{UPLOADS_STORE}.C.>", f"$O.{UPLOADS_STORE}.M.>"]  # puts of source snapshots only, never purge
    return Permissions(publish=tuple(dict.fromkeys(pub)), subscribe=tuple(sub), deny_publish=durable_guard())


def accounts(*, bootstrap_key: str, service_keys: dict[str, str], people: Iterable[Person],
             break_glass_key: str | None = None, site: str = "") -> list[Account]:
    """Every identity the server admits: bootstrap, the break-glass admin (when it has a key), each service that
    has a key, each person. ``site``: the server is that cluster's leaf server (``site_grants``)."""
    out = [Account(BOOTSTRAP, bootstrap_key, bootstrap_permissions(),
                   "provisions streams, consumers, buckets; never changes or deletes a stream")]
    if break_glass_key:
        out.append(Account(BREAK_GLASS, break_glass_key, None,
                           "break-glass admin: the only identity that may change or delete streams"))
    for name, key in sorted(service_keys.items()):
        if name not in SERVICE_ROLES:
            raise KeyError(f"no permission table entry for service {name!r}")
        out.append(Account(name, key, service_permissions(SERVICE_ROLES[name], key, site=site), f"service {name}"))
    for person in people:
        out.append(Account(person.name, person.public_key, person_permissions(person),
                           f"{person.role} {person.name}"))
    return out


@dataclass(frozen=True)
class LeafUser:
    """A site's leaf node as the hub admits it (many clusters, docs §13d): the user its remote connects as, with a
    password (a leaf remote takes no nkey seed), and what crosses its link (``leaf_permissions``)."""

    cluster: str
    password: str
    inbox: str  # the inbox prefix of the site's service that calls the hub's API (its local cluster)

    @property
    def user(self) -> str:
        return leaf_user(self.cluster)


def leaf_user(cluster: str) -> str:
    return f"leaf-{cluster}"


def leaf_permissions(cluster: str, inbox: str, *, hub_domain: str = "hub") -> Permissions:
    """What site ``cluster``'s leaf node may do on the hub, from the leaf's side (publish: what it sends into the
    hub; subscribe: what the hub sends it). Only what its links and its lease need: reset the durable the hub made on
    BACKEND to feed its ``SITE_IN`` (``topology.site_in_durable``: its own requests, ``backend.<cluster>.>``,
    delivered to it on its own ``sitelink.<cluster>.in``; it may create no consumer on the hub); deliver its
    reports to the hub on its own ``sitelink.<cluster>.out.…`` (``topology.site_delivery``); read and write its
    own lease key, write its own ``site_capacity`` key (its capacity and usage), read the hub's dispatch records
    (a returning site's orphans), receive replies on ``inbox`` (its
    local cluster's); the hub may call its JetStream API (to source its ``SITE_OUT``). Everything else (any event
    subject, another cluster's lease, requests or deliveries, every other stream and bucket) is refused by the hub.

    Shared by every site still (docs §16): the sourcing's consumer-create replies (``$JSC.R.<random>``: consumer
    info, no message; the hub's ``allow_responses`` does not track a leaf node's, so a site's answers to the hub's
    calls need the whole space) and the flow control of the hub's source of its ``SITE_OUT``
    (``$JS.FC.SITE_OUT.…`` to the sites: empty; a site's stream is ``SITE_OUT`` wherever it is), which the server
    names."""
    api = f"$JS.{hub_domain}.API"
    leases, dispatch = "KV_site_leases", "KV_dispatch"
    return Permissions(
        publish=(f"{api}.CONSUMER.RESET.BACKEND.{site_in_durable(cluster)}",
                 f"{api}.$KV.site_leases.{cluster}", f"{api}.STREAM.INFO.{leases}",
                 f"{api}.$KV.site_capacity.{cluster}",  # its own capacity record (bus/sitecapacity.py)
                 f"{api}.DIRECT.GET.{leases}.$KV.site_leases.{cluster}",
                 f"{api}.STREAM.INFO.{dispatch}", f"{api}.DIRECT.GET.{dispatch}.$KV.dispatch.>",
                 "$JSC.R.*", f"{site_delivery(cluster, 'out')}.>", f"$JS.FC.BACKEND.{site_in_durable(cluster)}.>"),
        subscribe=(f"$JS.{cluster}.API.>", site_delivery(cluster, "in"), "$JSC.R.*", f"{inbox}.>",
                   "$JS.FC.SITE_OUT.>"))


def authorization_conf(accounts_: Sequence[Account], leaves: Sequence[LeafUser] = ()) -> str:
    """The nats-server ``authorization { users = [...] }`` block for these identities (and sites' leaf nodes)."""
    lines = ["# generated by taugrid.access.permissions; do not edit (regenerated on every change of users)",
             "authorization {", "  users = ["]
    for acc in accounts_:
        entry: dict[str, object] = {"nkey": acc.public_key}
        if acc.permissions is not None:
            entry["permissions"] = acc.permissions.as_conf()
        lines.append(f"    # {acc.comment or acc.name}")
        lines.append(f"    {json.dumps(entry)}")
    for leaf in leaves:
        lines.append(f"    # the leaf node of site {leaf.cluster}")
        lines.append("    " + json.dumps({"user": leaf.user, "password": leaf.password,
                                          "permissions": leaf_permissions(leaf.cluster, leaf.inbox).as_conf()}))
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class _Row:
    who: str
    publish: list[str] = field(default_factory=list)
    why: str = ""


def markdown_table() -> str:
    """The permission table for docs/architecture.md, from the same code that renders the server config."""
    key = "U" + "K" * 55
    rows = ["| identity | may publish (besides `$JS.API.INFO`, `$JS.API.STREAM.INFO.*`, `$JS.API.STREAM.NAMES`, "
            "`$JS.FC.>`; and `$JS.API.STREAM.MSG.GET.RUNS`, `$JS.API.DIRECT.GET.HISTORY` for a service that "
            "publishes run events, to check a duplicate message id's subject, §4) | why |",
            "|---|---|---|",
            f"| `{BOOTSTRAP}` | everything except changing or deleting a stream, purging AUDIT/RUNS/HISTORY or "
            "deleting their messages, and publishing on the feeds' delivery subjects (`feed.>`: HISTORY and AUDIT "
            "take what arrives there as RUNS' events) (creates streams, consumers, KV buckets, the object store) "
            "| `tau up`, the chart's bootstrap Job |",
            f"| `{BREAK_GLASS}` | everything | the operator's offline key (written once outside the data dir, "
            "`~/.config/taugrid/stacks/<id>/breakglass.nk`): stream changes and deletions |"]
    common = set(_common(key)[0])
    kv_read = {s for b in KV_BUCKETS for s in _kv_read(b)}
    for role in SERVICE_ROLES.values():
        perms = service_permissions(role, key)
        parts = [f"`{s}`" for s in role.emits]
        parts += [f"durable `{d}`" for d in role.durables]
        if role.site_durable:
            parts.append(f"durable `{role.site_durable}` on each `SITE_*` stream")
        if role.feeds:
            parts.append("the info of BACKEND's consumers (whether a cluster's feed exists; the other services' "
                         "durables stay refused)")
        parts += [f"KV put `{b}`" for b in role.kv_writes]
        if role.objects != "none":
            parts.append(f"object store `{OBJECT_STORE}` {role.objects}")
        if role.sources != "none":
            parts.append(f"object store `{SOURCES_STORE}` {role.sources}")
        if role.replays:
            parts.append("replay " + "/".join(role.replays))
        if role.kv_reads is None and any(s in kv_read for s in perms.publish):
            parts.append("KV read all")
        parts += [f"KV read `{b}`" for b in role.kv_reads or ()]
        if role.name in AT_SITE:
            parts.append(f"at a Kubernetes site's own server (`chartauth render --site`, §13d): durable "
                         f"`{SITE_LOCAL_DURABLE}` on `{SITE_IN_STREAM}`, across its link its own `site_leases` key "
                         "(read, compare-and-set), its own `site_capacity` key (put), direct gets of the `dispatch` "
                         "records")
        assert common <= set(perms.publish)
        rows.append(f"| `{role.name}` | {', '.join(parts) or '—'} | {role.why} |")
    rows.append(f"| researcher | `run.<ws>.*.submit.requested` (and `.{HIGH_LANE}`, the priority lane they claim: "
                "the submitter and the policy decide it again), `run.<ws>.*.cancel.requested`, consumers filtered to "
                "`run.<ws>.>` on RUNS, `h.<ws>.>` on HISTORY, `a.<ws>.>` (and an earlier release's `run.<ws>.>`) "
                "on AUDIT and `log.<ws>.>` on LOGS, for each of their workspaces; KV read "
                f"{', '.join(f'`{b}`' for b in PEOPLE_KV_READ if b not in WORKSPACE_KV)}, and "
                f"{', '.join(f'`{b}`' for b in WORKSPACE_KV)} only under `run.<ws>.>` (direct gets and named "
                f"consumers, whose subjects name the key); object store `{SOURCES_STORE}` read, "
                f"`{UPLOADS_STORE}` read and put, "
                f"`{OBJECT_STORE}` read of their workspaces' objects (chunks under `$O.{OBJECT_STORE}.C.<ws>.>`; "
                "any object's metadata) "
                "| people, from `platform.yaml` |")
    rows.append("| platform-admin | as a researcher in every workspace, every RUNS/HISTORY/AUDIT/LOGS subject, KV put "
                "`platform`, read the DLQ | `tau platform apply`, `tau admin`, `tau dlq list` |")
    rows.append("| a site's leaf node, `leaf-<cluster>` (a password user; many clusters, §13d) | across its link: "
                "a reset of the hub's durable `site-<cluster>-in` on BACKEND (filtered to `backend.<cluster>.>`, "
                "its `SITE_IN`'s feed; no consumer create), its own `site_leases` key "
                "(read, compare-and-set), its own `site_capacity` key (put), direct gets of the `dispatch` records, "
                "its own link's deliveries to the hub (`sitelink.<cluster>.out.>`), the sourcing's replies "
                "(`$JSC.R.*`, `$JS.FC.BACKEND.site-<cluster>-in.>`); receives only the hub's calls to its own API "
                "(`$JS.<cluster>.API.>`), its own requests' deliveries (`sitelink.<cluster>.in`), its local "
                "cluster's replies (`_INBOX.<its key>.>`), those replies and `$JS.FC.SITE_OUT.>` "
                "| `tau up` with clusters, and the chart's hub (`clusters.leafSecret`): one per site |")
    rows.append("| everyone but `bootstrap` | subscribe only `_INBOX.<own public key>.>`; never create, update or "
                "delete a service's durable consumer, nor pull from, ack for or read one that is not their own; "
                f"no consumer on any stream under a feed's name ({', '.join(f'`{f.durable}`' for f in FEEDS)}); "
                "short-lived consumers only, under names of 128 random bits | |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m taugrid.access.permissions: the table for docs/architecture.md
    print(markdown_table(), end="")
