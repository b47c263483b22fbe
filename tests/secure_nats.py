"""A real nats-server with authentication on: a bootstrap identity, one user per service in the permission
table, and people whose users and workspaces a test can change (the server is reloaded, as ``tau up`` does)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from taugrid.access import permissions
from taugrid.bus import Bus, connect, creds, platformstore
from taugrid.bus.authors import publish_keys
from taugrid.bus.bootstrap import bootstrap
from taugrid.stack import natsserver

PEOPLE = [
    ("alice", "researcher", ("vision",)),
    ("bob", "researcher", ("language",)),
    ("carol", "platform-admin", ()),
]


@dataclass
class SecureNats:
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    identities: dict[str, creds.Identity] = field(default_factory=dict)
    people: list[permissions.Person] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def auth_conf(self) -> Path:
        return self.root / "auth.conf"

    def creds(self, name: str) -> Path:
        return self.root / "creds" / f"{name}.nk"

    def identity(self, name: str) -> creds.Identity:
        if name not in self.identities:
            self.identities[name] = creds.new_identity(name)
            creds.write(self.creds(name), self.identities[name])
        return self.identities[name]

    def person(self, name: str, role: str = "researcher", workspaces: Iterable[str] = ()) -> permissions.Person:
        return permissions.Person(name, self.identity(name).public_key, role, tuple(workspaces))

    def write_conf(self) -> None:
        accounts = permissions.accounts(
            bootstrap_key=self.identity("bootstrap").public_key,
            service_keys={svc: self.identity(svc).public_key for svc in permissions.SERVICE_ROLES},
            people=self.people,
            break_glass_key=self.identity("breakglass").public_key,
        )
        self.auth_conf.write_text(permissions.authorization_conf(accounts))

    def set_people(self, people: list[permissions.Person]) -> None:
        """Replace the people the server admits and reload it (no restart)."""
        self.people = people
        self.write_conf()
        assert self.proc is not None
        natsserver.reload(self.proc)

    def start(self) -> None:
        self.people = [self.person(n, r, w) for n, r, w in PEOPLE]
        self.write_conf()
        self.proc, self.port = natsserver.start(self.root / "nats", log_file=self.root / "nats.log",
                                                auth_conf=self.auth_conf)

    async def connect(self, name: str) -> Bus:
        return await connect(self.url, name=name, creds=self.creds(name), max_reconnect_attempts=0)

    async def bootstrap(self) -> None:
        bus = await self.connect("bootstrap")
        try:
            await bootstrap(bus)
            await publish_keys(bus, {svc: self.identity(svc).public_key for svc in permissions.SERVICE_ROLES})
        finally:
            await bus.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextlib.asynccontextmanager
async def started(root: Path, *, owner: str | None = None, platform: str | None = None) -> AsyncIterator[SecureNats]:
    """A ``SecureNats`` under ``root``, started and bootstrapped, stopped afterwards. ``owner``: the stack's own
    person (the local user ``tau up`` records) is this one of ``PEOPLE``; ``platform``: stored as the platform."""
    server = SecureNats(root)
    server.start()
    try:
        await server.bootstrap()
        if owner is not None or platform is not None:
            boot = await server.connect("bootstrap")
            try:
                if owner is not None:
                    await platformstore.put_local_user(
                        boot, platformstore.LocalUser(owner, server.identity(owner).public_key))
                if platform is not None:
                    await platformstore.put_text(boot, platform)
            finally:
                await boot.close()
        yield server
    finally:
        server.stop()
