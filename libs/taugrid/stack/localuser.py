"""The embedded stack's own person: an nkey seed in ``$TAU_DATA_DIR/creds/`` and its public key in the
platform bucket, so the submitter accepts this person's signed requests while the platform lists no users."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from taugrid.bus import identity, platformstore
from taugrid.bus.connection import Bus


def login_name() -> str:
    try:
        name = getpass.getuser()
    except OSError:
        name = "local"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name.lower()) or "local"


def ensure_seed(data_dir: Path) -> tuple[str, bytes]:
    """The local user's (name, seed) from ``creds/user.nk``, written 0600 when it does not exist yet."""
    path = data_dir / "creds" / identity.LOCAL_USER_FILE
    try:
        seed = identity.seed_in(path.read_bytes())
    except OSError:
        seed = None
    if seed:
        return login_name(), seed
    name, seed = login_name(), identity.new_user_seed()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(b"# taugrid credentials of " + name.encode() + b"; keep private\n" + seed + b"\n")
    return name, seed


async def ensure_local_user(bus: Bus, data_dir: Path) -> platformstore.LocalUser:
    name, seed = ensure_seed(data_dir)
    user = platformstore.LocalUser(name=name, nkey=identity.public_key(seed))
    await platformstore.put_local_user(bus, user)
    return user
