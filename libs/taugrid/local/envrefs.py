"""Config maps for local pods, from the local cluster's own environment; and what a pod misses.

There is no API server here: ``configMapKeyRef`` reads ``TAU_CONFIGMAP_<NAME>_<KEY>`` (upper case, ``-`` and
``.`` as ``_``). An object exists when at least one variable carries its prefix. Secrets are not read from the
environment (every service would inherit them): they come from the workspace's secrets file
(``local/secrets.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from taugrid.local.podspec import Resolver


def env_name(kind: str, name: str, key: str = "") -> str:
    raw = f"TAU_{kind}_{name}_{key}"
    return raw.upper().replace("-", "_").replace(".", "_")


class EnvObject(Mapping[str, str]):
    """One secret or config map: its keys are the variables under its prefix."""

    def __init__(self, kind: str, name: str, environ: Mapping[str, str]) -> None:
        self.kind, self.name, self.environ = kind, name, environ
        self.prefix = env_name(kind, name)

    def __getitem__(self, key: str) -> str:
        return self.environ[env_name(self.kind, self.name, key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and env_name(self.kind, self.name, key) in self.environ

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix):].lower() for k in self.environ if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _resolver(kind: str, environ: Mapping[str, str] | None) -> Resolver:
    def resolve(_namespace: str, name: str) -> Mapping[str, str] | None:
        env = os.environ if environ is None else environ
        obj = EnvObject(kind, name, env)
        return obj if len(obj) else None

    return resolve


def config_map_resolver(environ: Mapping[str, str] | None = None) -> Resolver:
    """``resolve_config_map`` for the kubelet, from ``TAU_CONFIGMAP_*``."""
    return _resolver("CONFIGMAP", environ)


def missing(pod: Mapping[str, Any], environ: Mapping[str, str] | None = None,
            secrets: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """What this pod's required key references need and do not find: ``TAU_CONFIGMAP_*`` variables to export,
    and ``<secret>.<key>`` entries of the workspace's secrets file (``secrets``: that file's content)."""
    env = os.environ if environ is None else environ
    out: list[str] = []
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for item in c.get("env") or []:
            ref = item.get("valueFrom") or {}
            sel = ref.get("configMapKeyRef")
            if sel and not sel.get("optional"):
                var = env_name("CONFIGMAP", str(sel.get("name") or ""), str(sel.get("key") or ""))
                if var not in env and var not in out:
                    out.append(var)
            sel = ref.get("secretKeyRef")
            if sel and not sel.get("optional"):
                name, key = str(sel.get("name") or ""), str(sel.get("key") or "")
                if key not in (secrets or {}).get(name, {}) and f"{name}.{key}" not in out:
                    out.append(f"{name}.{key}")
    return out
