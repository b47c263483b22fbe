"""Who is acting: the person's signing key on the client side, the run's verified submitter on the service side.

Client side: ``load_user_seed`` finds the nkey seed a person signs requests with (``envelope.sign_headers``).
Service side: while a consumer handles an event that a service published for a run, ``run_user`` holds that
run's verified submitter (from the event's ``ce-tauuser``), so every event emitted in the handler carries it
on without each handler passing it along. The value is only ever taken from service-published events whose
``ce-source`` passed the permission check (``consumer``), never from a person's request.
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path

import nkeys

from taugrid import settings

_SEED = re.compile(rb"SU[A-Z2-7]{56}")
LOCAL_USER_FILE = "user.nk"  # the person who ran `tau up`, under $TAU_DATA_DIR/creds/
_NOT_PEOPLE = ("bootstrap.", "svc-")  # the stack's own identities in the same directory

# (run id, verified user) of the event being handled in this task, if a service published it.
run_user: ContextVar[tuple[str, str] | None] = ContextVar("taugrid_run_user", default=None)


def data_dir() -> Path:
    return settings.data_dir()


def seed_in(text: bytes) -> bytes | None:
    """The first user nkey seed in a seed file or a ``.creds`` file (``-----BEGIN USER NKEY SEED-----``)."""
    m = _SEED.search(text)
    return m.group(0) if m else None


def load_user_seed() -> bytes | None:
    """The seed this person signs with: ``TAU_NKEY_SEED``, else the file ``TAU_NKEY_FILE``, else the bus
    credentials file ``TAU_NATS_CREDS``, else ``$TAU_DATA_DIR/creds/user.nk`` (the local user ``tau up``
    created), else another ``*.nk``/``*.creds`` file there that is not a service's or the bootstrap's.
    None when there is none."""
    given = settings.current()
    if given.identity.nkey_seed:
        return seed_in(given.identity.nkey_seed.encode())
    candidates = [p for p in (given.identity.nkey_file, given.bus.creds) if p is not None]
    creds = data_dir() / "creds"
    if creds.is_dir():
        candidates.append(creds / LOCAL_USER_FILE)
        candidates += [p for p in sorted(creds.glob("*.nk")) + sorted(creds.glob("*.creds"))
                       if not p.name.startswith(_NOT_PEOPLE)]
    for path in candidates:
        try:
            seed = seed_in(path.read_bytes())
        except OSError:
            continue
        if seed:
            return seed
    return None


def new_user_seed() -> bytes:
    """A fresh user nkey seed (``SU…``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    return str(nkeys.from_seed(seed).public_key.decode())
