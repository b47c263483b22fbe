"""The operator's own files, kept outside every data dir: each stack's break-glass key and its pinned anchor key.

The folder is ``$TAU_OPERATOR_DIR``, else ``$XDG_CONFIG_HOME/taugrid``, else ``~/.config/taugrid``; a stack's files
are in ``stacks/<id>/`` (0700), ``<id>`` a digest of its data dir's resolved path:

- ``breakglass.nk`` (0600, unless ``tau up --break-glass-file`` chose another place): the only identity that may
  change or delete streams. ``tau up`` writes it once, says where, and the stack keeps only its public key
  (``creds/.breakglass-issued``), so nothing that reads the data dir (a service, a run on a stack that is not
  root) finds the seed. A seed an older ``tau up`` left in ``creds/breakglass.nk`` is moved here.
- ``anchor.pub``: the public key the stack signs its audit anchors with (``creds/anchor.nk``), pinned by the first
  ``tau up``; ``tau verify --anchor`` refuses an anchor file signed by any other key. Pinned once: a stack that
  later signs with another key is reported, never re-pinned behind the operator's back.
- ``data-dir``: the data dir's path, for a person looking at the folder.

Nothing of the running stack reads this folder.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from taugrid import settings
from taugrid.access import permissions
from taugrid.bus import creds

OPERATOR_DIR_ENV = "TAU_OPERATOR_DIR"
BREAK_GLASS_FILE = "breakglass.nk"
ISSUED_FILE = ".breakglass-issued"  # in creds/: the break-glass public key the server keeps admitting
ANCHOR_KEY_FILE = "anchor.pub"


def operator_dir(environ: Mapping[str, str] | None = None) -> Path:
    given = settings.of(environ).data.operator_dir
    if given is not None:
        return given
    env = os.environ if environ is None else environ
    config = env.get("XDG_CONFIG_HOME", "").strip()  # the platform's own convention, not a taugrid setting
    return (Path(config).expanduser() if config else Path.home() / ".config") / "taugrid"


def stack_dir(data_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """This stack's folder in the operator's (not created)."""
    digest = hashlib.sha256(str(data_dir.expanduser().resolve()).encode()).hexdigest()[:16]
    return operator_dir(environ) / "stacks" / digest


def _private_dir(data_dir: Path) -> Path:
    d = stack_dir(data_dir)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    (d / "data-dir").write_text(f"{data_dir.expanduser().resolve()}\n")
    return d


@dataclass(frozen=True)
class BreakGlass:
    public_key: str
    path: Path | None  # where its seed was put (None: given out before; only its public key is known here)
    news: str = ""  # what happened now, for `tau up` to say ("" when nothing did)


def issue_break_glass(data_dir: Path, *, path: Path | None = None) -> BreakGlass:
    """Make sure the stack in ``data_dir`` has a break-glass identity whose seed is outside it: written to
    ``path`` (default ``stacks/<id>/breakglass.nk``) the first time, moved there from ``creds/`` if an older
    stack kept it there, and otherwise left wherever the operator has put it."""
    creds_dir = data_dir / "creds"
    issued, legacy = creds_dir / ISSUED_FILE, creds_dir / BREAK_GLASS_FILE
    dest = path.expanduser().absolute() if path else None
    if legacy.exists():
        identity = creds.load(legacy, name=permissions.BREAK_GLASS)
        dest = dest or _private_dir(data_dir) / BREAK_GLASS_FILE
        if not dest.exists():
            creds.write(dest, identity, comment=_comment(data_dir))
        elif creds.load(dest).public_key != identity.public_key:
            raise FileExistsError(f"{dest} holds another break-glass key than {legacy}: move one of them away")
        legacy.unlink()
        issued.write_text(identity.public_key + "\n")
        return BreakGlass(identity.public_key, dest, f"moved the break-glass key out of the data dir: {legacy} -> "
                                                     f"{dest} (keep it offline)")
    if issued.exists():
        known = dest or stack_dir(data_dir) / BREAK_GLASS_FILE
        return BreakGlass(issued.read_text().strip(), known if known.exists() else None)
    identity = creds.new_identity(permissions.BREAK_GLASS)
    dest = dest or _private_dir(data_dir) / BREAK_GLASS_FILE
    creds.write(dest, identity, comment=_comment(data_dir))
    creds_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    issued.write_text(identity.public_key + "\n")
    return BreakGlass(identity.public_key, dest, f"break-glass key written to {dest}: the only identity that may "
                                                 "change or delete streams; the stack keeps only its public key "
                                                 "(keep the file offline)")


def _comment(data_dir: Path) -> str:
    return (f"taugrid break-glass credentials of the stack in {data_dir.expanduser().resolve()}: every permission "
            "on its bus; keep offline")


def pinned_anchor_key(data_dir: Path) -> str | None:
    try:
        return (stack_dir(data_dir) / ANCHOR_KEY_FILE).read_text().strip() or None
    except OSError:
        return None


def pin_anchor_key(data_dir: Path, public_key: str) -> tuple[Path, str | None]:
    """Pin ``public_key`` as the stack's anchor key unless one is pinned already; (the pin file, the key that was
    pinned before or None when this call pinned it)."""
    before = pinned_anchor_key(data_dir)
    path = stack_dir(data_dir) / ANCHOR_KEY_FILE
    if before is None:
        _private_dir(data_dir)
        path.write_text(public_key + "\n")
    return path, before
