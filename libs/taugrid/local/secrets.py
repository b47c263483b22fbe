"""Local secrets: the per-workspace secrets file, and keeping secret values off disk and out of logs.

The store is ``$TAU_DATA_DIR/secrets/<workspace>.yaml``, a mapping of secret name → key → value, mode 0600 (a
file others may read is refused, naming the ``chmod``). It is read when a pod starts, never copied: the pod's
``spec.json`` holds a placeholder (``\\0tau-secret-<n>\\0``; NUL cannot occur in an argument or env value, so it
never collides) where a secret value stood, and the real values reach the pod's shim on its stdin, which puts them
back in memory just before the processes start. The shim redacts every known value (4 bytes or longer) from the
logs it writes and from termination messages.

A workspace's pods resolve ``secretKeyRef`` only from that workspace's file: another workspace's secrets are
"not found".
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import yaml

from taugrid import settings
from taugrid.config import expansion
from taugrid.core.limits import MIB
from taugrid.core.redaction import REDACT_MIN
from taugrid.local.podspec import PodSpecError

# the placeholders and redaction live in ``sealing``, which the pod shim imports alone (it starts once per pod)
from taugrid.local.sealing import encode_for_shim, redactor, seal, unseal

_SCOPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_BOUNDS = expansion.Bounds(json_bytes=4 * MIB)  # read as every YAML is: aliases bounded by what they expand to


class SecretStore:
    """``<root>/<scope>.yaml`` per workspace (``scope``); read on every resolve, so an edit applies to the next
    pod without a restart."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, scope: str) -> Path:
        return self.root / f"{scope}.yaml"

    def load(self, scope: str) -> dict[str, dict[str, str]]:
        if not _SCOPE.match(scope):
            return {}
        path = self.path(scope)
        try:
            st = path.stat()
        except OSError:
            return {}
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PodSpecError("CreateContainerConfigError",
                               f"secrets file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                               f"run `chmod 600 {path}`")
        try:
            data = expansion.load(path.read_text(), _BOUNDS)[1] or {}
        except (OSError, yaml.YAMLError, expansion.Refused) as exc:
            raise PodSpecError("CreateContainerConfigError", f"secrets file {path} cannot be read: {exc}") from None
        if not isinstance(data, dict):
            raise PodSpecError("CreateContainerConfigError",
                               f"secrets file {path} must map secret names to key: value mappings")
        return {str(name): {str(k): str(v) for k, v in (keys or {}).items()}
                for name, keys in data.items() if isinstance(keys, dict) or keys is None}

    def values(self, scope: str) -> list[str]:
        """Every value in ``scope``'s file, under any secret and key: what no log or bundle may hold, whatever name
        carried it there (a literal ``MY_CFG`` as much as a ``secretKeyRef``). [] when the file cannot be read."""
        try:
            return sorted({v for keys in self.load(scope).values() for v in keys.values() if v})
        except PodSpecError:
            return []

    def resolver(self) -> StoreResolver:
        """``resolve_secret`` for the kubelet, whose first argument is the scope (the pod's workspace)."""
        return StoreResolver(self)


class StoreResolver:
    """A store's ``resolve_secret`` (``Resolver``), which also names every value of a scope (``values``): the
    kubelet keeps those off disk and out of the pod's logs as well, so a value a run carries under a name of its
    own choosing (a literal ``MY_CFG``) is blanked as a ``secretKeyRef``'s is."""

    def __init__(self, store: SecretStore) -> None:
        self.store = store

    def __call__(self, scope: str, name: str) -> Mapping[str, str] | None:
        return self.store.load(scope).get(name)

    def values(self, scope: str) -> list[str]:
        return [v for v in self.store.values(scope) if len(v.encode()) >= REDACT_MIN]


def local_store() -> SecretStore | None:
    """The embedded stack's store (``TAU_SECRETS_DIR``, else ``$TAU_DATA_DIR/secrets``); None off it (Kubernetes)."""
    data = settings.current().data
    root = data.secrets_dir or (data.dir / "secrets" if data.dir is not None else None)
    return SecretStore(root) if root is not None else None


def write_secret(root: Path, scope: str, name: str, values: Mapping[str, str]) -> Path:
    """Add or replace one secret in ``scope``'s file, created 0600 (for ``tau secret set`` and tests)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = SecretStore(root)
    current = store.load(scope) if store.path(scope).exists() else {}
    current[name] = dict(values)
    path = store.path(scope)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        yaml.safe_dump(current, out)
    os.replace(path.with_suffix(".tmp"), path)
    return path


class Recording(Mapping[str, str]):
    """A resolved secret that remembers every value read from it (what the pod's spec must not hold)."""

    def __init__(self, data: Mapping[str, str], seen: list[str], name: str = "") -> None:
        self.data, self.seen, self.name = data, seen, name

    def __getitem__(self, key: str) -> str:
        value = self.data[key]
        if 0 < len(value.encode()) < REDACT_MIN:
            # Too short to blank out of the logs without blanking ordinary text too: refuse the pod rather
            # than print the value wherever the program echoes it.
            raise PodSpecError(
                "CreateContainerConfigError",
                f"secret {self.name!r} key {key!r} is {len(value.encode())} bytes: values shorter than "
                f"{REDACT_MIN} bytes cannot be redacted from logs; use a longer value")
        if value not in self.seen:
            self.seen.append(value)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


__all__ = ["Recording", "SecretStore", "StoreResolver", "encode_for_shim", "local_store", "redactor", "seal",
           "unseal", "write_secret"]
