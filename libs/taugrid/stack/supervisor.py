"""The embedded stack's supervisor: a private nats-server, the bus bootstrap, a default platform, and every
service as its own OS process, each restarted (with backoff) when it dies.

Authentication is always on: every service connects with its own nkey user (least privilege, see
``taugrid.access.permissions``), the person who ran ``tau up`` gets platform-admin credentials in
``creds/user.nk`` (found by the CLI and ``taugrid.client`` through ``stack.json``), and a watcher of the platform KV
rewrites the server's users and reloads it whenever the platform's people change (``tau admin user add|remove``).

With ``--ha`` the bus is a JetStream cluster of three nats-servers on loopback (``natsserver.Cluster``), every
stream, bucket and object store held by all three (replicas 3), and services given every server's URL: any one
server may die (the supervisor restarts it on its ports and store) while runs go on.

``python -m taugrid.stack.supervisor --data-dir D [--scale renderer=2] [--ha]`` runs in the foreground; ``tau up``
starts it detached and waits for ``D/stack.json`` to say ``ready``. SIGTERM stops services first (so they
drain), then the server. Replica counts change live through the control file ``D/scale.json``
(``stack/scaling.py``, written by ``tau scale``): new replicas start, surplus ones get SIGTERM and drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from taugrid.local import runas
from taugrid.ports import free_port, port_free
from taugrid.settings import Settings, SettingsError, current
from taugrid.stack import LAST_STATE, auth, natsserver, scaling, sites
from taugrid.stack.machine_platform import machine_platform_yaml
from taugrid.stack.natsserver import without_secrets
from taugrid.stack.scaling import SERVICES, SINGLETONS

if TYPE_CHECKING:
    from taugrid.bus.connection import Bus

log = logging.getLogger("taugrid.stack")
RETIRE_GRACE_S = 15.0  # a surplus replica drains for this long after SIGTERM, then gets SIGKILL


PORTAL_PORT_ENV = "TAU_PORTAL_PORT"  # the web portal's port; a free one when unset
METRICS_BASE_ENV = "TAU_METRICS_BASE_PORT"
METRICS_PORT_ENV = "TAU_METRICS_PORT"


def metrics_port(service: str, replica: int, base: int | None) -> int | None:
    """The /metrics port of one replica when ``tau up`` ran with TAU_METRICS_BASE_PORT (``base``; 32 ports per
    service, the most replicas a service may have on one machine), else None: metrics stay off."""
    return base + 32 * SERVICES.index(service) + replica if base is not None else None


@dataclass
class Proc:
    service: str
    replica: int
    site: str = ""  # a site's local cluster (many clusters): the site's name
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started: float = 0.0


@dataclass
class Stack:
    data_dir: Path
    scale: dict[str, int]
    port: int = 0
    nats: subprocess.Popen[bytes] | None = None
    procs: list[Proc] = field(default_factory=list)
    stopping: bool = False
    retiring: list[tuple[Proc, float]] = field(default_factory=list)  # (surplus replica, SIGKILL deadline)
    scale_request: int = 0  # the last control-file request applied
    control_mtime: int = 0
    ids: auth.StackIdentities | None = None
    platform_revision: int = 0
    portal_port: int = 0  # every portal replica listens here (SO_REUSEPORT)
    cluster: natsserver.Cluster | None = None  # --ha: three servers; ``nats`` is then the first one's process
    run_as: runas.Decision | None = None  # which OS user runs the pods (``taugrid.local.runas``), and why
    settings: Settings = field(default_factory=current)  # `tau up`'s own, read once
    platform_file: Path | None = None  # `tau up --platform FILE`: the platform a new data dir starts with
    platform_text: str = ""  # the platform read at start
    sites: sites.Sites | None = None  # the platform names clusters: the hub's leaf sites (stack/sites.py)

    @property
    def servers(self) -> list[subprocess.Popen[bytes]]:
        if self.cluster is not None:
            return self.cluster.procs
        return [self.nats] if self.nats is not None else []

    @property
    def auth_conf(self) -> Path:
        return self.data_dir / "nats" / "auth.conf"

    def apply_people(self, platform_text: str | None, revision: int) -> None:
        """Rewrite the server's users for this platform revision and reload the server if they changed."""
        from taugrid.config.platform import load_platform
        from taugrid.core.errors import ConfigError

        assert self.ids is not None
        try:
            platform = load_platform(platform_text, path="platform (KV)") if platform_text else None
        except ConfigError as exc:  # `tau platform apply` validates; never lock everyone out over a bad revision
            log.error("platform revision %d is invalid, keeping the previous users: %s", revision, exc)
            return
        leaves = self.sites.leaf_users() if self.sites is not None else ()
        changed = auth.write_conf(self.auth_conf, auth.render(self.ids, platform, leaves))
        self.platform_revision = revision
        if changed:
            for server in self.servers:
                if server.poll() is None:
                    natsserver.reload(server)
            log.info("bus users updated for platform revision %d; nats-server reloaded", revision)

    @property
    def url(self) -> str:
        return self.cluster.url if self.cluster is not None else f"nats://127.0.0.1:{self.port}"

    def metrics_port(self, p: Proc) -> int | None:
        return metrics_port(p.service, p.replica, self.settings.metrics.base_port)

    def state_file(self) -> Path:
        return self.data_dir / "stack.json"

    def write_state(self, phase: str) -> None:
        state = {
            "phase": phase, "pid": os.getpid(), "nats_url": self.url, "nats_pid": self.nats.pid if self.nats else None,
            "ha": self.cluster is not None, "nats_pids": [p.pid for p in self.servers],
            "data_dir": str(self.data_dir), "updated": time.time(), "scale_request": self.scale_request,
            "replicas": {svc: sum(1 for p in self.procs if p.service == svc) for svc in SERVICES},
            "retiring": [{"service": p.service, "replica": p.replica, "pid": p.popen.pid}
                         for p, _ in self.retiring if p.popen is not None],
            "user_creds": str(self.ids.person_creds) if self.ids else None,
            "sites": self.sites.state() if self.sites is not None else [],
            "platform_revision": self.platform_revision,
            "run_as": ({"mode": self.run_as.mode, "why": self.run_as.why, "note": self.run_as.note}
                       if self.run_as else None),
            "portal": {"url": f"http://127.0.0.1:{self.portal_port}",
                       "key": self.ids.services["portal"].public_key if self.ids else None},
            "services": [{"service": p.service, "replica": p.replica,
                          "pid": p.popen.pid if p.popen and p.popen.poll() is None else None,
                          "restarts": p.restarts, "metrics_port": self.metrics_port(p)}
                         for p in self.procs],
        }
        tmp = self.state_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file())

    def spawn(self, p: Proc) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{p.service}-{p.site or p.replica}.log", "ab")  # noqa: SIM115 - owned by the child
        assert self.ids is not None
        env = {**without_secrets(os.environ), "TAU_NATS_URL": self.url, "TAU_DATA_DIR": str(self.data_dir),
               "TAU_REPLICA": str(p.replica), "TAU_NATS_CREDS": str(self.ids.service_creds(p.service)),
               auth.LOCAL_ADMIN_ENV: self.ids.local_admin,
               scaling.READY_FILE_ENV: str(scaling.ready_file(self.data_dir, p.service, p.replica))}
        if self.sites is not None:
            env.update(sites.service_env(self.sites, p.service, p.site))
        port = self.metrics_port(p)
        if port is not None:
            env[METRICS_PORT_ENV] = str(port)
        if p.service == "portal":
            env[PORTAL_PORT_ENV] = str(self.portal_port)
        p.popen = subprocess.Popen([sys.executable, "-m", f"taugrid_services.{p.service}"], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        p.started = time.time()
        if p.service in scaling.BACKGROUND:  # after the run's path, for the CPU (see scaling.BACKGROUND)
            os.setpriority(os.PRIO_PROCESS, p.popen.pid,
                           os.getpriority(os.PRIO_PROCESS, 0) + scaling.BACKGROUND_NICENESS)
        log.info("started %s[%d]%s pid %d", p.service, p.replica, f" at site {p.site}" if p.site else "",
                 p.popen.pid)


async def _prepare(stack: Stack) -> None:
    from taugrid.bus.authors import publish_keys
    from taugrid.bus.bootstrap import bootstrap
    from taugrid.bus.connection import connect
    from taugrid.bus.platformstore import get_text, put_text
    from taugrid.stack.localuser import ensure_local_user

    assert stack.ids is not None
    bus = await connect(stack.url, name="supervisor", creds=stack.ids.bootstrap_creds)
    try:
        if stack.cluster is None:
            await bootstrap(bus, replicas=1)
        else:
            await _bootstrap_cluster(bus, replicas=stack.cluster.size)
        await publish_keys(bus, {name: i.public_key for name, i in stack.ids.services.items()})
        await ensure_local_user(bus, stack.data_dir)
        if stack.platform_file is not None:
            await _seed_platform(bus, stack.platform_file)
        if await get_text(bus) is None:
            await put_text(bus, machine_platform_yaml(stack.data_dir))
        got = await get_text(bus)
        stack.platform_text = got[0] if got else ""
        stack.apply_people(*(got or (None, 0)))
    finally:
        await bus.close()


async def _seed_platform(bus: Bus, path: Path) -> None:
    """``tau up --platform FILE``: the platform of a new data dir. A data dir that has one keeps it (a change goes
    through ``tau platform apply``, with its diff and checks); the same text again is fine."""
    from taugrid.bus.platformstore import get_text, put_text
    from taugrid.config.platform import load_platform
    from taugrid.core.errors import ConfigError

    try:
        text = path.read_text()
        load_platform(text, path=str(path))
    except (OSError, ConfigError) as exc:
        raise SystemExit(f"--platform {path}: {exc}") from None
    got = await get_text(bus)
    if got is None:
        await put_text(bus, text)
    elif got[0] != text:
        raise SystemExit(f"--platform {path}: this data dir already has a platform (revision {got[1]}); change it "
                         f"with `tau platform apply {path}` (then `tau down` and `tau up` if it changes clusters), "
                         "or start without --platform")


async def _bootstrap_cluster(bus: Bus, *, replicas: int, timeout: float = 120.0) -> None:
    """Bootstrap once the cluster answers: its servers elect a JetStream meta leader first (seconds; longer on a
    loaded machine), and until then stream requests fail or time out."""
    from taugrid.bus.bootstrap import bootstrap

    deadline = time.monotonic() + timeout
    while True:
        try:
            await bootstrap(bus, replicas=replicas)
            return
        except Exception as exc:  # noqa: BLE001 - JetStream not ready yet: 503s, timeouts, no responders
            if time.monotonic() > deadline:
                raise
            log.info("JetStream cluster not ready yet (%r); retrying", exc)
            await asyncio.sleep(1.0)


def _start_hub(stack: Stack) -> None:
    """The single server, on its port and store; with sites, as their hub (domain ``hub``, leafnode listener)."""
    stack.nats, stack.port = natsserver.start(stack.data_dir / "nats", log_file=stack.data_dir / "nats.log",
                                              port=stack.port or None, auth_conf=stack.auth_conf,
                                              leaf=stack.sites.hub_leaf if stack.sites is not None else None)


def _start_sites(stack: Stack) -> None:
    """When the platform names clusters: the server restarted as their hub with a leaf user per site, a leaf
    server per site, both sides of each link provisioned (stack/sites.py). Refused (the stack does not start)
    for what ``tau up`` cannot run."""
    from taugrid.config.platform import load_platform

    assert stack.ids is not None and stack.nats is not None
    platform = load_platform(stack.platform_text, path="platform (KV)") if stack.platform_text else None
    problem = sites.refusal(platform, ha=stack.cluster is not None)
    if problem:
        shutdown(stack)
        raise SystemExit(problem)
    names = sites.names(platform)
    if not names:
        return
    stack.sites = sites.Sites(stack.data_dir, stack.ids, names)
    stack.apply_people(stack.platform_text, stack.platform_revision)  # the leaf users, before the hub restarts
    stack.nats.terminate()
    stack.nats.wait(timeout=15)
    _start_hub(stack)
    stack.sites.start()
    asyncio.run(stack.sites.provision(stack.url, stack.platform_text))
    log.info("many clusters: the hub and %d sites (%s) are up", len(names), ", ".join(names))


def _watch_platform(stack: Stack) -> None:
    """Follow the platform KV (in a thread) and keep the server's users in step with every revision."""
    from taugrid.bus import kv
    from taugrid.bus.connection import connect
    from taugrid.bus.platformstore import KEY

    async def watch() -> None:
        assert stack.ids is not None
        while not stack.stopping:
            try:
                bus = await connect(stack.url, name="supervisor-users", creds=stack.ids.bootstrap_creds)
                async for entry in kv.updates(bus, "platform", KEY, idle=1.0):
                    if stack.stopping:
                        break
                    if entry is not None and entry.revision != stack.platform_revision:
                        stack.apply_people(entry.value.decode(), entry.revision)
                        if stack.sites is not None:
                            await stack.sites.push_platform(entry.value.decode())
            except Exception as exc:  # noqa: BLE001 - keep following; a restarting server must not stop this
                log.warning("platform watcher: %r; retrying", exc)
                await asyncio.sleep(1.0)

    threading.Thread(target=lambda: asyncio.run(watch()), name="platform-users", daemon=True).start()


def anchor_file(data_dir: Path) -> Path:
    return data_dir / "anchors" / "ledger.jsonl"


def _export_anchors(stack: Stack) -> None:
    """Every ``TAU_ANCHOR_INTERVAL_S`` (default 60 s), sign the ledger heads and AUDIT's position with the
    anchor key (``creds/anchor.nk``, not a bus identity) and append them to ``anchors/ledger.jsonl``, outside
    the bus; AUDIT's settings are re-checked each time and a change is logged as an ALARM."""
    from taugrid.bus.connection import connect
    from taugrid.evidence import anchor

    key_path = stack.data_dir / "creds" / "anchor.nk"
    key = auth.ensure_key(key_path, "anchor")

    exporter = anchor.Exporter(anchor_file(stack.data_dir), bytearray(key.seed.encode()))

    async def loop() -> None:
        assert stack.ids is not None
        while not stack.stopping:
            try:
                bus = await connect(stack.url, name="supervisor-anchor", creds=stack.ids.bootstrap_creds)
                try:
                    _, drift = await exporter.export(bus)
                finally:
                    await bus.close()
                for d in drift:
                    log.error("ALARM: AUDIT %s", d)
            except Exception as exc:  # noqa: BLE001 - keep anchoring; a restarting server must not stop this
                log.warning("anchor export: %r; retrying", exc)
            await asyncio.sleep(stack.settings.anchor.interval_s)

    threading.Thread(target=lambda: asyncio.run(loop()), name="anchors", daemon=True).start()


def _decide_run_as(stack: Stack) -> None:
    """Which OS user the pods run as (``runas.decide``), handed to the services through ``TAU_RUN_AS``; runs as
    per-workspace users find the data dir traverse-only and its keys, secrets and store closed."""
    decision = runas.decide(stack.data_dir)
    if decision.refused:
        raise SystemExit(decision.refused)
    os.environ[runas.ENV] = decision.mode
    stack.run_as = decision
    if decision.mode == runas.STACK:
        log.warning("runs run as the stack's own OS user and can read its keys, every workspace's secrets and "
                    "other runs' environments: %s", decision.why)


def last_ports(state_file: Path) -> tuple[int | None, int | None]:
    """The bus's and the portal's ports the last stack of this data dir listened on (its ``stack.json``), each
    when it is free now: people who ran ``tau login --server URL`` or keep a portal link still reach the stack
    after ``tau down`` and ``tau up`` (a fresh free port each time broke every login). None: take a free one."""
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None, None
    found: list[int | None] = []
    for url in (state.get("nats_url"), (state.get("portal") or {}).get("url")):
        try:  # an HA stack's URL lists its servers: the first one's port is the one reused
            port = urlsplit(url.split(",", 1)[0]).port if isinstance(url, str) else None
        except ValueError:
            port = None
        found.append(port if port and port_free(port) else None)
    return found[0], found[1]


def run(stack: Stack) -> int:
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    _decide_run_as(stack)
    stack.ids = auth.ensure_identities(stack.data_dir / "creds", SERVICES)
    if not stack.auth_conf.exists():  # else keep the last users until the platform is read again
        auth.write_conf(stack.auth_conf, auth.render(stack.ids, None))
    last_bus, last_portal = last_ports(stack.data_dir / LAST_STATE)
    first_port = stack.settings.stack.nats_port or last_bus
    if stack.cluster is not None:
        stack.cluster.auth_conf = stack.auth_conf
        stack.cluster.start(first_port=first_port)
        stack.nats, stack.port = stack.cluster.procs[0], stack.cluster.nodes[0].port
    else:
        stack.port = first_port or 0
        _start_hub(stack)
    if stack.run_as is not None and stack.run_as.mode == runas.WORKSPACE:
        runas.close_data_dir(stack.data_dir)  # now that the server's store and log exist
    try:
        asyncio.run(_prepare(stack))
    except SystemExit:  # a --platform refused: nothing of this stack keeps running
        shutdown(stack)
        raise
    _start_sites(stack)
    stack.portal_port = stack.settings.portal.port or last_portal or free_port()
    scaling.control_path(stack.data_dir).unlink(missing_ok=True)  # a request from a previous stack is stale
    _watch_platform(stack)
    _export_anchors(stack)
    for svc in SERVICES:
        if stack.sites is not None and svc == "local_cluster":  # one per site instead of the hub's own
            stack.procs.extend(Proc(svc, i, site=name) for i, name in enumerate(stack.sites.cluster_names))
            continue
        if stack.sites is None and svc in scaling.SITES_ONLY:
            continue
        n = 1 if svc in SINGLETONS else max(1, stack.scale.get(svc, 1))
        stack.procs.extend(Proc(svc, i) for i in range(n))
    for p in stack.procs:
        stack.spawn(p)

    def on_signal(signum: int, _frame: object) -> None:
        stack.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stack.write_state("ready")
    while not stack.stopping:
        now = time.time()
        changed = apply_control(stack) | reap_retiring(stack, now)
        for p in stack.procs:
            if p.popen is not None and p.popen.poll() is not None:
                log.warning("%s[%d] exited with %s; restarting", p.service, p.replica, p.popen.returncode)
                # Back off only if it keeps dying right after start.
                quick = now - p.started < 5
                p.next_start = now + (min(10.0, 0.5 * 2 ** min(p.restarts, 5)) if quick else 0.2)
                p.restarts += 1
                p.popen = None
                changed = True
            if p.popen is None and now >= p.next_start:
                stack.spawn(p)
                changed = True
        if stack.cluster is not None:
            for node in stack.cluster.restart_dead():
                log.error("nats-server %s exited; restarted it on the same ports and store", node.route.server_name)
                changed = True
            stack.nats = stack.cluster.procs[0]
        elif stack.nats is not None and stack.nats.poll() is not None:
            log.error("nats-server exited; restarting it on the same port and store")
            _start_hub(stack)
            changed = True  # stack.json names the new server's pid
        if stack.sites is not None:
            for name in stack.sites.restart_dead():
                log.error("site %s's nats-server exited; restarted it on the same port and store", name)
                changed = True
        if changed:
            stack.write_state("ready")
        time.sleep(0.2)
    shutdown(stack)
    return 0


def apply_control(stack: Stack) -> bool:
    """Apply a new request in the control file, if any: start missing replicas, retire surplus ones (the
    highest replica numbers first). Returns whether anything changed."""
    path = scaling.control_path(stack.data_dir)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return False
    if mtime == stack.control_mtime:
        return False
    stack.control_mtime = mtime
    request, wanted, problems = scaling.read_request(path)
    for problem in problems:
        log.error("ignoring a scale request entry: %s", problem)
    if not request or request == stack.scale_request:
        return False
    for svc, n in wanted.items():
        current = sorted((p for p in stack.procs if p.service == svc), key=lambda p: p.replica)
        for replica in range(len(current), n):
            p = Proc(svc, replica)
            stack.procs.append(p)
            stack.spawn(p)
        for p in current[n:]:
            stack.procs.remove(p)
            if p.popen is not None and p.popen.poll() is None:
                p.popen.terminate()
                stack.retiring.append((p, time.time() + RETIRE_GRACE_S))
            log.info("retiring %s[%d]", p.service, p.replica)
        stack.scale[svc] = n
    stack.scale_request = request
    return True


def reap_retiring(stack: Stack, now: float) -> bool:
    """Forget surplus replicas that have exited; SIGKILL those still draining past their grace."""
    before = len(stack.retiring)
    kept = []
    for p, kill_at in stack.retiring:
        assert p.popen is not None
        if p.popen.poll() is not None:
            log.info("%s[%d] retired (exit %s)", p.service, p.replica, p.popen.returncode)
            continue
        if now >= kill_at:
            p.popen.kill()
        kept.append((p, kill_at))
    stack.retiring = kept
    return len(kept) != before


def shutdown(stack: Stack) -> None:
    stack.write_state("stopping")
    for p, _ in stack.retiring:
        if p.popen and p.popen.poll() is None:
            p.popen.kill()
    for p in stack.procs:
        if p.popen and p.popen.poll() is None:
            p.popen.terminate()
    deadline = time.time() + 15
    for p in stack.procs:
        if p.popen:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
    if stack.sites is not None:
        stack.sites.stop()
    if stack.cluster is not None:
        stack.cluster.stop()
    elif stack.nats and stack.nats.poll() is None:
        stack.nats.terminate()
        try:
            stack.nats.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stack.nats.kill()
    stack.write_state("stopped")


def parse_scale(items: list[str]) -> dict[str, int]:
    try:
        return scaling.parse_scale(items)
    except scaling.ScaleError as err:
        raise SystemExit(f"--scale {err}") from err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--scale", action="append", default=[])
    ap.add_argument("--ha", action="store_true", help="a 3-server JetStream cluster, every stream on all three")
    ap.add_argument("--platform", type=Path, default=None, help="the platform a new data dir starts with")
    args = ap.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s supervisor %(levelname)s %(message)s")
    try:
        given = current()
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None
    data_dir = args.data_dir.resolve()
    problem = natsserver.layout_problem(data_dir / "nats", ha=args.ha)
    if problem:
        raise SystemExit(problem)
    ha = args.ha or natsserver.is_cluster_store(data_dir / "nats")
    sys.exit(run(Stack(data_dir=data_dir, scale=parse_scale(args.scale),
                       cluster=natsserver.Cluster(data_dir / "nats") if ha else None, settings=given,
                       platform_file=args.platform.resolve() if args.platform else None)))


if __name__ == "__main__":
    main()
