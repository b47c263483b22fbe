"""The sites of a many-cluster stack: ``tau up`` with a platform that names ``clusters`` (docs §13d).

The stack's own server becomes the hub (JetStream domain ``hub``, a leafnode listener on loopback); each cluster
gets a leaf nats-server of its own (domain = the cluster's name, store and log under ``<data dir>/sites/<name>``),
linked to the hub with the deny lists of ``bus.sites`` and a leaf user of its own on the hub
(``permissions.leaf_permissions``: its own requests, its own lease, nothing else), and a local cluster process
(``TAU_SITE``) reading its requests from its own ``SITE_IN``. Both sides of each link are provisioned here
(``sites.provision_site``/``provision_hub``) and the hub's platform is copied into each site's ``platform`` bucket
(the site admits by it), at start and on every platform revision.

Invariants: a site's server admits only the stack's bootstrap identity and that site's local cluster, whose key is
the site's own (``creds/svc-local_cluster-<name>.nk``: its replies across the link come to an inbox of its own,
which no other site's leaf user may receive, and no other site's local cluster may connect there); a leaf
password is made once (``creds/leaf-<name>.pw``, 0600) and kept across restarts; nothing here decides where a run
goes (the dispatcher does). What ``tau up`` cannot run is refused before anything starts (``refusal``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from taugrid.access.permissions import LeafUser, inbox_prefix
from taugrid.bus import creds
from taugrid.bus import sites as bus_sites
from taugrid.config.clusters import DISPATCH
from taugrid.config.platform import Platform
from taugrid.ports import free_port
from taugrid.stack import natsserver
from taugrid.stack.auth import StackIdentities, ensure_key, write_conf
from taugrid.stack.natsserver import Leaf

if TYPE_CHECKING:
    from taugrid.bus.connection import Bus

log = logging.getLogger("taugrid.stack")


def refusal(platform: Platform | None, *, ha: bool) -> str | None:
    """Why this stack cannot run the platform's clusters, with the fix; None when it can (or names none)."""
    if platform is None or not platform.clusters:
        return None
    kube = [c.name for c in platform.clusters if c.backend != "local"]
    if kube:
        return (f"platform.yaml names Kubernetes clusters ({', '.join(kube)}): `tau up` runs local clusters only "
                "(a Kubernetes cluster's site runs its kube-bridge against its own leaf node, not started here); "
                "declare them with backend: local, or remove them")
    if ha:
        return ("platform.yaml names clusters, which `tau up --ha` does not run (the hub would be a JetStream "
                "cluster): start without --ha, or remove clusters")
    return None


def names(platform: Platform | None) -> list[str]:
    """The sites a stack runs for ``platform``, in the file's order."""
    return [c.name for c in platform.clusters] if platform is not None else []


@dataclass
class SiteServer:
    """One site's leaf server: where it stores, its client port (kept across its restarts), its process."""

    name: str
    root: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        """The site's local cluster's own data dir (its workloads' files): never the hub's."""
        return self.root / "data"


@dataclass
class Sites:
    data_dir: Path
    ids: StackIdentities
    cluster_names: list[str]
    leaf_port: int = field(default_factory=free_port)
    servers: dict[str, SiteServer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.cluster_names:
            self.servers.setdefault(name, SiteServer(name, self.data_dir / "sites" / name))

    @property
    def hub_leaf(self) -> Leaf:
        """The hub's side: its domain and the loopback port its leaf nodes connect to."""
        return Leaf(bus_sites.HUB_DOMAIN, listen_port=self.leaf_port)

    def leaf_users(self) -> list[LeafUser]:
        return [self._user(name) for name in self.cluster_names]

    def _user(self, name: str) -> LeafUser:
        return LeafUser(name, self._password(name), inbox_prefix(self.local_cluster(name).public_key))

    def local_cluster_creds(self, name: str) -> Path:
        return self.ids.creds_dir / f"svc-local_cluster-{name}.nk"

    def local_cluster(self, name: str) -> creds.Identity:
        """Site ``name``'s local cluster's identity, made once: each site's own, so that the replies the hub sends
        across one site's link (to ``_INBOX.<its key>``) are let through no other site's."""
        return ensure_key(self.local_cluster_creds(name), "local_cluster")

    def _password(self, name: str) -> str:
        path = self.ids.creds_dir / f"leaf-{name}.pw"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(32))
            return path.read_text().strip()

    def _auth_conf(self, server: SiteServer) -> Path:
        """A site's server admits the bootstrap identity (it provisions the site) and its own local cluster."""
        users = [{"nkey": self.ids.bootstrap.public_key}, {"nkey": self.local_cluster(server.name).public_key}]
        path = server.root / "auth.conf"
        write_conf(path, "authorization {\n  users = [\n" + "".join(f"    {json.dumps(u)}\n" for u in users)
                   + "  ]\n}\n")
        return path

    def _leaf(self, name: str) -> Leaf:
        user = self._user(name)
        return Leaf(name, hub_url=f"nats-leaf://{user.user}:{user.password}@127.0.0.1:{self.leaf_port}",
                    deny_exports=bus_sites.SITE_DENY_EXPORTS, deny_imports=bus_sites.SITE_DENY_IMPORTS)

    def _start(self, server: SiteServer) -> None:
        server.proc, server.port = natsserver.start(
            server.root / "nats", port=server.port or None, log_file=server.root / "nats.log",
            auth_conf=self._auth_conf(server), leaf=self._leaf(server.name))

    def start(self) -> None:
        for server in self.servers.values():
            server.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._start(server)
            log.info("site %s: leaf nats-server on port %d, linked to the hub's port %d", server.name, server.port,
                     self.leaf_port)

    def restart_dead(self) -> list[str]:
        """Start again, on its port and store, every site server that exited; the sites restarted."""
        dead = [s for s in self.servers.values() if s.proc is not None and s.proc.poll() is not None]
        for server in dead:
            self._start(server)
        return [s.name for s in dead]

    def stop(self, *, timeout: float = 10.0) -> None:
        for server in self.servers.values():
            if server.proc is not None and server.proc.poll() is None:
                server.proc.terminate()
        for server in self.servers.values():
            if server.proc is not None:
                try:
                    server.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
                    server.proc.wait()

    def state(self) -> list[dict[str, object]]:
        """What ``stack.json`` says of each site."""
        return [{"name": s.name, "nats_url": s.url, "nats_pid": s.proc.pid if s.proc else None,
                 "leaf_port": self.leaf_port} for s in self.servers.values()]

    async def provision(self, hub_url: str, platform_text: str) -> None:
        """Both sides of every link (streams, the dispatcher's and the local clusters' durables, the lease
        bucket), and the platform copied to every site."""
        from taugrid.bus.connection import connect

        hub = await connect(hub_url, name="supervisor-sites", creds=self.ids.bootstrap_creds)
        try:
            for server in self.servers.values():
                await bus_sites.provision_feed(hub, server.name)  # before the site's SITE_IN sources it
                site = await connect(server.url, name="supervisor-site", creds=self.ids.bootstrap_creds)
                try:
                    # the hub's services' keys: the site checks who sent each request it acts on
                    await bus_sites.provision_site(site, server.name, service_keys={
                        name: identity.public_key for name, identity in self.ids.services.items()})
                    await _put_platform(site, platform_text)
                finally:
                    await site.close()
                await bus_sites.provision_hub(hub, server.name)
        finally:
            await hub.close()

    async def push_platform(self, platform_text: str) -> None:
        """A new platform revision, copied to every site (a site unreachable now gets it at the next one or at
        the next start)."""
        from taugrid.bus.connection import connect

        for server in self.servers.values():
            try:
                site = await connect(server.url, name="supervisor-site", creds=self.ids.bootstrap_creds)
            except Exception as exc:  # noqa: BLE001 - one site down must not keep the others behind
                log.warning("site %s: platform not copied (%r)", server.name, exc)
                continue
            try:
                await _put_platform(site, platform_text)
            finally:
                await site.close()


def service_env(stack_sites: Sites, service: str, site: str) -> dict[str, str]:
    """What a service of a many-cluster stack is told besides the usual: the renderer sends every run to the
    dispatcher (``backend.dispatch.*``); a site's local cluster runs against its site's server as that cluster,
    its pods simulated (a site has no object store of sources, docs §16), its files in the site's own data dir, its
    key the site's own (``Sites.local_cluster``)."""
    if service == "renderer":
        return {"TAU_CLUSTER": DISPATCH}
    if service == "local_cluster" and site:
        server = stack_sites.servers[site]
        server.data_dir.mkdir(parents=True, exist_ok=True)
        return {"TAU_NATS_URL": server.url, "TAU_SITE": "on", "TAU_CLUSTER": site, "TAU_LOCAL_SIMULATE": "on",
                "TAU_DATA_DIR": str(server.data_dir), "TAU_NODE_NAME": f"{site}-node",
                "TAU_NATS_CREDS": str(stack_sites.local_cluster_creds(site))}
    return {}


async def _put_platform(site: Bus, text: str) -> None:
    from taugrid.bus.platformstore import get_text, put_text

    got = await get_text(site)
    if got is None or got[0] != text:
        await put_text(site, text)
