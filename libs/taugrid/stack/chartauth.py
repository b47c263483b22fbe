"""Bus identities for the Helm chart: the operator creates them once, the NATS pod keeps its users current.

On the operator's machine (``tau admin chart-credentials``): seeds are created once in a directory kept by the
operator (0700, files 0600, like ``$TAU_DATA_DIR/creds/`` of ``tau up``): ``bootstrap.nk``, ``svc-<service>.nk``
for every service that runs on Kubernetes (``local_cluster`` does not), ``admin.nk``, the operator's own
person (platform admin whatever the platform lists, so adding people never locks the operator out), and
``breakglass.nk``, the only identity that may change or delete streams (kept offline), and
``anchor-signing.nk``, the seed the ``anchor`` service signs the audit anchors with. From them it
writes Secret manifests: one in the release namespace holding every service seed and ``identities.json`` (the
public keys only, which is all the server needs), and one per workspace namespace holding only the source-fetch
seed (key ``creds``, what the renderer mounts into run pods). The operator's and break-glass seeds never enter
the cluster.

In the NATS pod (``python -m taugrid.stack.chartauth``): ``render`` (an init container) writes the server's
``authorization`` block from ``identities.json`` before the server starts; ``sync`` (a sidecar sharing the pod's
process namespace) follows the platform KV and rewrites that block on every revision, exactly as the embedded
stack's supervisor does, then signals the server to reload (SIGHUP to the pid in its ``pid_file``): added people
connect at once, removed people are disconnected, no service restarts. It also reloads when the TLS certificate
files change (cert-manager renews them in place).

Many clusters (docs §13d): on a hub (the release whose platform names ``clusters``), ``render`` and ``sync``
take ``--leaves leaves.json`` (``{"<cluster>": {"password": ..., "key": <the site's kube_bridge public key>}}``,
a Secret the operator writes with ``leaf``) and add one leaf user per cluster with the hub's grant
(``permissions.leaf_permissions``, as ``tau up`` gives its sites). At a site (``render --site <cluster>``) the
site's leaf server admits only its bootstrap identity and the services that run there (``SITE_SERVICES``), from
that site's own identities (a ``chart-credentials`` directory of its own): no people, no other service.

Invariants: one permission table (``access/permissions.py``) for both deployments; seeds are never overwritten
(re-running the command reuses them, so adding a workspace namespace needs no restart); a platform revision
that does not parse keeps the previous users.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from taugrid import settings
from taugrid.access import permissions
from taugrid.bus import creds
from taugrid.config.clusters import DISPATCH, NAME_PATTERN
from taugrid.config.platform import Platform
from taugrid.core.errors import ConfigError, PermanentError
from taugrid.stack import auth

log = logging.getLogger("taugrid.chartauth")

# Every identity the chart deploys: the services of charts/taugrid, the node agent, the source fetch of run pods
# and the NATS pod's own user-sync sidecar. The embedded cluster (local_cluster) never runs on Kubernetes.
CHART_SERVICES = tuple(name for name in permissions.SERVICE_ROLES if name != "local_cluster")
ADMIN_FILE = "admin.nk"
BREAK_GLASS_FILE = "breakglass.nk"  # stream changes (bootstrap --update); keep it offline, never in the cluster
ANCHOR_SIGNING_FILE = "anchor-signing.nk"  # the anchor service's signing seed (not a bus identity)
IDENTITIES_KEY = "identities.json"
LOCAL_ADMIN_KEY = "local-admin"
SOURCE_FETCH_KEY = "creds"  # render/source.py CREDS_KEY: the key the renderer mounts into run pods
# The services a Kubernetes cluster's site runs against its own leaf server (charts/taugrid site.enabled); the
# first is the one whose replies come back across the link (its key is the leaf user's inbox on the hub).
SITE_SERVICES = ("kube_bridge", "log_shipper", "health_monitor")
LEAVES_KEY = "leaves.json"


def service_file(service: str) -> str:
    return f"svc-{service}.nk"


@dataclass(frozen=True)
class ChartIdentities:
    """The public half of the chart's identities: what the server's users are rendered from."""

    bootstrap: str
    services: dict[str, str]
    admin: creds.Identity
    break_glass: str = ""  # the only identity that may change or delete streams; its seed stays offline

    def to_json(self) -> str:
        return json.dumps({"bootstrap": self.bootstrap, "services": self.services,
                           "admin": {"name": self.admin.name, "nkey": self.admin.public_key},
                           "break_glass": self.break_glass}, indent=2)

    @classmethod
    def from_json(cls, text: str, *, where: str) -> ChartIdentities:
        try:
            data = json.loads(text)
            admin = data["admin"]
            ids = cls(str(data["bootstrap"]), {str(k): str(v) for k, v in data["services"].items()},
                      creds.Identity(str(admin["name"]), str(admin["nkey"])), str(data.get("break_glass") or ""))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PermanentError(f"{where}: not an identities file written by `tau admin chart-credentials` "
                                 f"({exc!r}); re-run the command and re-apply its Secret") from exc
        unknown = sorted(set(ids.services) - set(permissions.SERVICE_ROLES))
        if unknown:
            raise PermanentError(f"{where}: services {unknown} have no entry in the permission table; "
                                 "regenerate with this version's `tau admin chart-credentials`")
        return ids

    @property
    def local_admin(self) -> str:
        """``TAU_LOCAL_ADMIN`` for the services and the bootstrap (``signers.Signers.local_user``)."""
        return f"{self.admin.name}:{self.admin.public_key}"


@dataclass(frozen=True)
class ChartSeeds:
    """The seeds in the operator's directory."""

    directory: Path
    bootstrap: creds.Identity
    services: dict[str, creds.Identity]
    admin: creds.Identity
    break_glass: creds.Identity
    anchor_signing: creds.Identity | None = None  # its public key is what `tau verify --anchor` trusts

    def public(self) -> ChartIdentities:
        return ChartIdentities(self.bootstrap.public_key,
                               {name: i.public_key for name, i in self.services.items()},
                               creds.Identity(self.admin.name, self.admin.public_key), self.break_glass.public_key)

    def text(self, filename: str) -> str:
        return (self.directory / filename).read_text()


def _ensure(path: Path, name: str) -> creds.Identity:
    if path.exists():
        return creds.load(path, name=name)
    identity = creds.new_identity(name)
    creds.write(path, identity, comment=f"taugrid bus credentials for {name} (tau admin chart-credentials)")
    return identity


def ensure_seeds(directory: Path, *, admin_name: str) -> ChartSeeds:
    """Create (once) and load every seed the chart needs. Existing seeds are kept, and so is the operator's
    name they were created for (``admin.name``)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    boot = _ensure(directory / "bootstrap.nk", permissions.BOOTSTRAP)
    services = {s: _ensure(directory / service_file(s), s) for s in CHART_SERVICES}
    name_file = directory / "admin.name"
    if not (directory / ADMIN_FILE).exists() or not name_file.exists():
        name_file.write_text(admin_name + "\n")
    admin = _ensure(directory / ADMIN_FILE, name_file.read_text().strip() or admin_name)
    glass = _ensure(directory / BREAK_GLASS_FILE, permissions.BREAK_GLASS)
    signing = _ensure(directory / ANCHOR_SIGNING_FILE, "anchor-signing")
    return ChartSeeds(directory, boot, services, admin, glass, signing)


def _secret(name: str, namespace: str, data: dict[str, str], component: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "taugrid",
                                    "app.kubernetes.io/component": component}},
            "stringData": data}


def manifests(seeds: ChartSeeds, *, namespace: str, secret: str, workspace_namespaces: Iterable[str],
              source_fetch_secret: str) -> list[dict[str, Any]]:
    """The Secrets the chart mounts: every service seed and the public identities in the release namespace; the
    source-fetch seed alone in each workspace namespace."""
    public = seeds.public()
    data = {"bootstrap.nk": seeds.text("bootstrap.nk")}
    data.update({service_file(s): seeds.text(service_file(s)) for s in CHART_SERVICES})
    if seeds.anchor_signing is not None:
        data[ANCHOR_SIGNING_FILE] = seeds.text(ANCHOR_SIGNING_FILE)
    data[IDENTITIES_KEY] = public.to_json()
    data[LOCAL_ADMIN_KEY] = public.local_admin
    out = [_secret(secret, namespace, data, "bus-credentials")]
    fetch = seeds.text(service_file("source_fetch"))
    for ns in dict.fromkeys(workspace_namespaces):
        out.append(_secret(source_fetch_secret, ns, {SOURCE_FETCH_KEY: fetch}, "source-fetch"))
    return out


class _Dumper(yaml.SafeDumper):
    """Multi-line values (the seed files) as literal blocks, readable as the files they are."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v,
                                                             style="|" if "\n" in v else None))


def dump(objs: list[dict[str, Any]]) -> str:
    return "".join("---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False) for o in objs)


def render_conf(ids: ChartIdentities, platform: Platform | None,
                leaves: Sequence[permissions.LeafUser] = ()) -> str:
    """The server's ``authorization`` block: the chart's identities plus the platform's people, and on a hub its
    sites' leaf users."""
    accounts = permissions.accounts(bootstrap_key=ids.bootstrap, service_keys=ids.services,
                                    people=auth.people(platform, local_admin=ids.admin),
                                    break_glass_key=ids.break_glass or None)
    return permissions.authorization_conf(accounts, leaves)


def render_site_conf(ids: ChartIdentities, cluster: str) -> str:
    """A site's leaf server's ``authorization`` block: the site's bootstrap identity (it provisions the site's
    streams) and the site's services (``SITE_SERVICES``), with their grants from the one table; nobody else."""
    if not re.fullmatch(NAME_PATTERN, cluster) or cluster == DISPATCH:
        raise PermanentError(f"site cluster {cluster!r}: not a cluster name (a-z, 0-9 and '-', up to 40, not "
                             f"{DISPATCH!r}); set site.cluster to the name platform.yaml's clusters give it")
    missing = [s for s in SITE_SERVICES if s not in ids.services]
    if missing:
        raise PermanentError(f"the site's identities have no keys for {missing}: write them with this version's "
                             "`tau admin chart-credentials --dir <the site's own directory>`")
    accounts = permissions.accounts(bootstrap_key=ids.bootstrap,
                                    service_keys={s: ids.services[s] for s in SITE_SERVICES}, people=(),
                                    site=cluster)  # its kube-bridge acts for the site (``permissions.site_grants``)
    return permissions.authorization_conf(accounts)


def load_leaves(path: Path) -> list[permissions.LeafUser]:
    """The hub's leaf users from ``leaves.json`` (``leaf`` writes it): each cluster's password and its site's
    ``kube_bridge`` public key, whose inbox is the only one the hub lets through that site's link."""
    try:
        data = json.loads(path.read_text())
        out = [permissions.LeafUser(str(name), str(entry["password"]), permissions.inbox_prefix(str(entry["key"])))
               for name, entry in sorted(data.items())]
    except OSError as exc:
        raise PermanentError(f"cannot read {path}: {exc.strerror or exc}; is clusters.leafSecret applied?") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PermanentError(f"{path}: not a leaves file written by `python -m taugrid.stack.chartauth leaf` "
                             f"({exc!r})") from exc
    for leaf in out:
        if not re.fullmatch(NAME_PATTERN, leaf.cluster) or leaf.cluster == DISPATCH:
            raise PermanentError(f"{path}: {leaf.cluster!r} is not a cluster name (a-z, 0-9 and '-', up to 40)")
        if len(leaf.password) < 16 or not re.fullmatch(r"[A-Za-z0-9_-]+", leaf.password):
            raise PermanentError(f"{path}: {leaf.cluster}'s password must be 16 or more of [A-Za-z0-9_-] (it goes "
                                 "into the site's leaf URL): write it with `chartauth leaf`")
    return out


def leaf_entry(leaves_file: Path | None, cluster: str, site_identities: ChartIdentities) -> tuple[str, str]:
    """``leaves.json`` with ``cluster``'s entry added (a password made once, kept when the entry exists; the
    site's ``kube_bridge`` key as given), and that password for the site's Secret."""
    data: dict[str, Any] = json.loads(leaves_file.read_text()) if leaves_file and leaves_file.exists() else {}
    password = str((data.get(cluster) or {}).get("password") or secrets.token_urlsafe(32))
    data[cluster] = {"password": password, "key": site_identities.services[SITE_SERVICES[0]]}
    return json.dumps(data, indent=2, sort_keys=True), password


def load_identities(path: Path) -> ChartIdentities:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PermanentError(f"cannot read {path}: {exc.strerror or exc}; is the credentials Secret "
                             "(tau admin chart-credentials) applied and mounted?") from exc
    return ChartIdentities.from_json(text, where=str(path))


def reload_server(pid_file: Path) -> bool:
    """SIGHUP the nats-server whose pid is in ``pid_file`` (same pod, shared process namespace)."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError) as exc:
        # Not started yet: it reads the rewritten file when it starts.
        log.warning("cannot signal nats-server (pid file %s): %s", pid_file, exc)
        return False
    return True


def _digest(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"-")
    return h.hexdigest()


class Syncer:
    """Keeps ``out`` equal to the users of the current platform (and, on a hub, of ``leaves_file``: a cluster's
    entry added to the Secret reaches the server when the kubelet updates the mounted file, no restart) and reloads
    the server when it changes."""

    def __init__(self, ids: ChartIdentities, *, out: Path, pid_file: Path, watch: Iterable[Path] = (),
                 leaves_file: Path | None = None) -> None:
        self.ids, self.out, self.pid_file, self.leaves_file = ids, out, pid_file, leaves_file
        self.leaves: tuple[permissions.LeafUser, ...] = tuple(load_leaves(leaves_file)) if leaves_file else ()
        self.leaves_digest = _digest([leaves_file] if leaves_file else [])
        self.platform: Platform | None = None
        self.watch = tuple(watch)
        self.files_digest = _digest(self.watch)
        self.revision = 0
        self.reloads = 0

    def conf(self) -> str:
        return render_conf(self.ids, self.platform, self.leaves)

    def apply(self, text: str, revision: int) -> None:
        from taugrid.config.platform import load_platform

        try:
            platform = load_platform(text, path=f"platform (KV revision {revision})")
        except ConfigError as exc:  # `tau platform apply` validates; never lock everyone out over a bad one
            log.error("platform revision %d is invalid, keeping the previous users: %s", revision, exc)
            return
        self.revision, self.platform = revision, platform
        if auth.write_conf(self.out, self.conf()):
            self._reload(f"bus users updated for platform revision {revision}")

    def check_files(self) -> None:
        if self.leaves_file is not None:
            leaves_digest = _digest([self.leaves_file])
            if leaves_digest != self.leaves_digest:
                self.leaves_digest = leaves_digest
                try:
                    self.leaves = tuple(load_leaves(self.leaves_file))
                except PermanentError as exc:  # never drop every site's link over a bad edit
                    log.error("%s; keeping the previous leaf users", exc)
                else:
                    if auth.write_conf(self.out, self.conf()):
                        self._reload("leaf users updated")
        digest = _digest(self.watch)
        if digest != self.files_digest:
            self.files_digest = digest
            self._reload("TLS files changed")

    def _reload(self, why: str) -> None:
        if reload_server(self.pid_file):
            self.reloads += 1
            log.info("%s; nats-server reloaded", why)

    async def follow(self, url: str, *, tick: float = 2.0, stop: asyncio.Event | None = None,
                     creds: Path | None = None, ca: Path | None = None) -> None:
        """Follow the platform until ``stop`` as ``creds`` (else ``TAU_NATS_CREDS``; the TLS ``ca`` else
        ``TAU_NATS_CA``); reconnects after any error (the server restarts, the bus is not bootstrapped yet)."""
        from taugrid.bus import connect, platformstore

        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                bus = await connect(url, name="auth-sync", creds=creds, ca=ca)
                try:
                    async for got in platformstore.follow_text(bus, tick=tick):
                        if got is not None and got[1] != self.revision:
                            self.apply(*got)
                        self.check_files()
                        if stop.is_set():
                            break
                finally:
                    await bus.close()
            except Exception as exc:  # noqa: BLE001 - keep following; the server or the bucket may come later
                log.warning("auth-sync: %r; retrying", exc)
                self.check_files()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=tick)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taugrid.stack.chartauth",
                                     description="The chart's NATS users: render once, or follow the platform.")
    parser.add_argument("command", choices=["render", "sync", "leaf"])
    parser.add_argument("--identities", type=Path, required=True,
                        help="identities.json from the Secret (leaf: the site's own)")
    parser.add_argument("--out", type=Path, required=True,
                        help="the auth.conf the server includes (leaf: the leaves.json to write)")
    parser.add_argument("--leaves", type=Path, help="a hub's leaves.json (clusters.leafSecret): its sites' leaf users")
    parser.add_argument("--site", metavar="CLUSTER", help="render a site's leaf server's users (site.enabled)")
    parser.add_argument("--cluster", help="leaf: the cluster whose entry to add to --out")
    parser.add_argument("--pid-file", type=Path, default=Path("/run/nats/nats.pid"))
    parser.add_argument("--watch", type=Path, action="append", default=[], help="reload when this file changes")
    try:
        given = settings.current()
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2
    parser.add_argument("--url", default=given.bus.url)
    args = parser.parse_args(argv)
    logging.basicConfig(level=given.process.log_level, format="%(asctime)s %(levelname)s %(message)s")
    try:
        ids = load_identities(args.identities)
    except PermanentError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        if args.command == "leaf":
            if not args.cluster:
                print("leaf needs --cluster", file=sys.stderr)
                return 2
            text, password = leaf_entry(args.out, args.cluster, ids)
            auth.write_conf(args.out, text + "\n")
            print(password)
            return 0
        if args.site:
            auth.write_conf(args.out, render_site_conf(ids, args.site))
            print(f"wrote {args.out}: site {args.site}: bootstrap, {', '.join(SITE_SERVICES)}")
            return 0
        leaves = load_leaves(args.leaves) if args.leaves else []
    except PermanentError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "render":
        auth.write_conf(args.out, render_conf(ids, None, leaves))
        print(f"wrote {args.out}: bootstrap, {len(ids.services)} services, admin {ids.admin.name}, "
              f"{len(leaves)} leaf users")
        return 0
    syncer = Syncer(ids, out=args.out, pid_file=args.pid_file, watch=args.watch, leaves_file=args.leaves)
    if not args.out.exists():
        auth.write_conf(args.out, syncer.conf())
    asyncio.run(syncer.follow(args.url))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
