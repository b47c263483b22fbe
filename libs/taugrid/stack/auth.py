"""The embedded stack's identities: a bootstrap identity, one user per service, the person who ran ``tau up``,
and the platform's people, rendered into nats-server's ``auth.conf``.

Layout under ``$TAU_DATA_DIR/creds/`` (directory 0700, every file 0600): ``bootstrap.nk``, ``svc-<service>.nk``,
``user.nk`` (the local person, platform admin; what the CLI and ``taugrid.client`` use by default), ``anchor.nk``
(the audit anchors' signing key, not a bus identity) and ``.breakglass-issued``, the public key of the break-glass
identity, whose seed ``tau up`` writes outside the data dir (``stack.operator``): the stack admits it, never holds
it. Seeds are created once and kept across restarts, so running services and the person's CLI keep working. The server's
``auth.conf`` is regenerated from the platform's users on every platform revision and applied with a reload, so
adding or removing a person never restarts anything.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from taugrid.access import permissions
from taugrid.bus import creds
from taugrid.config.platform import Platform

LOCAL_ADMIN_ENV = "TAU_LOCAL_ADMIN"  # "<name>:<public key>" of the person who ran `tau up`, for services


@dataclass(frozen=True)
class StackIdentities:
    creds_dir: Path
    bootstrap: creds.Identity
    services: dict[str, creds.Identity]
    person: creds.Identity
    break_glass: creds.Identity | None = None

    def service_creds(self, service: str) -> Path:
        return self.creds_dir / f"svc-{service}.nk"

    @property
    def bootstrap_creds(self) -> Path:
        return self.creds_dir / "bootstrap.nk"

    @property
    def person_creds(self) -> Path:
        return self.creds_dir / "user.nk"

    @property
    def local_admin(self) -> str:
        return f"{self.person.name}:{self.person.public_key}"


def local_person_name() -> str:
    try:
        return getpass.getuser()
    except OSError:
        return "local"


def _ensure(path: Path, name: str) -> creds.Identity:
    if path.exists():
        return creds.load(path, name=name)
    identity = creds.new_identity(name)
    creds.write(path, identity, comment=f"taugrid bus credentials for {name}; keep private")
    return identity


def ensure_key(path: Path, name: str) -> creds.Identity:
    """A key kept in ``path`` (0600), created once."""
    return _ensure(path, name)


def ensure_identities(creds_dir: Path, services: list[str]) -> StackIdentities:
    """Create (once) and load the stack's seeds."""
    creds_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(creds_dir, 0o700)
    boot = _ensure(creds_dir / "bootstrap.nk", permissions.BOOTSTRAP)
    svc = {s: _ensure(creds_dir / f"svc-{s}.nk", s) for s in services}
    person = _ensure(creds_dir / "user.nk", local_person_name())
    # the only identity that may change or delete streams: admitted by its public key, its seed never here (a
    # seed an older `tau up` left in creds/ is still admitted until `tau up` moves it out: stack.operator)
    issued, legacy = creds_dir / ".breakglass-issued", creds_dir / "breakglass.nk"
    glass = None
    if issued.exists():
        glass = creds.Identity(name=permissions.BREAK_GLASS, public_key=issued.read_text().strip())
    elif legacy.exists():
        glass = creds.Identity(name=permissions.BREAK_GLASS, public_key=creds.load(legacy).public_key)
    return StackIdentities(creds_dir, boot, svc, person, glass)


def people(platform: Platform | None, *, local_admin: creds.Identity | None) -> list[permissions.Person]:
    """The people the bus admits: the platform's users with their workspaces, plus the local admin (the
    machine's owner, platform admin whatever the platform says, so adding a colleague never locks them out)."""
    out: list[permissions.Person] = []
    if local_admin is not None:
        out.append(permissions.Person(local_admin.name, local_admin.public_key, "platform-admin"))
    for user in platform.users if platform else []:
        if local_admin is not None and user.nkey == local_admin.public_key:
            continue
        out.append(permissions.Person(user.name, user.nkey, user.role, tuple(platform.workspaces_of(user.name))
                                      if platform else ()))
    return out


def render(ids: StackIdentities, platform: Platform | None,
           leaves: Sequence[permissions.LeafUser] = ()) -> str:
    """The hub's users: the stack's identities, the platform's people, and the leaf node of each site the stack
    runs (``stack.sites``)."""
    accounts = permissions.accounts(
        bootstrap_key=ids.bootstrap.public_key,
        service_keys={name: i.public_key for name, i in ids.services.items()},
        people=people(platform, local_admin=ids.person),
        break_glass_key=ids.break_glass.public_key if ids.break_glass else None,
    )
    return permissions.authorization_conf(accounts, leaves)


def write_conf(path: Path, text: str) -> bool:
    """Write ``auth.conf`` atomically (0600); ``True`` when it changed."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)
    return True
