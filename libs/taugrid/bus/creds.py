"""Bus credentials: NATS nkey user seeds, kept one per file, readable only by their owner.

A credentials file holds one user seed (``SU…``), optionally surrounded by comment lines, so the same file
works with ``nats --nkey FILE`` and any NATS client's nkey authenticator. Invariants: a seed never travels
on the bus and is never logged; files are written 0600 (the directory 0700) and replaced atomically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import nkeys

from taugrid.core.errors import PermanentError
from taugrid.core.identity import is_user_public_key

__all__ = ["CREDS_ENV", "Identity", "is_user_public_key", "load", "new_identity", "public_key_of",
           "read_seed", "write"]

CREDS_ENV = "TAU_NATS_CREDS"


@dataclass(frozen=True)
class Identity:
    """A bus user: its name (for people and files) and its nkey pair's public half."""

    name: str
    public_key: str
    seed: str = ""

    def keypair(self) -> nkeys.KeyPair:
        if not self.seed:
            raise PermanentError(f"identity {self.name!r} has no seed (only its public key is known)")
        return nkeys.from_seed(bytearray(self.seed.encode()))


def new_identity(name: str) -> Identity:
    """A fresh user nkey pair (ed25519) for ``name``."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
    return Identity(name=name, public_key=public_key_of(seed), seed=seed)


def public_key_of(seed: str) -> str:
    kp = nkeys.from_seed(bytearray(seed.encode()))
    try:
        return str(kp.public_key.decode())
    finally:
        kp.wipe()


def read_seed(path: Path) -> str:
    """The user seed in a credentials file; a clear error when the file is missing or holds no seed."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PermanentError(f"cannot read bus credentials {path}: {exc.strerror or exc}; "
                             f"fix the path in {CREDS_ENV} or run `tau login --creds FILE`") from exc
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("SU"):
            try:
                public_key_of(line)
            except (nkeys.NkeysError, ValueError) as exc:
                raise PermanentError(f"{path}: the user seed is corrupt ({exc}); ask for new credentials") from exc
            return line
    raise PermanentError(f"{path} holds no NATS user seed (a line starting with 'SU'); "
                         "it must be a file written by `tau admin user add` or `tau up`")


def load(path: Path, *, name: str = "") -> Identity:
    seed = read_seed(path)
    return Identity(name=name or path.stem, public_key=public_key_of(seed), seed=seed)


def write(path: Path, identity: Identity, *, comment: str = "") -> Path:
    """Write ``identity``'s seed to ``path`` with mode 0600 (directory 0700), atomically."""
    if not identity.seed:
        raise PermanentError(f"identity {identity.name!r} has no seed to write")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for line in (comment or f"taugrid bus credentials for {identity.name}; keep private").splitlines():
            fh.write(f"# {line}\n")
        fh.write(f"# public key: {identity.public_key}\n{identity.seed}\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path

