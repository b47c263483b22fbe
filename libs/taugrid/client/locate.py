"""Where the bus is and which credentials to use, for the CLI and any program using ``taugrid.client``.

URL: ``TAU_NATS_URL``, else the server stored by ``tau login``, else the running embedded stack
(``$TAU_DATA_DIR/stack.json``), else ``nats://127.0.0.1:4222``. Credentials follow the URL: ``TAU_NATS_CREDS``
if set, else the ones stored with that server by ``tau login``, else the embedded stack's local user
(``creds/user.nk``) when the URL is that stack's. Credentials never go to a server they were not issued for.
The CA that signed a remote bus's TLS certificate: ``TAU_NATS_CA``, else the one ``tau login --ca`` stored with
that server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taugrid import settings

DEFAULT_URL = "nats://127.0.0.1:4222"
URL_ENV = "TAU_NATS_URL"


def data_dir() -> Path:
    return settings.data_dir()


def login_file() -> Path:
    return data_dir() / "login.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def login() -> dict[str, Any]:
    """``{"server": URL, "creds": PATH, "user": NAME}`` stored by ``tau login``, or ``{}``."""
    return _read(login_file())


def stack() -> dict[str, Any]:
    info = _read(data_dir() / "stack.json")
    return info if info.get("phase") == "ready" else {}


def bus_url() -> str:
    if settings.is_set(URL_ENV):  # set, even to the default address: it wins over `tau login` and the stack
        return settings.current().bus.url
    return str(login().get("server") or stack().get("nats_url") or DEFAULT_URL)


def bus_creds(url: str | None = None) -> Path | None:
    given = settings.current().bus.creds
    if given is not None:
        return given
    url = url or bus_url()
    saved, local = login(), stack()
    if saved.get("server") == url and saved.get("creds"):
        return Path(saved["creds"])
    if local.get("nats_url") == url and local.get("user_creds"):
        return Path(local["user_creds"])
    return None


def bus_ca(url: str | None = None) -> Path | None:
    """The CA certificate to verify ``url``'s TLS with; None: the system's CAs (or no TLS)."""
    given = settings.current().bus.ca
    if given is not None:
        return given
    saved = login()
    if saved.get("server") == (url or bus_url()) and saved.get("ca"):
        return Path(saved["ca"])
    return None
